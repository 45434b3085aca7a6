//! `wary replay` and `wary stats`: a ledger read back, every decision recomputed by the core,
//! and the health of the calls it holds.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use wary::{
    CallState, Class, Decision, Draw, Duration, GiveUp, Phase, Policy, Verdict,
    ledger::{Admission, AttemptStats, Record},
};
use wary_host::ledger::{Line, read_lines};

/// One call's records, in order.
#[derive(Debug, Clone)]
pub struct Call {
    /// The records.
    pub records: Vec<Record>,
}

/// A ledger split into policies and calls.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Policies by fingerprint.
    pub policies: HashMap<u32, Policy>,
    /// Calls in the order their first record appears.
    pub calls: Vec<Call>,
    /// Lines that could not be read, with their line numbers.
    pub bad_lines: Vec<(usize, String)>,
}

/// Reads a ledger. A call is the run of records under one key up to its verdict. A policy line
/// is rebuilt into the core's [`Policy`] from its every setting; one whose settings do not give
/// its fingerprint, or of another ledger version, is an unreadable line, never a policy.
pub fn load(text: &str) -> Ledger {
    let mut ledger = Ledger::default();
    let mut open: HashMap<[u8; 16], usize> = HashMap::new();
    for (n, line) in read_lines(text) {
        match line {
            Ok(Line::Policy(p)) => {
                ledger.policies.insert(p.fingerprint(), p);
            }
            Ok(Line::Attempt(r)) => {
                let key = *r.key.as_bytes();
                // A call's cancel record repeats the number of the attempt it followed.
                let continues = r.attempt > 1 || r.class == Class::Cancelled;
                let idx = match open.get(&key) {
                    Some(i) if continues => *i,
                    _ => {
                        ledger.calls.push(Call { records: Vec::new() });
                        ledger.calls.len() - 1
                    }
                };
                if let Some(call) = ledger.calls.get_mut(idx) {
                    call.records.push(r);
                }
                if r.verdict.is_some() {
                    open.remove(&key);
                } else {
                    open.insert(key, idx);
                }
            }
            Err(e) => ledger.bad_lines.push((n, e.to_string())),
        }
    }
    ledger
}

/// A decision the core makes differently from the ledger.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Divergence {
    /// The call's key.
    pub key: String,
    /// The attempt.
    pub attempt: u32,
    /// What the ledger says.
    pub recorded: String,
    /// What the core decides now.
    pub replayed: String,
}

fn describe(d: &Decision) -> String {
    match d {
        Decision::Retry { wait } => format!("retry after {wait}"),
        Decision::Done(v) => v.to_string(),
    }
}

fn recorded(r: &Record) -> String {
    match r.verdict {
        None if r.class == Class::Unknown => "unknown, probed: not landed, resent".to_owned(),
        None => format!("retry after {}", r.wait),
        Some(v) => v.to_string(),
    }
}

/// What differs between the record the core builds now and the one in the ledger.
fn difference(want: &Record, got: &Record, decision: &Decision) -> String {
    if want.class != got.class {
        format!("class {}", want.class.name())
    } else if (want.wait, want.verdict) != (got.wait, got.verdict) {
        describe(decision)
    } else if want.refused != got.refused {
        "no refused retry: the decision it records was not a retry".to_owned()
    } else if want.draw.is_some() != got.draw.is_some() {
        match want.draw {
            Some(_) => "a retryable outcome, whose draw the record lacks".to_owned(),
            None => "no draw for this outcome".to_owned(),
        }
    } else {
        "a different record".to_owned()
    }
}

/// Why what a record says the pace and the breaker said does not hold together: the pace's
/// wait is not the one its bucket gives, a closed breaker with time left. (A bucket due with no
/// rate in force is an open pace holding for a server's ask.)
fn incoherent(a: &Admission) -> Option<String> {
    if a.wait != a.pace.wait() {
        Some(format!(
            "a pace wait of {} (its bucket, {} ticks due, gives {})",
            a.wait,
            a.pace.due,
            a.pace.wait()
        ))
    } else if a.breaker_left > Duration::ZERO
        && a.breaker != Some(Phase::Open)
        && a.breaker != Some(Phase::HalfOpen)
    {
        Some(format!(
            "a {} breaker that refused for {}",
            a.breaker.map_or("missing", |p| p.name()),
            a.breaker_left
        ))
    } else {
        None
    }
}

