//! The optimistic-concurrency model of the AWS backoff study, driving wary's decision path.
//!
//! Every client updates one row once. It reads the row's version, then sends a conditional write
//! that the server refuses if another write got in after that read. After a refused write the
//! client waits and starts again from the read. Every message (a read, its reply, a write, its
//! reply) takes a network delay of `|N(10 ms, 2 ms)|`. The clients all start at t = 0, and a run
//! ends when the last client has its write's reply (or, under a policy with a budget, gives up).
//!
//! The wait after a refused write is the core's own decision: [`Policy::decide`] on the refusal
//! (412, which every policy here has as a `retry_any` status: the conditional write did not
//! land, so redoing the whole read-and-write is safe), a [`Draw::unit`] from the run's
//! generator, and the policy's jitter and stop rules. Only "no backoff" bypasses it, since it
//! waits 0, which no policy expresses.
//!
//! The network's time is integer microseconds; the policies decide in whole milliseconds, as on
//! a device, so every wait is a whole number of ms. The generator is SplitMix64, seeded per run;
//! normal draws come from Box–Muller in `f64` (this runs on the host only).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt::Write as _;

use serde_json::{Value, json};
use wary::{CallState, Decision, Draw, Duration, Jitter, Operation, Outcome, Policy, Preset, Rule};

use crate::report::{table, thousands};

/// Microseconds per millisecond.
pub const US_PER_MS: u64 = 1_000;
/// The refusal of a conditional write whose version is stale: 412 Precondition Failed.
pub const REFUSED: u16 = 412;
/// A wait budget far beyond any run: the longest a policy accepts (one below the saturated
/// [`Duration::MAX`]), about 49.7 days.
pub const LONGEST: Duration = Duration::from_millis(u32::MAX as u64 - 1);
/// The network delay's mean, in µs.
pub const DELAY_MEAN_US: f64 = 10_000.0;
/// The network delay's standard deviation, in µs.
pub const DELAY_SD_US: f64 = 2_000.0;
/// The study's backoff base, in ms, under its formula `min(cap, base·2ⁿ)` with n = 1 at the
/// first retry.
pub const STUDY_BASE_MS: u64 = 5;
/// The study's cap, in ms.
pub const STUDY_CAP_MS: u64 = 2_000;
/// Runs averaged per figure.
pub const RUNS: u32 = 100;
/// Fleet sizes.
pub const CLIENTS: [u32; 5] = [10, 20, 50, 75, 100];
/// The study's own figures for 100 clients: policy id, writes, completion in ms.
pub const STUDY_100: [(&str, u64, u64); 5] = [
    ("none", 2_425, 2_026),
    ("exponential", 1_855, 63_513),
    ("equal", 813, 6_599),
    ("full", 795, 5_006),
    ("decorrelated", 999, 4_688),
];

/// SplitMix64: a small seeded generator, so every run is a pure function of its seed.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
    spare: Option<f64>,
}

impl SplitMix64 {
    /// A generator from `seed`.
    pub const fn new(seed: u64) -> Self {
        SplitMix64 { state: seed, spare: None }
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The next 32 bits (the high half, the better mixed).
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform in (0, 1]: never 0, so its logarithm is finite.
    fn unit_open(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// A standard normal draw (Box–Muller; each pair of uniforms gives two draws).
    pub fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        let r = (-2.0 * self.unit_open().ln()).sqrt();
        let theta = std::f64::consts::TAU * self.unit_open();
        self.spare = Some(r * theta.sin());
        r * theta.cos()
    }

    /// One network delay, `|N(mean, sd)|` rounded to whole µs.
    pub fn delay_us(&mut self) -> u64 {
        (DELAY_MEAN_US + DELAY_SD_US * self.normal()).abs().round() as u64
    }
}

/// How a client waits after a refused write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Straight back to the read, no wait (the study's "no backoff").
    Immediate,
    /// The core's decision.
    Wary(Policy),
    /// Not wary's: decorrelated jitter capped after the draw, `min(cap, U(base, 3·previous))`,
    /// the study's own formula, run only to show where its figures and wary's part.
    CapAfterDraw {
        /// Base.
        base: Duration,
        /// Cap.
        cap: Duration,
    },
}

