//! Holds: when the upstream's answer is the endpoint's fault, not the reading's, the device is
//! held rather than told its reading failed.
//!
//! Whose fault a failure is, the core's classification table says ([`wary::Table::blame`];
//! docs/semantics.md, "Whose fault"), and the gateway asks the table of its own policy: an
//! attempt whose outcome the table fails at once ([`wary::Class::Failed`], so the call ends
//! `failed`) and blames on the endpoint ([`wary::Blame::Endpoint`]) is an endpoint fault. Under
//! the default table that is who is asking (401, 403, 407), where (404, 405, 410, 414, 421),
//! what the gateway speaks (406, 411, 426, 428, 431), every 5xx the table does not retry (501,
//! 505 to 511 among them; 500, 502, 503 and 504 are retried and end in a give-up), a status
//! outside 4xx and 5xx (a redirect), a TLS handshake that fails, or a request the gateway
//! could not build. Each tells the gateway that its configuration or its upstream is wrong (an
//! expired API key, a moved endpoint), whatever reading it carries: every reading sent through
//! it meets the same answer until an operator fixes it, and none of them is at fault. A device
//! told "failed" would drop readings that land the moment the key is renewed. So the gateway
//! **holds** the device instead: 503 with a Retry-After and `Wary-Verdict: held;
//! upstream=<status>`, and the device keeps the reading and comes back with the same key. A
//! fault of the reading itself (400, 402, 409, 413, 415, 422, 424, 451 and the other 4xx: this
//! body under this key can never succeed) is still `failed` (424). An answer the table retries
//! is not a hold, whoever is at fault: the call goes on, and gives up under its stop rules.
//!
//! The upstream's breaker hears such an answer as the endpoint being down, and opens at once,
//! whatever its threshold: the calls that follow end without a request until its open time is
//! over, and its probe finds out whether the fault is fixed (its open time doubles while it is
//! not). The Retry-After the devices get is that open time's remainder, at least 1 s and at
//! most [`crate::MAX_RETRY_AFTER_SECS`] (an hour). Over CoAP the hold is 5.03 with that Max-Age;
//! over MQTT the message is not acknowledged and is called again after it, as after a give-up.
//! Each fault is logged at most once every [`LOG_EVERY`] (never a header's value: the
//! upstream's credential is one) and counted on `/metrics`
//! (`wary_gateway_upstream_endpoint_faults_total{status=…}`, `wary_gateway_held_total{status=…}`).
//!
//! ```
//! use wary::{Failure, Operation, Outcome, Table};
//! use wary_gateway::hold::EndpointFault;
//! let (t, op) = (Table::DEFAULT, Operation::KeyedWrite);
//! assert_eq!(EndpointFault::of(&t, op, &Outcome::status(401)), Some(EndpointFault::Status(401)));
//! assert_eq!(EndpointFault::of(&t, op, &Outcome::status(431)), Some(EndpointFault::Status(431)));
//! assert_eq!(EndpointFault::of(&t, op, &Failure::Tls.into()), Some(EndpointFault::Tls));
//! // The reading's own fault, and an upstream gateway's "failed" (424), are not holds.
//! assert_eq!(EndpointFault::of(&t, op, &Outcome::status(422)), None);
//! assert_eq!(EndpointFault::of(&t, op, &Outcome::status(424)), None);
//! // Nor is a 503 the table retries, though it is the endpoint's.
//! assert_eq!(EndpointFault::of(&t, op, &Outcome::status(503)), None);
//! assert_eq!(EndpointFault::Status(401).to_string(), "401");
//! ```

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};

use wary::{
    Attempts, Blame, Class, Draw, Endpoint, Failure, Gate, Instant, Operation, Outcome, Phase, Policy, Table,
    Transport,
};
use wary_host::call::SharedEndpoint;

/// At most one log line per fault in this time (with the count of those since the last line).
pub const LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// What about the upstream's answer says the gateway's request, not the reading, is wrong: a
/// failure the policy's table fails at once and blames on the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EndpointFault {
    /// The upstream answered this status.
    Status(u16),
    /// The TLS handshake with the upstream failed (its certificate, or the gateway's trust).
    Tls,
    /// Another failure that is not a status: one the default table fails at once is a request
    /// the gateway could not build ([`Transport::BadBody`]); a table that does not retry a
    /// refused connection or a timeout makes those holds too. Never [`Transport::Tls`], which
    /// is [`EndpointFault::Tls`].
    Transport(Transport),
}