/// Recomputes every decision of every call with [`Policy::decide`], rebuilds its record with
/// [`Record::decided`] and compares it with the ledger's; returns the divergences.
///
/// What the endpoint's pace and breaker said ([`Record::admitted`], [`Record::refused`]) is
/// checked and replayed beside the policy: each pace wait must be the one its recorded bucket
/// gives, asked at the instant the previous attempt's wait ended, and is charged to the
/// call's wait budget before the attempt's decision, as the call charged it
/// ([`Policy::charge_wait`]); a breaker must have let every attempt that went through; and a
/// retry they refused must be refused for the reason the recorded numbers give (the breaker's
/// time left, or a pace wait the budget or the deadline cannot pay).
pub fn replay(ledger: &Ledger) -> Vec<Divergence> {
    let mut out = Vec::new();
    for call in &ledger.calls {
        let mut state = CallState::new();
        let mut previous: Option<&Record> = None;
        for r in &call.records {
            let diverge = |replayed: String| Divergence {
                key: r.key.to_hex().as_str().to_owned(),
                attempt: r.attempt,
                recorded: recorded(r),
                replayed,
            };
            let Some(policy) = ledger.policies.get(&r.policy) else {
                out.push(diverge(format!("no policy line for fingerprint {:08x}", r.policy)));
                break;
            };
            // What the pace and the breaker said before this attempt went.
            if let Some(a) = r.admitted {
                let asked = previous.filter(|p| p.class == Class::Retry && p.verdict.is_none());
                let problem = incoherent(&a)
                    .or_else(|| {
                        (a.breaker_left > Duration::ZERO)
                            .then(|| format!("an attempt the breaker refused for {}", a.breaker_left))
                    })
                    .or_else(|| {
                        asked.filter(|p| p.total_time.saturating_add(p.wait) != a.at).map(|p| {
                            format!(
                                "asked at {}, not when the wait ended ({})",
                                a.at,
                                p.total_time.saturating_add(p.wait)
                            )
                        })
                    })
                    .or_else(|| {
                        policy.charge_wait(&mut state, a.wait, Some(a.at)).err().map(|why| {
                            format!(
                                "{} before the attempt: a pace wait of {} it cannot pay",
                                Verdict::GaveUp(why),
                                a.wait
                            )
                        })
                    });
                if let Some(p) = problem {
                    out.push(diverge(p));
                    break;
                }
            }
            let draw = r.draw.unwrap_or(Draw::ZERO);
            let decided = policy.decide(&mut state, r.op, &r.outcome, draw, Some(r.total_time));
            // What happened after the decision, outside the call's own state: the endpoint's
            // pace or breaker refused the retry (replayed from what they said), the fleet
            // budget (shared by every call, not in the ledger) refused it, or a probe resolved
            // an unknown (landed: ok; not landed: resent once).
            let (decision, verdict) = match (decided, r.verdict, r.refused) {
                (Decision::Retry { wait }, Some(Verdict::GaveUp(why)), Some(a)) => {
                    let problem = incoherent(&a)
                        .or_else(|| {
                            let at = r.total_time.saturating_add(wait);
                            (a.at != at).then(|| format!("asked at {}, not when the wait ended ({at})", a.at))
                        })
                        .or_else(|| {
                            let reason = if a.breaker_left > Duration::ZERO {
                                Err(GiveUp::CircuitOpen)
                            } else {
                                policy.charge_wait(&mut state.clone(), a.wait, Some(a.at))
                            };
                            match reason {
                                Err(reason) if reason == why => None,
                                Err(reason) => Some(Verdict::GaveUp(reason).to_string()),
                                Ok(()) => {
                                    Some(format!("retry after {wait} (what the endpoint said lets it go)"))
                                }
                            }
                        });
                    if let Some(p) = problem {
                        out.push(diverge(p));
                        break;
                    }
                    (Decision::Done(Verdict::GaveUp(why)), None)
                }
                (Decision::Retry { .. }, Some(Verdict::GaveUp(GiveUp::Throttled)), None) => {
                    (Decision::Done(Verdict::GaveUp(GiveUp::Throttled)), None)
                }
                (Decision::Done(Verdict::Unknown), Some(Verdict::Ok), _) => {
                    (decided, Some(Some(Verdict::Ok)))
                }
                (Decision::Done(Verdict::Unknown), None, _) => (decided, Some(None)),
                _ => (decided, None),
            };
            let mut want = Record::decided(
                policy,
                r.key,
                r.attempt,
                r.op,
                r.outcome,
                draw,
                decision,
                r.attempt_time,
                r.total_time,
            );
            if let Some(v) = verdict {
                want = want.with_verdict(v);
            }
            want.admitted = r.admitted;
            if matches!((decided, decision), (Decision::Retry { .. }, Decision::Done(_))) {
                want.refused = r.refused;
            }
            if want != *r {
                out.push(diverge(difference(&want, r, &decided)));
                break;
            }
            previous = Some(r);
        }
    }
    out
}

