//! Holds: when the upstream refuses the gateway itself, the fault is the gateway's, not the
//! reading's.
//!
//! An upstream that answers 401 or 403 to the gateway's own credential, 404, 405 or 410 to its
//! path, 407 or 511 to the proxy it goes through, 421 to the host it dialled, 501 or 505 to what
//! it speaks, or a TLS handshake that fails, is telling the gateway that its configuration is
//! wrong (an expired API key, a moved endpoint). Every reading sent through it meets the same
//! answer until an operator fixes it, and none of them is at fault: a device told "failed"
//! would drop readings that land the moment the key is renewed. So the gateway **holds** the
//! device instead: 503 with a Retry-After and `Wary-Verdict: held; upstream=<status>`, and the
//! device keeps the reading and comes back with the same key. A fault of the reading itself
//! (400, 413, 415, 422: this body under this key can never succeed) is still `failed` (424).
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
//! use wary::{Failure, Outcome};
//! use wary_gateway::hold::EndpointFault;
//! assert_eq!(EndpointFault::of(&Outcome::status(401)), Some(EndpointFault::Status(401)));
//! assert_eq!(EndpointFault::of(&Failure::Tls.into()), Some(EndpointFault::Tls));
//! // The reading's own fault, and an upstream gateway's "failed" (424), are not holds.
//! assert_eq!(EndpointFault::of(&Outcome::status(422)), None);
//! assert_eq!(EndpointFault::of(&Outcome::status(424)), None);
//! assert_eq!(EndpointFault::Status(401).to_string(), "401");
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};

use wary::{Attempts, Draw, Endpoint, Failure, Gate, Instant, Outcome, Phase, Policy};
use wary_host::call::SharedEndpoint;

/// The upstream statuses that say the gateway's own request is wrong, whatever reading it
/// carries: who is asking (401, 403, 407, 511), where (404, 405, 410, 421) or in what (501,
/// 505). 424 is not among them: from an upstream that is itself a wary gateway it means the
/// reading failed further on.
pub const ENDPOINT_FAULTS: [u16; 10] = [401, 403, 404, 405, 407, 410, 421, 501, 505, 511];

/// At most one log line per fault in this time (with the count of those since the last line).
pub const LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// What about the upstream's answer says the gateway's request, not the reading, is wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum EndpointFault {
    /// The upstream answered one of [`ENDPOINT_FAULTS`].
    Status(u16),
    /// The TLS handshake with the upstream failed (its certificate, or the gateway's trust).
    Tls,
}

impl EndpointFault {
    /// The endpoint fault an attempt's outcome shows, if any.
    pub fn of(outcome: &Outcome) -> Option<EndpointFault> {
        outcome.failure().and_then(Self::of_failure)
    }

    /// The endpoint fault a failure shows, if any.
    pub fn of_failure(failure: &Failure) -> Option<EndpointFault> {
        match failure {
            Failure::Status { code, .. } if ENDPOINT_FAULTS.contains(code) => {
                Some(EndpointFault::Status(*code))
            }
            Failure::Tls => Some(EndpointFault::Tls),
            _ => None,
        }
    }

    /// The upstream's status, if the fault is one.
    pub fn status(&self) -> Option<u16> {
        match self {
            EndpointFault::Status(code) => Some(*code),
            EndpointFault::Tls => None,
        }
    }
}

impl fmt::Display for EndpointFault {
    /// The status's three digits, or `tls`: the value of `upstream=` in `Wary-Verdict` and the
    /// `status` label on `/metrics`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EndpointFault::Status(code) => write!(f, "{code}"),
            EndpointFault::Tls => f.write_str("tls"),
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
            "Calls the upstream refused for the gateway's own configuration (credential, path, proxy, TLS), by status.",
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
/// with an endpoint fault told to the breaker as the endpoint being down (it opens at once,
/// whatever its threshold) rather than as a served answer (which would close it).
#[derive(Debug, Clone)]
pub(crate) struct HoldingEndpoint {
    inner: SharedEndpoint,
    holds: Arc<Holds>,
}

impl HoldingEndpoint {
    pub(crate) fn new(inner: SharedEndpoint, holds: Arc<Holds>) -> Self {
        HoldingEndpoint { inner, holds }
    }
}

impl Endpoint for HoldingEndpoint {
    fn admit(&mut self, call: &mut Attempts, policy: &Policy, now: Instant) -> Gate {
        self.inner.admit(call, policy, now)
    }

    fn report(&mut self, outcome: &Outcome, draw: Draw, now: Instant) {
        let Some(fault) = EndpointFault::of(outcome) else {
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

    fn endpoint() -> (HoldingEndpoint, Arc<Holds>) {
        let breaker = wary::Breaker::new(crate::gateway::UPSTREAM_BREAKER).unwrap();
        let holds = Arc::new(Holds::default());
        (HoldingEndpoint::new(SharedEndpoint::new(None, Some(breaker)), holds.clone()), holds)
    }

    #[test]
    fn endpoint_faults_are_the_gateways_configuration_and_reading_faults_are_not() {
        for code in ENDPOINT_FAULTS {
            assert_eq!(
                EndpointFault::of(&Outcome::status(code)),
                Some(EndpointFault::Status(code)),
                "{code}"
            );
        }
        for code in [400, 408, 409, 413, 415, 422, 424, 429, 500, 502, 503, 504] {
            assert_eq!(EndpointFault::of(&Outcome::status(code)), None, "{code}");
        }
        assert_eq!(EndpointFault::of(&Outcome::Ok), None);
        for f in [Failure::Reset, Failure::Refused, Failure::ResponseTimeout, Failure::BadBody] {
            assert_eq!(EndpointFault::of_failure(&f), None, "{f:?}");
        }
        assert_eq!(EndpointFault::Tls.to_string(), "tls");
        assert_eq!((EndpointFault::Status(407).status(), EndpointFault::Tls.status()), (Some(407), None));
    }

    #[test]
    fn one_endpoint_fault_opens_the_breaker_at_once_and_a_success_clears_the_cause() {
        let (mut e, holds) = endpoint();
        let at = Instant::from_millis;
        let open = |e: &HoldingEndpoint| e.inner.breaker().unwrap().state().phase();
        // A 4xx the upstream served, a reading's fault, leaves the breaker closed.
        e.report(&Outcome::status(422), Draw::ZERO, at(0));
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
        let mut e = HoldingEndpoint::new(SharedEndpoint::default(), holds.clone());
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