/// A policy under study.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contender {
    /// Its id in results.json.
    pub id: &'static str,
    /// Its name in tables.
    pub name: &'static str,
    /// How it waits.
    pub strategy: Strategy,
}

/// One of the study's backoffs, retrying until the update lands: an attempt cap and
/// a wait budget far beyond any run, since full jitter needs an attempt cap to be accepted.
///
/// The study's first retry waits under `base·2¹`, wary's under its base, so the exponential
/// ceilings need wary's base at twice the study's (10 ms) to be the same: 10, 20, 40, … ms,
/// capped at 2 s. Decorrelated jitter starts from the base itself in both (its first wait is
/// drawn in [base, 3·base)), so it keeps 5 ms.
pub fn study_policy(jitter: Jitter) -> Policy {
    let base_ms = match jitter {
        Jitter::Decorrelated => STUDY_BASE_MS,
        _ => 2 * STUDY_BASE_MS,
    };
    Policy::builder(Preset::Default)
        .table(conflict_retried(Preset::Default))
        .base(Duration::from_millis(base_ms))
        .cap(Duration::from_millis(STUDY_CAP_MS))
        .jitter(jitter)
        .max_attempts(1_000_000)
        .budget(LONGEST)
        .build()
        .unwrap_or_else(|e| panic!("study policy refused: {e:?}"))
}

/// The preset's table with a refused conditional write ([`REFUSED`]) resent for any operation:
/// the server refused it before doing anything.
pub fn conflict_retried(preset: Preset) -> wary::Table {
    let shipped = Policy::builder(preset).build().unwrap_or_else(|e| panic!("preset refused: {e:?}"));
    shipped.table().with_status(REFUSED, Rule::RetryAny).unwrap_or_else(|e| panic!("412 refused: {e:?}"))
}

/// `Preset::Default` as shipped (its jitter, base, cap, wait budget, deadline and attempt cap),
/// with only the refused conditional write added to its table.
pub fn wary_default() -> Policy {
    Policy::builder(Preset::Default)
        .table(conflict_retried(Preset::Default))
        .build()
        .unwrap_or_else(|e| panic!("default refused: {e:?}"))
}

/// The study's five policies, then wary's default.
pub fn contenders() -> Vec<Contender> {
    vec![
        Contender { id: "none", name: "no backoff", strategy: Strategy::Immediate },
        Contender {
            id: "exponential",
            name: "exponential, no jitter",
            strategy: Strategy::Wary(study_policy(Jitter::None)),
        },
        Contender {
            id: "equal",
            name: "equal jitter",
            strategy: Strategy::Wary(study_policy(Jitter::Equal)),
        },
        Contender { id: "full", name: "full jitter", strategy: Strategy::Wary(study_policy(Jitter::Full)) },
        Contender {
            id: "decorrelated",
            name: "decorrelated jitter",
            strategy: Strategy::Wary(study_policy(Jitter::Decorrelated)),
        },
        Contender { id: "wary_default", name: "wary default", strategy: Strategy::Wary(wary_default()) },
    ]
}

/// Decorrelated jitter as the study's simulator computes it (capped after the draw): not one of
/// the contenders, run beside them at 100 clients only to show where the two formulas part.
pub fn cap_after_draw() -> Contender {
    Contender {
        id: "decorrelated_capped_after_draw",
        name: "decorrelated, capped after the draw (not wary's formula)",
        strategy: Strategy::CapAfterDraw {
            base: Duration::from_millis(STUDY_BASE_MS),
            cap: Duration::from_millis(STUDY_CAP_MS),
        },
    }
}

/// The rows shown only beside the study's figures: its decorrelated formula, and full jitter
/// with the study's base read as wary's (ceilings 5, 10, 20 … ms: one retry behind the study's).
pub fn diagnostics() -> Vec<Contender> {
    let full_5 = study_policy(Jitter::Full)
        .to_builder()
        .base(Duration::from_millis(STUDY_BASE_MS))
        .build()
        .unwrap_or_else(|e| panic!("full jitter at base 5 ms refused: {e:?}"));
    vec![
        cap_after_draw(),
        Contender {
            id: "full_base_5ms",
            name: "full jitter, wary base 5 ms",
            strategy: Strategy::Wary(full_5),
        },
    ]
}