/// What `wary stats` reports.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Stats {
    /// Calls.
    pub calls: u32,
    /// Attempts.
    pub attempts: u64,
    /// Mean attempts per call.
    pub mean: f64,
    /// Median attempts per call.
    pub p50: u32,
    /// 95th percentile.
    pub p95: u32,
    /// Most attempts.
    pub max: u32,
    /// Calls by attempts (1, 2, …; the last bucket is that many or more).
    pub histogram: Vec<u32>,
    /// Verdict counts (calls without a verdict yet count as `open`).
    pub verdicts: BTreeMap<String, u32>,
    /// What the retried attempts failed with.
    pub retry_causes: BTreeMap<String, u32>,
    /// The calls with the most attempts: key and attempts.
    pub top: Vec<(String, u32)>,
    /// Lines that could not be read, and so are not in the figures.
    pub unreadable_lines: usize,
}

const BUCKETS: usize = 16;

/// Computes the stats of a ledger.
pub fn stats(ledger: &Ledger) -> Stats {
    let mut hist = AttemptStats::<BUCKETS>::new();
    let mut verdicts = BTreeMap::new();
    let mut causes = BTreeMap::new();
    let mut top = Vec::new();
    for call in &ledger.calls {
        let n = u32::try_from(call.records.len()).unwrap_or(u32::MAX);
        hist.add(n);
        let v = call.records.last().and_then(|r| r.verdict).map_or("open".to_owned(), |v| match v {
            // Grouped by reason only: what a server asked for is in the ledger, not the counts.
            Verdict::GaveUp(g) => format!("gave_up ({})", g.name()),
            v => v.to_string(),
        });
        *verdicts.entry(v).or_insert(0) += 1;
        for r in call.records.iter().filter(|r| r.verdict.is_none()) {
            let cause = match r.outcome.code() {
                Some(c) => c.to_string(),
                None => r.outcome.name().to_owned(),
            };
            *causes.entry(cause).or_insert(0) += 1;
        }
        if let Some(first) = call.records.first() {
            top.push((first.key.to_hex().as_str().to_owned(), n));
        }
    }
    top.sort_by_key(|t| std::cmp::Reverse(t.1));
    top.truncate(5);
    Stats {
        calls: hist.calls(),
        attempts: hist.attempts(),
        mean: hist.mean_milli() as f64 / 1000.0,
        p50: hist.percentile(50),
        p95: hist.percentile(95),
        max: hist.max(),
        histogram: (1..=BUCKETS as u32).map(|a| hist.count(a)).collect(),
        verdicts,
        retry_causes: causes,
        top,
        unreadable_lines: ledger.bad_lines.len(),
    }
}

/// The human form of the stats, with a small histogram.
pub fn render_stats(s: &Stats) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(o, "calls: {}  attempts: {}", s.calls, s.attempts);
    let _ = writeln!(o, "attempts per call: mean {:.2}  p50 {}  p95 {}  max {}", s.mean, s.p50, s.p95, s.max);
    let widest = s.histogram.iter().copied().max().unwrap_or(0).max(1);
    let last = s.histogram.iter().rposition(|c| *c > 0).unwrap_or(0);
    for (i, c) in s.histogram.iter().enumerate().take(last + 1) {
        let bar = "#".repeat((*c as usize * 40).div_ceil(widest as usize));
        let label = if i + 1 == BUCKETS { format!("{}+", i + 1) } else { (i + 1).to_string() };
        let _ = writeln!(o, "{label:>4} | {bar} {c}");
    }
    let _ = writeln!(o, "verdicts:");
    for (v, n) in &s.verdicts {
        let _ = writeln!(o, "  {v}: {n}");
    }
    let _ = writeln!(o, "retry causes:");
    for (c, n) in &s.retry_causes {
        let _ = writeln!(o, "  {c}: {n}");
    }
    let _ = writeln!(o, "most attempts:");
    for (k, n) in &s.top {
        let _ = writeln!(o, "  {k}: {n}");
    }
    o
}
