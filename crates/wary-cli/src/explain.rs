//! `wary explain`: the worked schedule of a policy, its classification grid and its risks, so
//! an engineer can see that the budget bounds the attempts before shipping a setting.
//!
//! Every duration is in milliseconds, the core's unit: the JSON fields say so in their names
//! (`min_waits_ms`), the text prints `ms` after each number.

use serde::Serialize;
use wary::{Backoff, Duration, Failure, Jitter, Operation, Outcome, Policy, PolicyError, Transport};

/// One retry of the worked schedule.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Step {
    /// The retry, from 1.
    pub retry: u32,
    /// Its ceiling.
    #[serde(rename = "ceiling_ms")]
    pub ceiling: Duration,
    /// The part every draw waits (the shortest wait).
    #[serde(rename = "fixed_ms")]
    pub fixed: Duration,
    /// The part the draw decides (longest minus shortest).
    #[serde(rename = "random_ms")]
    pub random: Duration,
    /// The shortest wait.
    #[serde(rename = "min_ms")]
    pub min: Duration,
    /// The longest wait.
    #[serde(rename = "max_ms")]
    pub max: Duration,
    /// Running total of the shortest waits.
    #[serde(rename = "min_total_ms")]
    pub min_total: Duration,
    /// Running total of the longest waits, capped at the budget.
    #[serde(rename = "max_total_ms")]
    pub max_total: Duration,
}

/// Everything `wary explain` prints.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Explanation {
    /// The most retries the policy can make.
    pub max_retries: u32,
    /// The shortest wait of each retry (every draw at 0).
    #[serde(rename = "min_waits_ms")]
    pub min_waits: Vec<Duration>,
    /// The longest wait of each retry (every draw at the top).
    #[serde(rename = "max_waits_ms")]
    pub max_waits: Vec<Duration>,
    /// The worked schedule.
    pub steps: Vec<Step>,
    /// The most a call can wait in total: the budget, or the longest waits' sum if less.
    #[serde(rename = "longest_wait_ms")]
    pub longest_wait: Duration,
    /// The longest a call can take, when a deadline bounds it.
    #[serde(rename = "longest_call_ms")]
    pub longest_call: Option<Duration>,
    /// Outcome × operation → class.
    pub table: Vec<TableRow>,
    /// The fleet retry budget, when one is given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetExplained>,
    /// The endpoint's send rate, when one is given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pace: Option<PaceExplained>,
    /// The endpoint's circuit breaker, when one is given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breaker: Option<BreakerExplained>,
    /// Risky settings.
    pub warnings: Vec<String>,
}

/// What a fleet retry budget allows.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FleetExplained {
    /// Tokens.
    pub max_tokens: u32,
    /// Thousandths of a token back per success.
    pub ratio_milli: u32,
    /// Failed attempts, fleet-wide and with no success between them, before retries stop (the
    /// bucket's start: retries need more than half the tokens).
    pub failures_before_throttle: u32,
    /// Successes that pay for one failure once the bucket is at its threshold.
    pub successes_per_failure: u32,
}

/// The fleet budget's consequences, computed by running the real bucket.
pub fn fleet(tokens: u32, ratio_milli: u32) -> Option<FleetExplained> {
    let b = wary::FleetBudget::new(tokens, ratio_milli).ok()?;
    let mut failures = 0u32;
    while b.on_failure() {
        failures += 1;
    }
    Some(FleetExplained {
        max_tokens: tokens,
        ratio_milli,
        failures_before_throttle: failures + 1,
        successes_per_failure: 1000u32.div_ceil(ratio_milli),
    })
}