/// The study's policy a row compares with: the id up to its first `_`.
fn study_row(id: &str) -> Option<(u64, u64)> {
    let head = id.split('_').next().unwrap_or(id);
    STUDY_100.iter().find(|(i, ..)| *i == head).map(|&(_, w, t)| (w, t))
}

/// A message arriving somewhere; ordered only so that the queue's ties stay deterministic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A read reaches the server.
    Read,
    /// The read's reply, with the version read, reaches the client.
    ReadReply { version: u64 },
    /// A conditional write on `version` reaches the server.
    Write { version: u64 },
    /// The write's reply reaches the client.
    WriteReply { ok: bool },
}

/// What one run measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunStats {
    /// Reads the server answered.
    pub reads: u64,
    /// Conditional writes the server answered (the study's "calls").
    pub writes: u64,
    /// Writes refused because another write got in first.
    pub conflicts: u64,
    /// Clients whose update landed.
    pub updated: u64,
    /// Clients that gave up on a stop rule of the policy.
    pub gave_up: u64,
    /// The row's version at the end: one per write that landed.
    pub version: u64,
    /// Waits decided (one per refused write that was retried).
    pub retries: u64,
    /// All waits together, in µs.
    pub waited_us: u64,
    /// The first wait any client decided, in µs.
    pub first_wait_us: Option<u64>,
    /// When the last client was done, in µs.
    pub completion_us: u64,
}

impl RunStats {
    /// Every request the server answered: reads and writes.
    pub const fn calls(&self) -> u64 {
        self.reads + self.writes
    }
}

/// One run: `clients` clients, the run's generator seeded with `seed`.
pub fn run(strategy: &Strategy, clients: u32, seed: u64) -> RunStats {
    let mut rng = SplitMix64::new(seed);
    let mut states = vec![CallState::new(); clients as usize];
    let mut last_waits = vec![Duration::ZERO; clients as usize];
    // Min-heap on (time, sequence): the sequence breaks ties in sending order.
    let mut queue: BinaryHeap<Reverse<(u64, u64, u32, Event)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut send = |queue: &mut BinaryHeap<_>, at: u64, client: u32, ev: Event| {
        queue.push(Reverse((at, seq, client, ev)));
        seq += 1;
    };
    for c in 0..clients {
        let at = rng.delay_us();
        send(&mut queue, at, c, Event::Read);
    }
    let mut s = RunStats::default();
    // The conflict a refused write answers, with no Retry-After.
    let refused = Outcome::status(REFUSED);
    while let Some(Reverse((now, _, client, ev))) = queue.pop() {
        s.completion_us = now;
        match ev {
            Event::Read => {
                s.reads += 1;
                let at = now + rng.delay_us();
                send(&mut queue, at, client, Event::ReadReply { version: s.version });
            }
            Event::ReadReply { version } => {
                let at = now + rng.delay_us();
                send(&mut queue, at, client, Event::Write { version });
            }
            Event::Write { version } => {
                s.writes += 1;
                let ok = version == s.version;
                if ok {
                    s.version += 1;
                } else {
                    s.conflicts += 1;
                }
                let at = now + rng.delay_us();
                send(&mut queue, at, client, Event::WriteReply { ok });
            }
            Event::WriteReply { ok: true } => s.updated += 1,
            Event::WriteReply { ok: false } => {
                let wait = match strategy {
                    Strategy::Immediate => Some(Duration::ZERO),
                    Strategy::Wary(p) => {
                        let state = &mut states[client as usize];
                        let draw = Draw::unit(rng.next_u32());
                        // Every client started at 0, so `now` is the call's elapsed time
                        // (rounded up: a deadline is never met early).
                        let elapsed = Some(Duration::from_micros_ceil(now));
                        match p.decide(state, Operation::Write, &refused, draw, elapsed) {
                            Decision::Retry { wait } => Some(wait),
                            Decision::Done(_) => None,
                        }
                    }
                    &Strategy::CapAfterDraw { base, cap } => {
                        let prev = &mut last_waits[client as usize];
                        let hi = (*prev).max(base).saturating_mul(3);
                        let w = (base + Draw::unit(rng.next_u32()).scale(hi - base)).min(cap);
                        *prev = w;
                        Some(w)
                    }
                };
                let wait = wait.map(Duration::as_micros);
                match wait {
                    Some(w) => {
                        s.retries += 1;
                        s.waited_us += w;
                        s.first_wait_us.get_or_insert(w);
                        let at = now + w + rng.delay_us();
                        send(&mut queue, at, client, Event::Read);
                    }
                    None => s.gave_up += 1,
                }
            }
        }
    }
    s
}