impl EndpointFault {
    /// The endpoint fault an attempt's outcome shows when the call is `op` under `table`, if
    /// any: a failure the table fails at once ([`Class::Failed`]) and blames on the endpoint
    /// ([`Blame::Endpoint`]). A failure the table retries is none, whoever is at fault.
    pub fn of(table: &Table, op: Operation, outcome: &Outcome) -> Option<EndpointFault> {
        let failure = outcome.failure()?;
        if table.classify(op, outcome) != Class::Failed {
            return None;
        }
        Self::blamed(table, failure)
    }

    /// The endpoint fault of a failure that ended a call `failed`, if `table` blames the
    /// endpoint for it.
    pub fn blamed(table: &Table, failure: &Failure) -> Option<EndpointFault> {
        if table.blame(failure) != Blame::Endpoint {
            return None;
        }
        let transport = match failure {
            Failure::Status { code, .. } => return Some(EndpointFault::Status(*code)),
            Failure::Tls => return Some(EndpointFault::Tls),
            Failure::ConnectTimeout => Transport::ConnectTimeout,
            Failure::ResponseTimeout => Transport::ResponseTimeout,
            Failure::Refused => Transport::Refused,
            Failure::Reset => Transport::Reset,
            Failure::BadBody => Transport::BadBody,
            Failure::StreamBroken { forwarded: false } => Transport::StreamBefore,
            // The gateway streams nothing to a device, and a cancel is no verdict on the upstream.
            Failure::StreamBroken { forwarded: true } | Failure::Cancelled => return None,
        };
        Some(EndpointFault::Transport(transport))
    }

    /// The upstream's status, if the fault is one.
    pub fn status(&self) -> Option<u16> {
        match self {
            EndpointFault::Status(code) => Some(*code),
            EndpointFault::Tls | EndpointFault::Transport(_) => None,
        }
    }

    /// The order of `/metrics` rows: statuses ascending, then TLS, then the other failures in
    /// [`Transport::ALL`]'s order.
    fn rank(&self) -> (u8, u16) {
        match self {
            EndpointFault::Status(code) => (0, *code),
            EndpointFault::Tls => (1, 0),
            EndpointFault::Transport(t) => {
                let i = Transport::ALL.iter().position(|k| k == t).unwrap_or(usize::MAX);
                (2, u16::try_from(i).unwrap_or(u16::MAX))
            }
        }
    }
}

impl PartialOrd for EndpointFault {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for EndpointFault {
    fn cmp(&self, other: &Self) -> Ordering {
        self.rank().cmp(&other.rank())
    }
}

impl fmt::Display for EndpointFault {
    /// The status's three digits, `tls`, or the failure's name (`bad_body`, `refused`…): the
    /// value of `upstream=` in `Wary-Verdict` and the `status` label on `/metrics`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EndpointFault::Status(code) => write!(f, "{code}"),
            EndpointFault::Tls => f.write_str("tls"),
            EndpointFault::Transport(t) => f.write_str(t.name()),
        }
    }
}

/// What an endpoint fault is reported to the breaker as: the endpoint being down. A TLS
/// failure is one the breaker already counts as down.
const DOWN: Outcome = Outcome::Failure(Failure::Tls);

#[derive(Debug, Default)]
struct State {
    /// The endpoint fault that last opened (or kept open) the breaker; cleared by any other
    /// outcome the upstream gives.
    cause: Option<EndpointFault>,
    /// Calls whose last attempt met an endpoint fault, by fault.
    faults: BTreeMap<EndpointFault, u64>,
    /// Device answers held, by the fault that held them.
    held: BTreeMap<EndpointFault, u64>,
    /// When each fault was last logged, and how many met it since.
    logged: BTreeMap<EndpointFault, (std::time::Instant, u64)>,
}

/// The gateway's memory of its upstream's endpoint faults: what holds the breaker open, the
/// counts for `/metrics`, and when each was last logged. Shared by the workers.
#[derive(Debug, Default)]
pub struct Holds {
    state: Mutex<State>,
}