/// What a send rate does, computed by running the real [`wary::Pace`].
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PaceExplained {
    /// The settings as given, rates in thousandths of a request a second.
    pub start_milli: u32,
    /// The lowest rate.
    pub floor_milli: u32,
    /// The rate at which the pace opens again.
    pub ceiling_milli: u32,
    /// Share of the rate a throttle keeps, percent.
    pub keep_percent: u8,
    /// Time to climb back to the rate cut from.
    #[serde(rename = "regrow_ms")]
    pub regrow: Duration,
    /// Requests that may go at once.
    pub burst: u8,
    /// The share of throttles let pass without a cut, percent.
    pub tolerate_percent: u8,
    /// Throttles in a row before the first cut (1 when nothing is tolerated).
    pub throttles_to_first_cut: u32,
    /// The rate after the first cut.
    pub after_first_throttle_milli: u32,
    /// Throttles in a row that bring the rate to the floor.
    pub throttles_to_floor: u32,
    /// The shortest and longest wait before the first request after the first throttle.
    #[serde(rename = "first_wait_min_ms")]
    pub first_wait_min: Duration,
    /// See `first_wait_min`.
    #[serde(rename = "first_wait_max_ms")]
    pub first_wait_max: Duration,
    /// The shortest and longest wait before the first request after the endpoint's breaker
    /// opened (an outage for the pace: two cuts), asked as an outbox asks between calls until a
    /// request may go.
    #[serde(rename = "down_wait_min_ms")]
    pub down_wait_min: Duration,
    /// See `down_wait_min`.
    #[serde(rename = "down_wait_max_ms")]
    pub down_wait_max: Duration,
}

/// The send rate's consequences; `None` if the settings are refused.
pub fn pace(settings: wary::PaceSettings) -> Option<PaceExplained> {
    let at = wary::Instant::from_millis(0);
    let fresh = wary::Pace::new(settings).ok()?;
    // Throttles in a row until the pace is cut (one, unless it tolerates a share of them).
    let cut = |draw| {
        let (mut p, mut n) = (fresh, 0u32);
        while p.is_open() && n < 1_000 {
            p.on_throttled(at, draw);
            n += 1;
        }
        (p, n)
    };
    let first_wait = |draw| {
        let (mut p, _) = cut(draw);
        p.acquire(at).err().unwrap_or(Duration::ZERO)
    };
    // After `on_down`, asked again each time the wait it gave is over: the wait shown early is a
    // lower bound while the rate climbs (the burst's allowance is counted in shorter intervals).
    let down_wait = |draw| {
        let mut p = fresh;
        p.on_down(at, draw);
        let mut t = 0u64;
        for _ in 0..64 {
            match { p }.acquire(wary::Instant::from_millis(t)) {
                Ok(()) => break,
                Err(w) => t = t.saturating_add(u64::from(w.as_millis()).max(1)),
            }
        }
        Duration::from_millis(t)
    };
    let (mut p, to_first_cut) = cut(wary::Draw::ZERO);
    let after = p.rate_milli(at).unwrap_or(settings.floor_milli);
    let mut throttles = to_first_cut;
    while p.rate_milli(at).is_some_and(|r| r > settings.floor_milli) && throttles < 1_000 {
        p.on_throttled(at, wary::Draw::ZERO);
        throttles += 1;
    }
    Some(PaceExplained {
        start_milli: settings.start_milli,
        floor_milli: settings.floor_milli,
        ceiling_milli: settings.ceiling_milli,
        keep_percent: settings.keep_percent,
        regrow: settings.regrow,
        burst: settings.burst,
        tolerate_percent: settings.tolerate_percent,
        throttles_to_first_cut: to_first_cut,
        after_first_throttle_milli: after,
        throttles_to_floor: throttles,
        first_wait_min: first_wait(wary::Draw::ZERO),
        first_wait_max: first_wait(wary::Draw::TOP),
        down_wait_min: down_wait(wary::Draw::ZERO),
        down_wait_max: down_wait(wary::Draw::TOP),
    })
}