/// The seed of run `r`: spread apart so that neighbouring runs share no stream.
pub fn run_seed(seed: u64, r: u32) -> u64 {
    SplitMix64::new(seed ^ u64::from(r).wrapping_mul(0xd1b5_4a32_d192_ed03)).next_u64()
}

/// Mean, sample standard deviation, least and most of a set of figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// Mean.
    pub mean: f64,
    /// Sample standard deviation.
    pub sd: f64,
    /// Least.
    pub min: f64,
    /// Most.
    pub max: f64,
}

impl Spread {
    /// The spread of `xs` (all zero when empty).
    pub fn of(xs: &[f64]) -> Spread {
        if xs.is_empty() {
            return Spread { mean: 0.0, sd: 0.0, min: 0.0, max: 0.0 };
        }
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var =
            if xs.len() > 1 { xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
        let min = xs.iter().copied().fold(f64::INFINITY, f64::min);
        let max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Spread { mean, sd: var.sqrt(), min, max }
    }

    /// The standard error of the mean over `n` runs.
    pub fn sem(&self, n: u32) -> f64 {
        self.sd / f64::from(n.max(1)).sqrt()
    }

    fn json(&self) -> Value {
        json!({"mean": self.mean, "sd": self.sd, "min": self.min, "max": self.max})
    }
}

/// One policy at one fleet size, over every run.
#[derive(Debug, Clone)]
pub struct Summary {
    /// The contender's id.
    pub id: &'static str,
    /// The contender's name.
    pub name: &'static str,
    /// Clients.
    pub clients: u32,
    /// Runs.
    pub runs: u32,
    /// Reads and writes.
    pub calls: Spread,
    /// Writes only.
    pub writes: Spread,
    /// Completion, in ms.
    pub completion_ms: Spread,
    /// Clients that gave up, per run.
    pub gave_up: Spread,
}

/// Every contender at every fleet size, `runs` runs each (run `r` seeded alike for all).
pub fn sweep(contenders: &[Contender], clients: &[u32], runs: u32, seed: u64) -> Vec<Summary> {
    let mut out = Vec::new();
    for c in contenders {
        for &n in clients {
            let stats: Vec<RunStats> = (0..runs).map(|r| run(&c.strategy, n, run_seed(seed, r))).collect();
            let of = |f: &dyn Fn(&RunStats) -> f64| Spread::of(&stats.iter().map(f).collect::<Vec<_>>());
            out.push(Summary {
                id: c.id,
                name: c.name,
                clients: n,
                runs,
                calls: of(&|s| s.calls() as f64),
                writes: of(&|s| s.writes as f64),
                completion_ms: of(&|s| s.completion_us as f64 / US_PER_MS as f64),
                gave_up: of(&|s| s.gave_up as f64),
            });
        }
    }
    out
}

fn pm(s: &Spread) -> String {
    format!("{} ± {}", thousands(s.mean.round() as u64), thousands(s.sd.round() as u64))
}

/// How far our mean is from the study's, in standard errors of the difference of two means of
/// `runs` runs each (our run-to-run spread standing in for the study's).
pub fn z(ours: &Spread, study: f64, runs: u32) -> f64 {
    let se = ours.sem(runs) * std::f64::consts::SQRT_2;
    if se > 0.0 { (ours.mean - study) / se } else { f64::INFINITY }
}

/// A policy's settings in ms, as the tables print them.
pub fn describe(p: &Policy) -> String {
    let ms = |t: Duration| thousands(u64::from(t.as_millis()));
    let b = p.backoff();
    let mut out = format!(
        "{} jitter, base {} ms, cap {} ms, wait budget {} ms",
        b.jitter.name(),
        ms(b.base),
        ms(b.cap),
        ms(p.budget())
    );
    match p.deadline() {
        Some(d) => out.push_str(&format!(", deadline {} ms", ms(d))),
        None => out.push_str(", no deadline"),
    }
    match p.max_attempts() {
        Some(n) => out.push_str(&format!(", at most {n} attempts")),
        None => out.push_str(", no attempt cap"),
    }
    out
}

/// The section's heading in results.md (after its leading blank line).
pub const HEADING: &str = "## Optimistic-concurrency model";

/// The results.md section.
/// `diagnostic` holds the extra rows shown only beside the study's figures.
pub fn section(sums: &[Summary], diagnostic: &[Summary], seed: u64, wall_secs: f64) -> String {
    let runs = sums.first().map_or(RUNS, |s| s.runs);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "\n{HEADING} (the AWS backoff study's setting)\n\n\
         Every client updates one row once: a read for the version, then a conditional write the \
         server refuses if another write got in first; after a refused write the client backs off \
         and starts again from the read. Every message takes |N(10 ms, 2 ms)|, in integer µs; \
         the policies decide in whole ms; \
         {runs} runs per figure (seed {seed}, run r seeded alike for every policy), mean ± sample sd. \
         The wait after a refused write is `Policy::decide` on the 412 (a `retry_any` status here) \
         with a `Draw::unit` per wait; \"no backoff\" goes straight back to the read. The study's \
         base 5 ms and cap 2 s: its first retry waits under 2·5 ms, so exponential, equal and full \
         jitter run with wary's base at 10 ms (the same ceilings: 10, 20, 40 … 2,000 ms); \
         decorrelated keeps base 5 ms (first wait in [5, 15) ms in both). `wary default` is \
         `Preset::Default` as shipped ({}), 412 retried. Calls = reads + writes; the study counts writes \
         only.\n",
        describe(&wary_default())
    );
    let rows: Vec<Vec<String>> = sums
        .iter()
        .map(|s| {
            let gave = if s.gave_up.mean > 0.0 {
                format!("{:.1} (max {})", s.gave_up.mean, s.gave_up.max)
            } else {
                "0".to_owned()
            };
            vec![
                s.name.to_owned(),
                s.clients.to_string(),
                pm(&s.calls),
                pm(&s.writes),
                format!("{}–{}", thousands(s.writes.min as u64), thousands(s.writes.max as u64)),
                pm(&s.completion_ms),
                format!(
                    "{}–{}",
                    thousands(s.completion_ms.min.round() as u64),
                    thousands(s.completion_ms.max.round() as u64)
                ),
                gave,
            ]
        })
        .collect();
    md.push_str(&table(
        &[
            "policy",
            "clients",
            "calls (reads + writes)",
            "writes",
            "writes min–max",
            "completion ms",
            "completion min–max",
            "gave up",
        ],
        &rows,
    ));
    md.push_str(&beside_study(sums, diagnostic));
    let _ = writeln!(md, "\nModel wall time: {wall_secs:.1} s.");
    md
}