impl Holds {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The endpoint fault holding the breaker open, if one is.
    pub fn cause(&self) -> Option<EndpointFault> {
        self.lock().cause
    }

    /// Counts a call whose last attempt met `fault`, and says whether to log it now: the first
    /// time, then at most once every [`LOG_EVERY`]. `Some(n)`: log, `n` calls met it since the
    /// last line (this one included).
    pub fn met(&self, fault: EndpointFault, now: std::time::Instant) -> Option<u64> {
        let mut s = self.lock();
        *s.faults.entry(fault).or_default() += 1;
        let Some(entry) = s.logged.get_mut(&fault) else {
            // The first line starts the interval: the next is due a whole interval later.
            s.logged.insert(fault, (now, 0));
            return Some(1);
        };
        entry.1 = entry.1.saturating_add(1);
        if now.saturating_duration_since(entry.0) < LOG_EVERY {
            return None;
        }
        let since = entry.1;
        *entry = (now, 0);
        Some(since)
    }

    /// Counts a device answer held by `fault`.
    pub fn held(&self, fault: EndpointFault) {
        *self.lock().held.entry(fault).or_default() += 1;
    }

    /// Calls that met each fault.
    pub fn faults(&self) -> BTreeMap<EndpointFault, u64> {
        self.lock().faults.clone()
    }

    /// Device answers held, by fault.
    pub fn held_counts(&self) -> BTreeMap<EndpointFault, u64> {
        self.lock().held.clone()
    }

    /// The Prometheus text of these counters.
    pub fn prometheus(&self) -> String {
        let s = self.lock();
        let mut out = String::new();
        let mut metric = |name: &str, help: &str, rows: &BTreeMap<EndpointFault, u64>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (fault, n) in rows {
                let _ = writeln!(out, "{name}{{status=\"{fault}\"}} {n}");
            }
        };
        metric(
            "wary_gateway_upstream_endpoint_faults_total",
            "Calls whose upstream answer was the endpoint's fault, not the reading's (credential, path, proxy, server, TLS), by status.",
            &s.faults,
        );
        metric(
            "wary_gateway_held_total",
            "Device answers held (503, Retry-After) by an upstream endpoint fault, by status.",
            &s.held,
        );
        out
    }
}

/// The upstream endpoint every worker's runner asks and tells: the shared pace and breaker,
/// with an endpoint fault (of the worker's calls, `op` under `table`) told to the breaker as the
/// endpoint being down (it opens at once, whatever its threshold) rather than as a served
/// answer (which would close it).
#[derive(Debug, Clone)]
pub(crate) struct HoldingEndpoint {
    inner: SharedEndpoint,
    holds: Arc<Holds>,
    table: Table,
    op: Operation,
}

impl HoldingEndpoint {
    pub(crate) fn new(inner: SharedEndpoint, holds: Arc<Holds>, table: Table, op: Operation) -> Self {
        HoldingEndpoint { inner, holds, table, op }
    }
}

impl Endpoint for HoldingEndpoint {
    fn admit(&mut self, call: &mut Attempts, policy: &Policy, now: Instant) -> Gate {
        self.inner.admit(call, policy, now)
    }

    fn report(&mut self, outcome: &Outcome, draw: Draw, now: Instant) {
        let Some(fault) = EndpointFault::of(&self.table, self.op, outcome) else {
            self.inner.report(outcome, draw, now);
            self.holds.lock().cause = None;
            return;
        };
        // As many failures as it takes: a closed breaker needs its threshold in a row, a
        // half-open one (its probe met the fault again) one, an open one none.
        for _ in 0..=u8::MAX {
            match self.inner.breaker().map(|b| b.state().phase()) {
                Some(Phase::Open) | None => break,
                Some(_) => self.inner.report(&DOWN, draw, now),
            }
        }
        self.holds.lock().cause = Some(fault);
    }