/// What a circuit breaker does, computed by running the real [`wary::Breaker`].
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BreakerExplained {
    /// Failures in a row that open it.
    pub threshold: u8,
    /// Whether one refused connection opens it.
    pub refused_opens: bool,
    /// The first open time, shortest and longest (equal jitter).
    #[serde(rename = "first_open_min_ms")]
    pub first_open_min: Duration,
    /// See `first_open_min`.
    #[serde(rename = "first_open_max_ms")]
    pub first_open_max: Duration,
    /// The longest open time, shortest and longest, after failed probes.
    #[serde(rename = "longest_open_min_ms")]
    pub longest_open_min: Duration,
    /// See `longest_open_min`.
    #[serde(rename = "longest_open_max_ms")]
    pub longest_open_max: Duration,
}

/// The breaker's consequences; `None` if the settings are refused.
pub fn breaker(settings: wary::BreakerSettings) -> Option<BreakerExplained> {
    let fresh = wary::Breaker::new(settings).ok()?;
    // Open time after `trips` openings in a row, at a draw.
    let open = |trips: u32, draw| {
        let mut b = fresh;
        let mut t = 0u64;
        for _ in 0..settings.threshold {
            b.on_failure(wary::Instant::from_millis(t), draw);
        }
        for _ in 1..trips {
            if let wary::BreakerState::Open { until, .. } = b.state() {
                t = until.as_millis();
            }
            let _ = b.admit(wary::Instant::from_millis(t));
            b.on_failure(wary::Instant::from_millis(t), draw);
        }
        match b.state() {
            wary::BreakerState::Open { until, .. } => Duration::from_millis(until.as_millis() - t),
            _ => Duration::ZERO,
        }
    };
    Some(BreakerExplained {
        threshold: settings.threshold,
        refused_opens: settings.refused_opens,
        first_open_min: open(1, wary::Draw::ZERO),
        first_open_max: open(1, wary::Draw::TOP),
        longest_open_min: open(64, wary::Draw::ZERO),
        longest_open_max: open(64, wary::Draw::TOP),
    })
}

/// A rate in thousandths a second, as requests a second.
fn rate(milli: u32) -> String {
    format!("{}.{:03}/s", milli / 1000, milli % 1000)
}

/// One row of the classification grid.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TableRow {
    /// The outcome.
    pub outcome: String,
    /// Class for a read.
    pub read: String,
    /// Class for a keyed write.
    pub keyed_write: String,
    /// Class for a write without a key.
    pub write: String,
}

/// Steps shown at most (a long budget at the cap would list thousands of equal rows).
const MAX_STEPS: u32 = 64;

fn grid_outcomes() -> Vec<(String, Outcome)> {
    let mut v: Vec<(String, Outcome)> = [400, 401, 403, 404, 408, 409, 422, 429, 500, 501, 502, 503, 504]
        .iter()
        .map(|c| (c.to_string(), Outcome::status(*c)))
        .collect();
    // Every failure other than a status a table has a rule for, then a stream broken after
    // forwarding, which no table retries.
    let failures = Transport::ALL
        .iter()
        .filter_map(|t| Failure::from_name(t.name()))
        .chain([Failure::StreamBroken { forwarded: true }]);
    for f in failures {
        v.push((f.name().to_owned(), f.into()));
    }
    v
}

/// Why the builder refuses, for a running call, a setting the backoff formula itself defines:
/// `wary plan` answers such a policy (its outcomes bound the plan), a running call does not.
/// `None` for a refusal with nothing to add to its message (a deadline of 0, an attempt cap of
/// 0, an attempt longer than the deadline: settings the formula does not have).
pub fn why_refused(e: &PolicyError) -> Option<&'static str> {
    Some(match e {
        PolicyError::ZeroBudget => {
            "a budget of 0 allows no wait, so a running call could never retry; the formula defines it \
             (every retry gives up at once) and `wary plan` answers it"
        }
        PolicyError::CapBelowBase => {
            "with the cap below the base every ceiling is the cap, a constant: the formula defines it \
             and `wary plan` answers it, but a running policy refuses it as a setting written the wrong \
             way round"
        }
        PolicyError::ZeroBase => {
            "a base of 0 makes every backoff wait 0: nothing spends the budget, so a running call \
             with no attempt cap would retry back to back forever; `wary plan` answers it, its \
             outcomes bound the plan"
        }
        PolicyError::Unbounded => {
            "this jitter can wait 0, so waits need not spend the budget and nothing bounds a running \
             call's attempts: set an attempt cap (`--max-attempts`); `wary plan` answers it, its \
             outcomes bound the plan"
        }
        PolicyError::TooLarge => {
            "wary counts durations in 32 bits of milliseconds, and 4294967295 ms (about 49.7 days) \
             stands for \"longer than wary counts\", which cannot bound a call: every setting must be \
             at most 4294967294 ms; `wary plan` refuses such a number too, by name"
        }
        _ => return None,
    })
}