/// The 100-client rows beside the study's own figures.
pub fn beside_study(sums: &[Summary], diagnostic: &[Summary]) -> String {
    let mut md = String::from(
        "\n### 100 clients beside the study's own simulator (writes / completion ms)\n\n\
         Δ is ours − study's; z is that difference in standard errors of a difference of two \
         100-run means (our sd for both): |z| > 3 is beyond run-to-run noise.\n\n",
    );
    let mut rows = Vec::new();
    for s in sums.iter().chain(diagnostic).filter(|s| s.clients == 100) {
        let (sw, st, dw, dt) = match study_row(s.id) {
            Some((w, t)) => (
                thousands(w),
                thousands(t),
                format!(
                    "{:+.0}% (z {:+.1})",
                    100.0 * (s.writes.mean / w as f64 - 1.0),
                    z(&s.writes, w as f64, s.runs)
                ),
                format!(
                    "{:+.0}% (z {:+.1})",
                    100.0 * (s.completion_ms.mean / t as f64 - 1.0),
                    z(&s.completion_ms, t as f64, s.runs)
                ),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        rows.push(vec![s.name.to_owned(), pm(&s.writes), sw, dw, pm(&s.completion_ms), st, dt, pm(&s.calls)]);
    }
    md.push_str(&table(
        &[
            "policy",
            "writes",
            "study",
            "Δ writes",
            "completion ms",
            "study",
            "Δ completion",
            "calls (reads + writes)",
        ],
        &rows,
    ));
    md.push_str(
        "\nWhere the two models part. The study counts only writes as calls; here every write \
         follows a read, so calls are twice the writes. Its exponential ceilings start at 2·base \
         (the first retry is its n = 1), matched here by wary's base of 10 ms. Its decorrelated \
         jitter draws in [base, 3·previous) and caps after the draw, so once 3·previous passes \
         2 s a share of its waits sit at exactly 2 s; wary draws in [base, min(cap, 3·previous)), \
         so its waits spread below the cap and the herd finishes sooner for the same writes. Full \
         jitter with wary's base at 5 ms (the study's base read under wary's formula) is shown \
         for the mapping's sake: every ceiling one retry behind the study's.",
    );
    let capped = diagnostic.iter().find(|s| s.clients == 100 && s.id == cap_after_draw().id);
    let decorrelated = STUDY_100.iter().find(|(i, ..)| *i == "decorrelated");
    if let (Some(c), Some(&(_, _, t))) = (capped, decorrelated) {
        let zc = z(&c.completion_ms, t as f64, c.runs);
        let verdict = if zc.abs() <= 3.0 {
            "within run-to-run noise of the study's: the cap alone accounts for the gap"
        } else {
            "still beyond run-to-run noise of the study's: the cap does not account for all of the gap"
        };
        let _ = write!(
            md,
            " The row capped after the draw (the study's formula, computed here outside the core) \
             finishes in {} ms (z {zc:+.1}), {verdict}.",
            thousands(c.completion_ms.mean.round() as u64)
        );
    }
    md.push('\n');
    md
}

/// `old` with the model's section (from its heading to the next `## ` heading) replaced by
/// `section`, or with `section` added at the end.
pub fn splice(old: &str, section: &str) -> String {
    let Some(start) = old.find(HEADING) else {
        return format!("{}\n{}", old.trim_end(), section);
    };
    let rest = &old[start + HEADING.len()..];
    let end = rest.find("\n## ").map_or(old.len(), |i| start + HEADING.len() + i);
    // The section starts with its own blank line.
    let head = old[..start].trim_end_matches('\n');
    format!("{head}\n{}{}", section, &old[end..])
}

/// The `study_model` value in results.json.
pub fn json(sums: &[Summary], diagnostic: &[Summary], seed: u64) -> Value {
    let rows = |sums: &[Summary]| -> Vec<Value> {
        sums.iter()
            .map(|s| {
                let study = study_row(s.id)
                    .filter(|_| s.clients == 100)
                    .map(|(w, t)| json!({"writes": w, "completion_ms": t}));
                json!({
                    "policy": s.id, "name": s.name, "clients": s.clients, "runs": s.runs,
                    "calls": s.calls.json(), "writes": s.writes.json(),
                    "completion_ms": s.completion_ms.json(), "gave_up": s.gave_up.json(),
                    "study": study,
                })
            })
            .collect()
    };
    json!({
        "seed": seed,
        "delay_ms": {"mean": DELAY_MEAN_US / 1000.0, "sd": DELAY_SD_US / 1000.0},
        "study_base_ms": STUDY_BASE_MS, "cap_ms": STUDY_CAP_MS,
        "calls_counted": "reads + writes (the study counts writes)",
        "results": rows(sums),
        "diagnostic": rows(diagnostic),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<Contender> {
        contenders()
    }

    #[test]
    fn one_client_reads_once_writes_once_and_never_waits() {
        for c in all() {
            for seed in 0..50 {
                let s = run(&c.strategy, 1, seed);
                assert_eq!((s.reads, s.writes, s.calls()), (1, 1, 2), "{}", c.name);
                assert_eq!((s.conflicts, s.retries, s.waited_us, s.updated, s.version), (0, 0, 0, 1, 1));
                // Four messages of 10 ± 2 ms each: 40 ± 4 ms; six sd either way.
                assert!((16_000..=64_000).contains(&s.completion_us), "{}: {s:?}", c.name);
            }
        }
    }

    #[test]
    fn two_clients_without_jitter_conflict_and_both_land() {
        let p = Strategy::Wary(study_policy(Jitter::None));
        for seed in 0..50 {
            let s = run(&p, 2, seed);
            // Both reads reach the server long before either write (≈10 ms against ≈30 ms), so
            // the second write is refused, waits the first ceiling (10 ms) and lands.
            assert_eq!((s.updated, s.version, s.gave_up), (2, 2, 0), "{s:?}");
            assert_eq!((s.conflicts, s.retries, s.writes, s.reads), (1, 1, 3, 3), "{s:?}");
            assert_eq!(s.first_wait_us, Some(10_000));
            assert_eq!(s.waited_us, 10_000);
        }
    }

    #[test]
    fn waits_come_from_the_policy_s_jitter() {
        // Full jitter's first wait is under its 10 ms ceiling; decorrelated's in [5, 15) ms.
        let full = Strategy::Wary(study_policy(Jitter::Full));
        let dec = Strategy::Wary(study_policy(Jitter::Decorrelated));
        let mut full_waits = Vec::new();
        for seed in 0..200 {
            let w = run(&full, 2, seed).first_wait_us.unwrap();
            assert!(w < 10_000, "{w}");
            full_waits.push(w);
            let w = run(&dec, 2, seed).first_wait_us.unwrap();
            assert!((5_000..15_000).contains(&w), "{w}");
        }
        // Drawn, not fixed: uniform on [0, 10 ms) has mean 5 ms.
        let mean = full_waits.iter().sum::<u64>() as f64 / full_waits.len() as f64;
        assert!((4_000.0..6_000.0).contains(&mean), "{mean}");
        assert_eq!(run(&Strategy::Immediate, 2, 3).waited_us, 0);
        // wary's base at 5 ms: the first ceiling is 5 ms, not the study's 10.
        let full_5 = diagnostics().pop().unwrap().strategy;
        assert!((0..50).all(|seed| run(&full_5, 2, seed).first_wait_us.unwrap() < 5_000));
        let capped = cap_after_draw().strategy;
        assert!((0..50).all(|seed| (5_000..15_000).contains(&run(&capped, 2, seed).first_wait_us.unwrap())));
    }

    #[test]
    fn each_row_meets_its_study_figure() {
        assert_eq!(study_row("decorrelated_capped_after_draw"), Some((999, 4_688)));
        assert_eq!(study_row("full_base_5ms"), Some((795, 5_006)));
        assert_eq!(study_row("none"), Some((2_425, 2_026)));
        assert_eq!(study_row("wary_default"), None);
    }

    #[test]
    fn every_write_either_lands_or_conflicts_and_every_client_finishes() {
        for c in all() {
            for n in [10, 50] {
                let s = run(&c.strategy, n, 11);
                assert_eq!(s.writes, s.version + s.conflicts, "{}", c.name);
                assert_eq!(s.updated, s.version);
                assert_eq!(s.updated + s.gave_up, u64::from(n), "{}: {s:?}", c.name);
                assert_eq!(s.reads, s.writes, "a read precedes each write");
                assert_eq!(s.retries + s.gave_up, s.conflicts, "{}", c.name);
            }
        }
    }

    #[test]
    fn the_study_s_policies_never_give_up() {
        for c in all().iter().filter(|c| c.id != "wary_default") {
            assert_eq!(run(&c.strategy, 100, 5).gave_up, 0, "{}", c.name);
        }
    }

    #[test]
    fn wary_default_is_the_shipped_preset_with_the_conflict_retried() {
        let p = wary_default();
        let shipped = Policy::builder(Preset::Default).build().unwrap();
        assert_eq!(p.backoff(), shipped.backoff());
        assert_eq!(p.budget(), shipped.budget());
        assert_eq!((p.deadline(), p.max_attempts()), (shipped.deadline(), shipped.max_attempts()));
        // Only the table differs, and only in the refusal of a stale conditional write.
        assert_eq!(p.to_builder().table(*shipped.table()).build().unwrap(), shipped);
        let o = Outcome::status(REFUSED);
        assert_eq!(shipped.classify(Operation::Write, &o), wary::Class::Failed);
        assert_eq!(p.classify(Operation::Write, &o), wary::Class::Retry);
        assert_eq!(
            describe(&study_policy(Jitter::Full)),
            "full jitter, base 10 ms, cap 2,000 ms, wait budget 4,294,967,294 ms, no deadline, at most 1000000 attempts"
        );
    }

    #[test]
    fn normal_delays_have_the_study_s_mean_and_spread() {
        let mut rng = SplitMix64::new(42);
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| rng.delay_us() as f64).collect();
        let s = Spread::of(&xs);
        // The standard error of the mean is 2000/√n ≈ 4.5 µs; the folding at 0 is 5 sd away.
        // The study's figures, not the constants: 10 ms mean, 2 ms sd.
        assert!((s.mean - 10_000.0).abs() < 30.0, "{s:?}");
        assert!((s.sd - 2_000.0).abs() < 30.0, "{s:?}");
        let z: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
        let within_one = z.iter().filter(|x| x.abs() < 1.0).count() as f64 / f64::from(n);
        assert!((within_one - 0.6827).abs() < 0.01, "{within_one}");
        let zs = Spread::of(&z);
        assert!(zs.mean.abs() < 0.01 && (zs.sd - 1.0).abs() < 0.01, "{zs:?}");
    }

    #[test]
    fn a_seed_fixes_the_run_and_another_changes_it() {
        let p = Strategy::Wary(study_policy(Jitter::Full));
        assert_eq!(run(&p, 50, 7), run(&p, 50, 7));
        assert_ne!(run(&p, 50, 7), run(&p, 50, 8));
    }

    #[test]
    fn jitter_beats_both_no_backoff_and_no_jitter_at_100_clients() {
        let sums = sweep(&contenders(), &[100], 10, 1);
        let get = |id: &str| sums.iter().find(|s| s.id == id).unwrap();
        for j in ["equal", "full", "decorrelated"] {
            assert!(get(j).writes.mean < get("none").writes.mean, "{j}");
            assert!(get(j).completion_ms.mean < get("exponential").completion_ms.mean, "{j}");
        }
    }

    #[test]
    fn the_section_replaces_its_old_self_and_nothing_else() {
        let new = format!("\n{HEADING} (new)\n\nnew body\n");
        let old = format!("# t\n\n## A\n\na\n\n{HEADING} (old)\n\nold body\n\n## B\n\nb\n");
        assert_eq!(
            splice(&old, &new),
            format!("# t\n\n## A\n\na\n\n{HEADING} (new)\n\nnew body\n\n## B\n\nb\n")
        );
        let last = format!("# t\n\n## A\n\na\n\n{HEADING} (old)\n\nold body\n");
        assert_eq!(splice(&last, &new), format!("# t\n\n## A\n\na\n\n{HEADING} (new)\n\nnew body\n"));
        assert_eq!(
            splice("# t\n\n## A\n\na\n", &new),
            format!("# t\n\n## A\n\na\n\n{HEADING} (new)\n\nnew body\n")
        );
    }

    #[test]
    fn spread_is_the_sample_spread() {
        let s = Spread::of(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!((s.mean, s.min, s.max), (2.5, 1.0, 4.0));
        assert!((s.sd - 1.290_994).abs() < 1e-6);
    }
}
