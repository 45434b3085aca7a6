//! One line for plain async code on tokio:
//! `policy.retry(Operation::KeyedWrite, |attempt| async { … }).await`.
//!
//! [`RetryExt::retry`] runs the core's [`Runner`] with tokio's sleep, a clock in the policy's
//! ticks, a generator split from the process's own, and an idempotency key made once before
//! the first attempt ([`crate::draw::new_key`]); every attempt is told the key
//! ([`Attempt::key`]) and the time left before the deadline ([`Attempt::remaining`], see
//! [`attempt_timeout`]). The attempt returns its value, or the [`Outcome`] that failed it
//! ([`crate::http::response_outcome`], [`crate::http::error_outcome`]).
//!
//! For a fleet budget, a ledger or a cancel signal, start from [`tokio_runner`] and add them;
//! for every effect injected (firmware, replays), build the [`Runner`] by hand.
//!
//! ```no_run
//! use wary::{Operation, Outcome, Policy, Preset};
//! use wary_host::retry::RetryExt;
//!
//! # async fn send(_key: &str) -> Result<u16, Outcome> { Ok(201) }
//! # async fn demo() -> Result<(), wary_host::retry::RetryError> {
//! let policy = Policy::builder(Preset::Default).deadline(10_000).build().expect("a valid policy");
//! let status = policy.retry(Operation::KeyedWrite, |a| async move { send(a.key.to_hex().as_str()).await }).await?;
//! # let _ = status; Ok(()) }
//! ```

use std::future::Future;
use std::time::Duration;

use rand::rngs::StdRng;
use wary::run::{Attempt, Runner, Stopped};
use wary::{Operation, Outcome, Policy, Verdict};

use crate::time::{TickClock, TokioDelay};

/// The runner [`tokio_runner`] makes: tokio's sleep, a clock in the policy's ticks, a
/// generator split from the process's own.
pub type TokioRunner<'a> = Runner<'a, TokioDelay, TickClock, StdRng>;

/// A runner for `policy` on tokio, every effect chosen: [`TokioDelay`], a [`TickClock`] at the
/// policy's rate and [`crate::draw::for_call`]. Add `.fleet(..)`, `.ledger(..)` or
/// `.cancel(..)` as needed.
pub fn tokio_runner(policy: &Policy) -> TokioRunner<'_> {
    Runner::new(policy, TokioDelay, TickClock::for_policy(policy), crate::draw::for_call())
}

/// An attempt's timeout: `default`, capped to the time left before the call's deadline, so a
/// slow answer cannot hold the call past it.
pub fn attempt_timeout(policy: &Policy, attempt: &Attempt, default: Duration) -> Duration {
    match attempt.remaining {
        Some(ticks) => {
            let hz = u128::from(policy.tick_hz().max(1));
            let micros = u128::from(ticks).saturating_mul(1_000_000) / hz;
            default.min(Duration::from_micros(u64::try_from(micros).unwrap_or(u64::MAX)))
        }
        None => default,
    }
}

/// A call that returned no value: its verdict, the attempts sent and the last outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{} after {} attempt(s)", verdict_text(&.0.verdict), .0.attempts)]
pub struct RetryError(pub Stopped);

impl RetryError {
    /// How the call ended (never `Ok`).
    pub fn verdict(&self) -> Verdict {
        self.0.verdict
    }
}

/// A verdict as the ledgers spell it, with the reason of a give-up: `gave_up (deadline)`.
pub fn verdict_text(verdict: &Verdict) -> String {
    match verdict {
        Verdict::GaveUp(g) => format!("gave_up ({})", g.name()),
        v => v.name().to_owned(),
    }
}

/// The one-line entry point, on [`Policy`].
pub trait RetryExt {
    /// Runs one call of `op` on tokio: a fresh key, made once and handed to every attempt.
    fn retry<T, F, Fut>(&self, op: Operation, attempt: F) -> impl Future<Output = Result<T, RetryError>>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, Outcome>>;
}

impl RetryExt for Policy {
    async fn retry<T, F, Fut>(&self, op: Operation, attempt: F) -> Result<T, RetryError>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, Outcome>>,
    {
        tokio_runner(self).call(op, crate::draw::new_key(), attempt).await.map_err(RetryError)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use wary::{GiveUp, Key, Preset};

    use super::*;

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn one_key_for_every_attempt_and_the_runners_verdicts() {
        let policy = Policy::builder(Preset::Default).base(100).cap(400).budget(60_000).build().unwrap();
        let keys = Mutex::new(Vec::<Key>::new());
        let t0 = tokio::time::Instant::now();
        let got = policy
            .retry(Operation::KeyedWrite, |a| {
                keys.lock().unwrap().push(a.key);
                let n = a.number;
                async move { if n < 3 { Err(Outcome::status(503)) } else { Ok(n) } }
            })
            .await;
        assert_eq!(got, Ok(3));
        let keys = keys.into_inner().unwrap();
        assert_eq!(keys.len(), 3);
        assert!(keys.iter().all(|k| *k == keys[0]), "the key changed between attempts");
        // Two equal-jitter waits of at least 50 and 100 ms were slept on tokio's clock.
        assert!(t0.elapsed() >= Duration::from_millis(150), "{:?}", t0.elapsed());
        // An unkeyed write is never resent after an ambiguous failure.
        let mut sent = 0;
        let r: Result<(), _> = policy
            .retry(Operation::Write, |_| {
                sent += 1;
                async { Err(Outcome::status(500)) }
            })
            .await;
        assert_eq!(r.unwrap_err().verdict(), Verdict::Unknown);
        assert_eq!(sent, 1);
        // A second call gets a second key.
        let mut second = None;
        let _ = policy
            .retry(Operation::Read, |a| {
                second = Some(a.key);
                async { Ok(()) }
            })
            .await;
        assert_ne!(second, Some(keys[0]));
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn the_deadline_caps_each_attempts_timeout() {
        let policy = Policy::builder(Preset::Default).base(100).cap(100).deadline(1_000).build().unwrap();
        let mut timeouts = Vec::new();
        let r: Result<(), _> = policy
            .retry(Operation::Read, |a| {
                timeouts.push(attempt_timeout(&policy, &a, Duration::from_secs(30)));
                async {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Err(Outcome::ResponseTimeout)
                }
            })
            .await;
        let err = r.unwrap_err();
        assert_eq!(err.verdict(), Verdict::GaveUp(GiveUp::Deadline));
        assert_eq!(err.to_string(), format!("gave_up (deadline) after {} attempt(s)", err.0.attempts));
        assert_eq!(timeouts[0], Duration::from_secs(1));
        assert!(timeouts.windows(2).all(|w| w[1] < w[0]), "{timeouts:?}");
        assert!(timeouts.iter().all(|t| *t <= Duration::from_secs(1)));
    }

    #[test]
    fn timeouts_in_other_tick_rates() {
        let policy = Policy::builder(Preset::Default).tick_hz(10).base(1).cap(4).budget(100).build().unwrap();
        let a = Attempt { number: 1, key: Key::from_parts(1, 1, 1), remaining: Some(25) };
        assert_eq!(attempt_timeout(&policy, &a, Duration::from_secs(9)), Duration::from_millis(2_500));
        let a = Attempt { remaining: None, ..a };
        assert_eq!(attempt_timeout(&policy, &a, Duration::from_secs(9)), Duration::from_secs(9));
    }
}
