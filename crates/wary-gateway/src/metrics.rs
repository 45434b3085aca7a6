//! What the gateway counts: attempts per call (the health signal), verdicts, give-up reasons,
//! probe results, and optionally a timeline of every attempt for the demo's chart.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use wary::{
    Class, Duration, Instant, Key, Verdict,
    ledger::{AttemptStats, Record},
};

/// Attempt-count buckets (the last holds "this many or more").
pub const BUCKETS: usize = 32;

/// Surfaced readings kept in [`Metrics::surfaced`] (the most recent; the count is exact).
pub const SURFACED_KEPT: usize = 1024;

/// Why a request was answered before the queue: `unauthenticated` (401), `forbidden` (403:
/// another device's key), `rate_limited` (429: the device is over its rate), `admission_full`
/// (503: every admission bucket is busy), `body_timeout` (408), `bad_request` (400, 404, 405,
/// 413), `full` (503: the queue is full).
pub const REFUSALS: [&str; 7] =
    ["full", "bad_request", "unauthenticated", "forbidden", "rate_limited", "admission_full", "body_timeout"];

/// One attempt on the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Gateway time when the attempt's record was written (the attempt's end).
    pub at: Instant,
    /// The call's key.
    pub key: Key,
    /// Attempt number.
    pub attempt: u32,
    /// The attempt's own time.
    pub attempt_time: Duration,
    /// The wait after it (zero if none).
    pub wait: Duration,
    /// The outcome's name ([`wary::Outcome::name`]).
    pub outcome: &'static str,
    /// The status, if any.
    pub code: Option<u16>,
    /// The verdict, on the call's last attempt.
    pub verdict: Option<Verdict>,
}

/// Counters, updated from ledger records.
#[derive(Debug, Default, Clone)]
pub struct Metrics {
    /// Attempts per finished call.
    pub stats: AttemptStats<BUCKETS>,
    /// Calls by verdict name.
    pub verdicts: BTreeMap<&'static str, u64>,
    /// Give-ups by reason.
    pub gave_up: BTreeMap<&'static str, u64>,
    /// Unknowns the probe found landed (no resend).
    pub probe_landed: u64,
    /// Unknowns the probe found not landed (one resend).
    pub probe_not_landed: u64,
    /// Unknowns nobody could resolve (from the ledger).
    pub unresolved: u64,
    /// Readings answered `unknown` (may have landed; surfaced to a person; never resent).
    pub surfaced_total: u64,
    /// The keys of the most recent [`SURFACED_KEPT`] of them, oldest first, for a person to
    /// check (identity only, no payload).
    pub surfaced: Vec<Key>,
    /// Readings that landed with a body that failed the configured body check (never resent).
    pub landed_bad_body: u64,
    /// Requests answered before the queue, by reason (see [`REFUSALS`]).
    pub refused: BTreeMap<&'static str, u64>,
    /// Attempts by outcome name or status.
    pub outcomes: BTreeMap<String, u64>,
    /// Retry-After values from the upstream that could not be read at all (neither a number
    /// nor an HTTP-date) and so were ignored: a server sending garbage shows here.
    pub retry_after_unreadable: u64,
    /// Every attempt, if the timeline is on.
    pub events: Option<Vec<Event>>,
}

impl Metrics {
    /// Counts one ledger record written at gateway time `at`.
    pub fn record(&mut self, r: &Record, at: Instant) {
        let name = match r.outcome.code() {
            Some(c) => c.to_string(),
            None => r.outcome.name().to_owned(),
        };
        *self.outcomes.entry(name).or_default() += 1;
        match (r.class, r.verdict) {
            (Class::Unknown, Some(Verdict::Ok)) => self.probe_landed += 1,
            (Class::Unknown, None) => self.probe_not_landed += 1,
            (Class::Unknown, Some(Verdict::Unknown)) => self.unresolved += 1,
            _ => {}
        }
        if let Some(v) = r.verdict {
            self.stats.add(r.attempt);
            *self.verdicts.entry(v.name()).or_default() += 1;
            if let Verdict::GaveUp(g) = v {
                *self.gave_up.entry(g.name()).or_default() += 1;
            }
        }
        if let Some(ev) = &mut self.events {
            ev.push(Event {
                at,
                key: r.key,
                attempt: r.attempt,
                attempt_time: r.attempt_time,
                wait: r.wait,
                outcome: r.outcome.name(),
                code: r.outcome.code(),
                verdict: r.verdict,
            });
        }
    }

    /// Notes a reading answered `unknown`: surfaced to a person.
    pub fn surface(&mut self, reading: Key) {
        self.surfaced_total += 1;
        if self.surfaced.len() >= SURFACED_KEPT {
            self.surfaced.remove(0);
        }
        self.surfaced.push(reading);
    }