/// Explains `policy`; `known_retry_after` is the longest Retry-After the API is known to send,
/// for the warning when the budget cannot wait it out.
pub fn explain(policy: &Policy, known_retry_after: Option<Duration>) -> Explanation {
    let b: &Backoff = policy.backoff();
    let max_retries = policy.max_retries().unwrap_or(0);
    let shown = max_retries.min(MAX_STEPS);
    let mut steps = Vec::new();
    let (mut prev_min, mut prev_max, mut min_total, mut max_total) =
        (Duration::ZERO, Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for k in 1..=shown {
        let min = b.min_wait(k, prev_min);
        let max = b.max_wait(k, prev_max).max(min);
        min_total += min;
        max_total = (max_total + max).min(policy.budget());
        steps.push(Step {
            retry: k,
            ceiling: b.ceiling(k),
            fixed: min,
            random: max - min,
            min,
            max,
            min_total,
            max_total,
        });
        prev_min = min;
        prev_max = max;
    }
    let longest_wait = steps.last().map_or(Duration::ZERO, |s| s.max_total);
    let longest_call = policy.deadline();
    let table = grid_outcomes()
        .into_iter()
        .map(|(name, o)| TableRow {
            outcome: name,
            read: policy.classify(Operation::Idempotent, &o).name().to_owned(),
            keyed_write: policy.classify(Operation::KeyedWrite, &o).name().to_owned(),
            write: policy.classify(Operation::Write, &o).name().to_owned(),
        })
        .collect();
    let mut warnings = Vec::new();
    if b.jitter == Jitter::Full && policy.max_attempts().is_none() {
        warnings.push("full jitter with no attempt cap: waits near 0 spend no budget".to_owned());
    }
    if b.min_wait(1, Duration::ZERO) == Duration::ZERO {
        warnings.push(format!(
            "base {} is so small that the first wait can be 0: retries fire back to back",
            b.base
        ));
    }
    if let Some(ra) = known_retry_after
        && ra > policy.budget()
    {
        warnings.push(format!(
            "budget {} is shorter than the Retry-After of {} the API sends: such calls give up at once",
            policy.budget(),
            seconds(ra)
        ));
    }
    if b.cap > policy.budget() {
        warnings.push(format!(
            "cap {} is above the budget {}: no wait can reach the cap",
            b.cap,
            policy.budget()
        ));
    }
    if max_retries > MAX_STEPS {
        warnings.push(format!("{max_retries} retries fit the budget; only the first {MAX_STEPS} are listed"));
    }
    Explanation {
        max_retries,
        min_waits: steps.iter().map(|s| s.min).collect(),
        max_waits: steps.iter().map(|s| s.max).collect(),
        steps,
        longest_wait,
        longest_call,
        table,
        fleet: None,
        pace: None,
        breaker: None,
        warnings,
    }
}

/// A Retry-After as the header gives it, whole seconds, with its milliseconds when not whole.
fn seconds(d: Duration) -> String {
    let whole = d.as_secs();
    if Duration::from_secs(u64::from(whole)) == d { format!("{whole} s") } else { d.to_string() }
}

/// A duration or "none".
fn or_none(d: Option<Duration>) -> String {
    d.map_or("none".to_owned(), |d| d.to_string())
}

/// The human form.
pub fn render(e: &Explanation, policy: &Policy) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let b = policy.backoff();
    let _ = writeln!(
        s,
        "policy: base {}, cap {}, budget {}, jitter {}, attempts {}, deadline {}",
        b.base,
        b.cap,
        policy.budget(),
        b.jitter.name(),
        policy.max_attempts().map_or("unlimited".to_owned(), |n| n.to_string()),
        or_none(policy.deadline()),
    );
    let _ = writeln!(s, "\nwaits in ms");
    let _ = writeln!(s, "retry  ceiling  fixed  random  shortest  longest  total(short)  total(long)");
    for st in &e.steps {
        let _ = writeln!(
            s,
            "{:>5}  {:>7}  {:>5}  {:>6}  {:>8}  {:>7}  {:>12}  {:>11}",
            st.retry,
            st.ceiling.as_millis(),
            st.fixed.as_millis(),
            st.random.as_millis(),
            st.min.as_millis(),
            st.max.as_millis(),
            st.min_total.as_millis(),
            st.max_total.as_millis()
        );
    }
    let _ = writeln!(
        s,
        "\nat most {} retries ({} attempts): the shortest waits add to {}, and one more would pass the budget of {}",
        e.max_retries,
        e.max_retries.saturating_add(1),
        e.steps.last().map_or(Duration::ZERO, |x| x.min_total),
        policy.budget()
    );
    let _ = writeln!(s, "a call waits at most {} in total", e.longest_wait);
    if let Some(d) = e.longest_call {
        let _ = writeln!(s, "a call takes at most {d}, attempts included (deadline)");
    }
    let _ = writeln!(s, "\n{:<22} {:<8} {:<12} {:<8}", "outcome", "read", "keyed_write", "write");
    for r in &e.table {
        let _ = writeln!(s, "{:<22} {:<8} {:<12} {:<8}", r.outcome, r.read, r.keyed_write, r.write);
    }
    if let Some(f) = &e.fleet {
        let _ = writeln!(
            s,
            "\nfleet budget: {} tokens, {}.{:03} back per success: retries stop fleet-wide after {} failed attempts \
             with no success between them, and then take {} successes per failure to keep going",
            f.max_tokens,
            f.ratio_milli / 1000,
            f.ratio_milli % 1000,
            f.failures_before_throttle,
            f.successes_per_failure
        );
    }
    if let Some(p) = &e.pace {
        let _ = writeln!(
            s,
            "\npace (asked before every attempt, first ones too): open until the server throttles (429, 503); \
             the first cut sets {} ({}% of the start {}), each further one keeps {}% of the rate in force, aiming \
             lower when it comes before the rate is back, down to the floor {} ({} throttles in a row reach it); the first request after a cut waits {} to {} (drawn, so devices \
             cut together do not come back together); the rate climbs back to where it was cut from in {}, \
             then on with served answers, and opens again at {}; {} request(s) may go at once; a Retry-After \
             holds the requests until it is over without a cut; pace waits count toward the wait budget",
            rate(p.after_first_throttle_milli),
            p.keep_percent,
            rate(p.start_milli),
            p.keep_percent,
            rate(p.floor_milli),
            p.throttles_to_floor,
            p.first_wait_min,
            p.first_wait_max,
            p.regrow,
            rate(p.ceiling_milli),
            p.burst
        );
        if p.tolerate_percent > 0 {
            let _ = writeln!(
                s,
                "  it tolerates {}% of throttles: a throttle cuts only when throttles are more than that share of the \
                 answers heard since the last cut (over at least {}), so a run of throttles is first cut after {} of them",
                p.tolerate_percent,
                wary::TOLERANCE_SAMPLE,
                p.throttles_to_first_cut
            );
        }
    }
    if let Some(b) = &e.breaker {
        let _ = writeln!(
            s,
            "\nbreaker: opens after {} failures in a row (refused connections, timeouts, resets, TLS, 5xx but 503; \
             throttles do not count){}; while open a call ends at once, gave_up (circuit_open), with nothing sent; \
             open {} to {} the first time, one probe then, each failed probe doubling it up to {} to {}",
            b.threshold,
            if b.refused_opens { ", or at once on a refused connection" } else { "" },
            b.first_open_min,
            b.first_open_max,
            b.longest_open_min,
            b.longest_open_max
        );
        if let Some(p) = &e.pace {
            let _ = writeln!(
                s,
                "  its opening is an outage for the pace (two cuts, as two throttles in a row): the probe waits for the \
                 pace's next request as well, {} to {} after the opening, and when it closes the pace starts again \
                 over the fleet's window",
                p.down_wait_min, p.down_wait_max
            );
        }
    }
    for w in &e.warnings {
        let _ = writeln!(s, "\nwarning: {w}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use wary::Preset;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn all_ms(ws: &[Duration]) -> Vec<u32> {
        ws.iter().map(|w| w.as_millis()).collect()
    }

    #[test]
    fn the_worked_waits_of_base_2_cap_60_budget_120() {
        let p = Policy::builder(Preset::Default).base(ms(2)).cap(ms(60)).budget(ms(120)).build().unwrap();
        let e = explain(&p, None);
        assert_eq!(e.max_retries, 7);
        assert_eq!(all_ms(&e.min_waits), [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(e.steps.last().unwrap().min_total, ms(91));
        assert_eq!(all_ms(&e.max_waits), [1, 3, 7, 15, 31, 59, 59]);
        assert_eq!(e.steps[5].max_total, ms(116));
        assert_eq!(e.steps[6].max_total, ms(120));
        assert!(e.warnings.is_empty(), "{:?}", e.warnings);
        let grid = e.table.iter().find(|r| r.outcome == "503").unwrap();
        assert_eq!(
            (grid.read.as_str(), grid.keyed_write.as_str(), grid.write.as_str()),
            ("retry", "retry", "unknown")
        );
        // Every duration in the JSON form says its unit.
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["min_waits_ms"], serde_json::json!([1, 2, 4, 8, 16, 30, 30]));
        assert_eq!(json["steps"][6]["max_total_ms"], 120);
        assert_eq!(json["longest_wait_ms"], 120);
    }

    #[test]
    fn the_grid_names_every_failure_a_table_has_a_rule_for() {
        let p = Policy::builder(Preset::Default).build().unwrap();
        let e = explain(&p, None);
        let names: Vec<&str> = e.table.iter().map(|r| r.outcome.as_str()).collect();
        for t in Transport::ALL {
            assert!(names.contains(&t.name()), "{names:?}");
        }
        let after = e.table.iter().find(|r| r.outcome == "stream_broken_after").unwrap();
        assert_eq!(after.read, "failed", "bytes already forwarded are never sent again");
    }

    #[test]
    fn refusals_of_what_the_formula_defines_say_why() {
        let b = || Policy::builder(Preset::Basic).base(ms(2)).cap(ms(60)).budget(ms(120));
        for (built, word) in [
            (b().budget(ms(0)).build(), "budget of 0"),
            (b().cap(ms(1)).build(), "below the base"),
            (b().base(ms(0)).build(), "base of 0"),
            (b().base(ms(1)).cap(ms(1)).build(), "attempt cap"),
            (b().jitter(Jitter::Full).build(), "attempt cap"),
            (b().budget(Duration::MAX).build(), "at most 4294967294 ms"),
        ] {
            let e = built.unwrap_err();
            let why = why_refused(&e).unwrap_or_else(|| panic!("{e}: no reason"));
            assert!(why.contains(word), "{e}: {why}");
            assert!(why.contains("wary plan"), "{why}");
        }
        assert_eq!(why_refused(&PolicyError::ZeroAttempts), None);
    }

    #[test]
    fn pace_and_breaker_consequences_come_from_the_real_types() {
        let p = pace(wary::PaceSettings::DEVICE).unwrap();
        // 0.1/s halved to 0.05/s; then, each cut in a row coming before the curve is back, aimed
        // at the midpoint and halved from there: 0.05 → 0.01875 → 0.007 (the floor, 0.01): three
        // throttles.
        assert_eq!((p.after_first_throttle_milli, p.throttles_to_floor), (50, 3));
        // A 20 s interval with a burst of 2: the first request waits 10 s to 30 s.
        assert_eq!((p.first_wait_min, p.first_wait_max), (Duration::from_secs(10), Duration::from_secs(30)));
        // Down: cut twice (0.018/s), the first request 56 to 112 s away once asked until it may go.
        assert_eq!(
            (p.down_wait_min, p.down_wait_max),
            (Duration::from_millis(55_556), Duration::from_millis(111_862))
        );
        let b = breaker(wary::BreakerSettings::DEVICE).unwrap();
        assert_eq!(
            (b.first_open_min, b.first_open_max),
            (Duration::from_secs(15), Duration::from_millis(29_999))
        );
        assert_eq!(b.longest_open_min, Duration::from_secs(300));
        assert!(
            b.longest_open_max > Duration::from_secs(599) && b.longest_open_max <= Duration::from_secs(600)
        );
        assert!(pace(wary::PaceSettings { burst: 0, ..wary::PaceSettings::DEVICE }).is_none());
        assert_eq!(p.throttles_to_first_cut, 1);
        // Tolerating half: the sixth throttle in a row is the first to cut (6 of at least 10).
        let t = pace(wary::PaceSettings { tolerate_percent: 50, ..wary::PaceSettings::DEVICE }).unwrap();
        assert_eq!((t.throttles_to_first_cut, t.after_first_throttle_milli), (6, 50));
        let policy = Policy::builder(wary::Preset::Default).build().unwrap();
        let mut e = explain(&policy, None);
        e.pace = Some(p);
        e.breaker = Some(b.clone());
        let text = render(&e, &policy);
        assert!(text.contains("the first cut sets 0.050/s (50% of the start 0.100/s)"), "{text}");
        assert!(text.contains("opens after 2 failures in a row"), "{text}");
        assert!(!text.contains("or at once on a refused connection"), "{text}");
        e.breaker = breaker(wary::BreakerSettings { refused_opens: true, ..wary::BreakerSettings::DEVICE });
        let text = render(&e, &policy);
        assert!(text.contains("or at once on a refused connection"), "{text}");
        e.breaker = Some(b.clone());
        assert!(!text.contains("tolerates"), "{text}");
        e.pace = pace(wary::PaceSettings { tolerate_percent: 50, ..wary::PaceSettings::DEVICE });
        let text = render(&e, &policy);
        assert!(
            text.contains("it tolerates 50% of throttles") && text.contains("first cut after 6 of them"),
            "{text}"
        );
        let json = serde_json::to_string(&e).unwrap();
        assert!(
            json.contains("\"regrow_ms\":60000") && json.contains("\"first_open_min_ms\":15000"),
            "{json}"
        );
    }

    #[test]
    fn fleet_budget_consequences_come_from_the_bucket() {
        // gRPC A6's example: 10 tokens, 0.1 back: the fifth failure leaves 5, not above half.
        let f = fleet(10, 100).unwrap();
        assert_eq!((f.failures_before_throttle, f.successes_per_failure), (5, 10));
        let f = fleet(3, 1000).unwrap();
        assert_eq!((f.failures_before_throttle, f.successes_per_failure), (2, 1));
        assert!(fleet(0, 100).is_none());
    }

    #[test]
    fn risky_settings_warn() {
        let p = Policy::builder(Preset::Default)
            .base(ms(1))
            .cap(ms(200))
            .budget(ms(120))
            .jitter(Jitter::Full)
            .max_attempts(5)
            .build()
            .unwrap();
        let e = explain(&p, Some(Duration::from_secs(300)));
        let all = e.warnings.join("\n");
        assert!(all.contains("base 1 ms is so small that the first wait can be 0"), "{all}");
        assert!(all.contains("budget 120 ms is shorter than the Retry-After of 300 s"), "{all}");
        assert!(all.contains("cap 200 ms is above the budget 120 ms"), "{all}");
        assert_eq!(e.max_retries, 4);
    }
}