    fn is_active(&self) -> bool {
        self.inner.is_active()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const KEYED: Operation = Operation::KeyedWrite;

    fn endpoint() -> (HoldingEndpoint, Arc<Holds>) {
        let breaker = wary::Breaker::new(crate::gateway::UPSTREAM_BREAKER).unwrap();
        let holds = Arc::new(Holds::default());
        let inner = SharedEndpoint::new(None, Some(breaker));
        (HoldingEndpoint::new(inner, holds.clone(), Table::DEFAULT, KEYED), holds)
    }

    #[test]
    fn an_endpoint_fault_is_what_the_core_table_fails_and_blames_on_the_endpoint() {
        let t = Table::DEFAULT;
        let of = |o: Outcome| EndpointFault::of(&t, KEYED, &o);
        // Who is asking, where, what the gateway speaks, the server's side, and a redirect:
        // docs/semantics.md, "Whose fault", for the answers the table fails at once.
        let endpoint = [
            401, 403, 404, 405, 406, 407, 410, 411, 414, 421, 426, 428, 431, 501, 505, 506, 507, 508, 509,
            510, 511, 599, 302, 399,
        ];
        for code in endpoint {
            assert_eq!(of(Outcome::status(code)), Some(EndpointFault::Status(code)), "{code}");
            assert_eq!(t.blame(&Failure::status(code)), Blame::Endpoint, "{code}");
        }
        // The reading's own faults fail (424 to the device); the retried answers, the
        // endpoint's or not, end in a give-up instead.
        for code in [400, 402, 409, 412, 413, 415, 418, 422, 424, 451, 499] {
            assert_eq!(of(Outcome::status(code)), None, "{code}");
            assert_eq!(t.blame(&Failure::status(code)), Blame::Reading, "{code}");
        }
        for code in [408, 429, 500, 502, 503, 504] {
            assert_eq!(of(Outcome::status(code)), None, "{code}");
        }
        assert_eq!(of(Outcome::Ok), None);
        assert_eq!(of(Failure::Tls.into()), Some(EndpointFault::Tls));
        // A request the gateway could not build fails at once and is its own.
        assert_eq!(of(Failure::BadBody.into()), Some(EndpointFault::Transport(Transport::BadBody)));
        for f in [Failure::Reset, Failure::Refused, Failure::ResponseTimeout, Failure::ConnectTimeout] {
            assert_eq!(of(f.into()), None, "{f:?} is retried");
        }
        assert_eq!(of(Failure::Cancelled.into()), None);
        // The policy's own table decides: one that fails a refused connection holds on it, one
        // that blames a 404 on the reading fails it.
        let no_refused = t.with_transport(Transport::Refused, wary::Rule::Fail);
        assert_eq!(
            EndpointFault::of(&no_refused, KEYED, &Failure::Refused.into()),
            Some(EndpointFault::Transport(Transport::Refused))
        );
        let reading_404 = t.with_blame(404, Blame::Reading).unwrap();
        assert_eq!(EndpointFault::of(&reading_404, KEYED, &Outcome::status(404)), None);
        // A legacy write's 500 is unknown (it may have landed, the probe decides), never a hold.
        assert_eq!(EndpointFault::of(&t, Operation::Write, &Outcome::status(500)), None);
        assert_eq!(EndpointFault::blamed(&t, &Failure::status(401)), Some(EndpointFault::Status(401)));
        assert_eq!(EndpointFault::blamed(&t, &Failure::status(422)), None);
        assert_eq!(EndpointFault::Tls.to_string(), "tls");
        assert_eq!(EndpointFault::Transport(Transport::Refused).to_string(), "refused");
        assert_eq!((EndpointFault::Status(407).status(), EndpointFault::Tls.status()), (Some(407), None));
        assert_eq!(EndpointFault::Transport(Transport::BadBody).status(), None);
        // Rows on /metrics: statuses ascending, then tls, then the other failures.
        let mut rows = [
            EndpointFault::Transport(Transport::BadBody),
            EndpointFault::Tls,
            EndpointFault::Status(511),
            EndpointFault::Transport(Transport::Refused),
            EndpointFault::Status(401),
        ];
        rows.sort();
        assert_eq!(
            rows.map(|f| f.to_string()),
            ["401", "511", "tls", "refused", "bad_body"].map(str::to_owned)
        );
    }

    #[test]
    fn one_endpoint_fault_opens_the_breaker_at_once_and_a_success_clears_the_cause() {
        let (mut e, holds) = endpoint();
        let at = Instant::from_millis;
        let open = |e: &HoldingEndpoint| e.inner.breaker().unwrap().state().phase();
        // A 4xx the upstream served, a reading's fault, leaves the breaker closed.
        e.report(&Outcome::status(422), Draw::ZERO, at(0));
        assert_eq!((open(&e), holds.cause()), (Phase::Closed, None));
        // A 503 is the endpoint's, but the table retries it: one failure toward the threshold,
        // not an open breaker.
        e.report(&Outcome::status(503), Draw::ZERO, at(5));
        assert_eq!((open(&e), holds.cause()), (Phase::Closed, None));
        // One 401, where five failures in a row would be needed: open, for 1 s (the draw adds
        // nothing to the fixed half of 2 s).
        e.report(&Outcome::status(401), Draw::ZERO, at(10));
        assert_eq!((open(&e), holds.cause()), (Phase::Open, Some(EndpointFault::Status(401))));
        assert_eq!(e.inner.breaker().unwrap().wait(at(10)), wary::Duration::from_millis(1_000));
        // A late 401 of a request let through before it opened changes nothing.
        e.report(&Outcome::status(401), Draw::TOP, at(20));
        assert_eq!(e.inner.breaker().unwrap().wait(at(20)), wary::Duration::from_millis(990));
        // Its probe meets the fault again: open again, for longer (2 s fixed of 4 s).
        assert_eq!(e.inner.breaker().unwrap().wait(at(1_010)), wary::Duration::ZERO);
        let mut call = Attempts::new(at(1_010));
        let policy = Policy::builder(wary::Preset::Default).build().unwrap();
        assert_eq!(e.admit(&mut call, &policy, at(1_010)), Gate::Go);
        e.report(&Outcome::status(403), Draw::ZERO, at(1_050));
        assert_eq!(open(&e), Phase::Open);
        assert_eq!(e.inner.breaker().unwrap().wait(at(1_050)), wary::Duration::from_millis(2_000));
        assert_eq!(holds.cause(), Some(EndpointFault::Status(403)));
        // Fixed: the next probe is served, the breaker closes and nothing holds it any more.
        let mut call = Attempts::new(at(3_050));
        assert_eq!(e.admit(&mut call, &policy, at(3_050)), Gate::Go);
        e.report(&Outcome::Ok, Draw::ZERO, at(3_060));
        assert_eq!((open(&e), holds.cause()), (Phase::Closed, None));
    }

    #[test]
    fn without_a_breaker_the_fault_is_still_the_cause() {
        let holds = Arc::new(Holds::default());
        let mut e = HoldingEndpoint::new(SharedEndpoint::default(), holds.clone(), Table::DEFAULT, KEYED);
        e.report(&Failure::Tls.into(), Draw::ZERO, Instant::from_millis(0));
        assert_eq!(holds.cause(), Some(EndpointFault::Tls));
    }

    #[test]
    fn a_fault_is_logged_once_an_interval_with_the_count_since_the_last_line() {
        let holds = Holds::default();
        let t = std::time::Instant::now();
        let s = std::time::Duration::from_secs;
        let f = EndpointFault::Status(401);
        assert_eq!(holds.met(f, t), Some(1), "the first is logged at once");
        assert_eq!(holds.met(f, t + s(1)), None);
        assert_eq!(holds.met(f, t + s(59)), None);
        // Another status has a line of its own.
        assert_eq!(holds.met(EndpointFault::Tls, t + s(59)), Some(1));
        assert_eq!(holds.met(f, t + s(60)), Some(3), "two kept quiet and this one");
        assert_eq!(holds.met(f, t + s(61)), None);
        assert_eq!(holds.met(f, t + s(121)), Some(2));
        assert_eq!(holds.faults().get(&f), Some(&6));
        holds.held(f);
        let text = holds.prometheus();
        assert!(text.contains("\nwary_gateway_upstream_endpoint_faults_total{status=\"401\"} 6\n"), "{text}");
        assert!(text.contains("\nwary_gateway_upstream_endpoint_faults_total{status=\"tls\"} 1\n"), "{text}");
        assert!(text.contains("\nwary_gateway_held_total{status=\"401\"} 1\n"), "{text}");
    }
}