    /// Mean attempts per call.
    pub fn mean(&self) -> f64 {
        self.stats.mean_milli() as f64 / 1000.0
    }

    /// The Prometheus text exposition, with the fleet tokens and queue depth given.
    pub fn prometheus(
        &self,
        tokens_milli: u32,
        max_milli: u32,
        queue_depth: usize,
        queue_cap: usize,
    ) -> String {
        let mut s = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, rows: &[(String, String)]| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, v) in rows {
                let _ = writeln!(s, "{name}{labels} {v}");
            }
        };
        // Every verdict's name, each give-up reason counted under `gave_up`.
        let names = [
            Verdict::Ok,
            Verdict::Failed,
            Verdict::Unknown,
            Verdict::GaveUp(wary::GiveUp::Budget),
            Verdict::Cancelled,
        ]
        .map(|v| v.name());
        let verdicts: Vec<_> = names
            .iter()
            .map(|v| (format!("{{verdict=\"{v}\"}}"), self.verdicts.get(v).copied().unwrap_or(0).to_string()))
            .collect();
        metric("wary_gateway_calls_total", "counter", "Calls finished, by verdict.", &verdicts);
        let reasons: Vec<_> =
            self.gave_up.iter().map(|(r, n)| (format!("{{reason=\"{r}\"}}"), n.to_string())).collect();
        metric("wary_gateway_gave_up_total", "counter", "Calls that gave up, by reason.", &reasons);
        let one = |v: String| vec![(String::new(), v)];
        metric(
            "wary_gateway_attempts_total",
            "counter",
            "Attempts of calls that have ended (counted at their verdict).",
            &one(self.stats.attempts().to_string()),
        );
        metric(
            "wary_gateway_attempts_per_call_mean",
            "gauge",
            "Mean attempts per finished call (the health signal).",
            &one(format!("{:.3}", self.mean())),
        );
        metric(
            "wary_gateway_attempts_per_call_p95",
            "gauge",
            "95th percentile of attempts per call.",
            &one(self.stats.percentile(95).to_string()),
        );
        metric(
            "wary_gateway_attempts_per_call_max",
            "gauge",
            "Most attempts any call made.",
            &one(self.stats.max().to_string()),
        );
        let probes = vec![
            ("{result=\"landed\"}".to_owned(), self.probe_landed.to_string()),
            ("{result=\"not_landed\"}".to_owned(), self.probe_not_landed.to_string()),
            ("{result=\"unknown\"}".to_owned(), self.unresolved.to_string()),
        ];
        metric(
            "wary_gateway_probes_total",
            "counter",
            "Unknown writes handed to the probe, by result.",
            &probes,
        );
        metric(
            "wary_gateway_surfaced_total",
            "counter",
            "Readings answered unknown: may have landed, surfaced to a person, never resent.",
            &one(self.surfaced_total.to_string()),
        );
        metric(
            "wary_gateway_landed_bad_body_total",
            "counter",
            "Readings that landed with a body failing the body check (never resent).",
            &one(self.landed_bad_body.to_string()),
        );
        metric(
            "wary_gateway_retry_after_unreadable_total",
            "counter",
            "Retry-After values from the upstream that could not be read (neither seconds nor a date), ignored.",
            &one(self.retry_after_unreadable.to_string()),
        );
        let refused: Vec<_> = REFUSALS
            .iter()
            .map(|r| (format!("{{reason=\"{r}\"}}"), self.refused.get(r).copied().unwrap_or(0).to_string()))
            .collect();
        metric(
            "wary_gateway_refused_total",
            "counter",
            "Requests answered before the queue, by reason.",
            &refused,
        );
        metric(
            "wary_gateway_fleet_tokens",
            "gauge",
            "Fleet retry budget tokens now (retries stop at or below half the maximum).",
            &one(format!("{:.3}", f64::from(tokens_milli) / 1000.0)),
        );
        metric(
            "wary_gateway_fleet_tokens_max",
            "gauge",
            "Fleet retry budget maximum.",
            &one(format!("{:.3}", f64::from(max_milli) / 1000.0)),
        );
        metric(
            "wary_gateway_queue_depth",
            "gauge",
            "Readings waiting for a worker.",
            &one(queue_depth.to_string()),
        );
        metric("wary_gateway_queue_capacity", "gauge", "Queue capacity.", &one(queue_cap.to_string()));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreadable_retry_after_values_are_exposed() {
        let m = Metrics { retry_after_unreadable: 3, ..Metrics::default() };
        let text = m.prometheus(1_000, 2_000, 0, 8);
        assert!(text.contains("\nwary_gateway_retry_after_unreadable_total 3\n"), "{text}");
        assert!(text.contains("wary_gateway_calls_total{verdict=\"gave_up\"} 0"), "{text}");
    }
}
