//! One attempt's record: what the runner, the host adapters and a replay write to a ledger.
//!
//! A record holds classes, numbers and the key only — never payload bytes, credentials or raw
//! error text. How records are kept and written out is the ledger's ([`crate::ledger::Ledger`]); how
//! they read and write as lines is in the line forms.

use crate::backoff::Draw;
use crate::breaker::Phase;
use crate::classify::{Class, Failure, Operation, Outcome};
use crate::decide::{Decision, Verdict};
use crate::key::Key;
use crate::pace::PaceView;
use crate::policy::Policy;
use crate::time::Duration;

/// One attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Record {
    /// The call's idempotency key (also identifies reads' calls).
    pub key: Key,
    /// The attempt number, from 1.
    pub attempt: u32,
    /// The call's operation.
    pub op: Operation,
    /// What the attempt returned (status and Retry-After included).
    pub outcome: Outcome,
    /// Its class.
    pub class: Class,
    /// The draw that decided the wait after it: present whenever a wait was computed, a give-up
    /// on the budget or the deadline included, so a replay reaches the same verdict.
    pub draw: Option<Draw>,
    /// The wait after it (zero if the call ended).
    pub wait: Duration,
    /// How long the attempt took.
    pub attempt_time: Duration,
    /// The call's time so far, at the end of this attempt.
    pub total_time: Duration,
    /// The verdict, on the call's last record.
    pub verdict: Option<Verdict>,
    /// [`Policy::fingerprint`] of the policy that decided.
    pub policy: u32,
    /// What the endpoint's pace and breaker said before this attempt went (none for a plain
    /// call): its pace wait was charged to the call's wait budget before this attempt's
    /// decision.
    pub admitted: Option<Admission>,
    /// On the call's last record, when the endpoint refused the retry this attempt's decision
    /// chose: what its pace and breaker said then (the verdict is the refusal's).
    pub refused: Option<Admission>,
}

/// What an endpoint's pace and breaker said about one attempt ([`crate::Attempts::admit`]), in
/// integer units: enough for a replay to re-derive the wait they added and whether they ended
/// the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Admission {
    /// The call's time when they were asked (for a retry: when its backoff wait ends).
    pub at: Duration,
    /// The pace's rate and bucket then (all zero without a pace, or while it is open).
    pub pace: PaceView,
    /// The pace's wait, [`PaceView::wait`], charged to the call's wait budget.
    pub wait: Duration,
    /// The breaker's phase then; `None` without a breaker.
    pub breaker: Option<Phase>,
    /// How long until the breaker would let a request through (0: it let this one through).
    pub breaker_left: Duration,
}

impl Record {
    /// The record of one decided attempt: the one place a record is built, by the runner, the
    /// host adapters and replay alike. `draw` is kept when the outcome was retryable (the draw
    /// decided the wait, or the give-up); the verdict is the decision's when the call ended.
    #[allow(clippy::too_many_arguments)]
    pub fn decided(
        policy: &Policy,
        key: Key,
        attempt: u32,
        op: Operation,
        outcome: Outcome,
        draw: Draw,
        decision: Decision,
        attempt_time: Duration,
        total_time: Duration,
    ) -> Record {
        let class = policy.classify(op, &outcome);
        let (wait, verdict) = match decision {
            Decision::Retry { wait } => (wait, None),
            Decision::Done(v) => (Duration::ZERO, Some(v)),
        };
        Record {
            key,
            attempt,
            op,
            outcome,
            class,
            draw: (class == Class::Retry).then_some(draw),
            wait,
            attempt_time,
            total_time,
            verdict,
            policy: policy.fingerprint(),
            admitted: None,
            refused: None,
        }
    }

    /// The last record of a call cancelled after `attempts` attempts.
    pub fn cancelled(
        policy: &Policy,
        key: Key,
        attempts: u32,
        op: Operation,
        total_time: Duration,
    ) -> Record {
        Record {
            key,
            attempt: attempts,
            op,
            outcome: Outcome::Failure(Failure::Cancelled),
            class: Class::Cancelled,
            draw: None,
            wait: Duration::ZERO,
            attempt_time: Duration::ZERO,
            total_time,
            verdict: Some(Verdict::Cancelled),
            policy: policy.fingerprint(),
            admitted: None,
            refused: None,
        }
    }

    /// This record with the call's verdict (or none: the call goes on).
    pub const fn with_verdict(mut self, verdict: Option<Verdict>) -> Record {
        self.verdict = verdict;
        self
    }
}
