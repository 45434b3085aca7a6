//! A deterministic discrete-event simulation of a fleet of clients contending for one server.
//!
//! Every client starts one call at tick 0 (the herd after a restart or a shared timeout). The
//! server serves at most `capacity` calls per tick and answers the rest with a 503, as a load
//! shedder does; a capacity of 0 is a total outage. Each response comes back after a round trip
//! of `latency ± latency_spread` ticks (the AWS study's network noise), and the client then
//! decides through the real core, `Policy::decide_with_fleet` as the runner does, with a
//! `Draw::unit` from the run's seeded generator, and the fleet budget when there is one — so
//! the figures are wary's own, not a copy of its formulas. A tick is a millisecond.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use wary::{
    CallState, Decision, Draw, Duration, FleetBudget, GiveUp, Jitter, Operation, Outcome, Policy, Preset,
    Verdict,
};

use crate::decision::{BASE, CAP};

/// The world a run happens in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct World {
    /// Clients, each making one call.
    pub clients: u32,
    /// Calls the server serves per tick; 0 is a total outage.
    pub capacity: u32,
    /// Mean round trip, in ticks.
    pub latency: u64,
    /// The round trip varies uniformly by this much either way.
    pub latency_spread: u64,
    /// Calls sent at or after this tick are not simulated (an outage's length).
    pub horizon: Option<u64>,
    /// A run stops after this many calls, so an unbounded herd cannot hold the whole bench.
    pub max_calls: u64,
    /// The seed of the run's one generator (round trips and draws).
    pub seed: u64,
}

impl World {
    /// One contended resource: one call served per millisecond, a 10 ± 2 ms round trip.
    pub const fn contended(clients: u32, seed: u64) -> Self {
        World {
            clients,
            capacity: 1,
            latency: 10,
            latency_spread: 2,
            horizon: None,
            max_calls: 30_000_000,
            seed,
        }
    }

    /// A total outage of `ticks`: every call fails.
    pub const fn outage(clients: u32, ticks: u64, seed: u64) -> Self {
        World { capacity: 0, horizon: Some(ticks), ..World::contended(clients, seed) }
    }
}

/// A fleet retry budget's settings (`wary::FleetBudget::new`), and whether every client of the
/// run shares one bucket (as every task of one gateway does) or each has its own (as each device
/// of a fleet does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetSpec {
    /// Tokens.
    pub max_tokens: u32,
    /// Thousandths of a token returned per success.
    pub ratio_milli: u32,
    /// One bucket per client instead of one for all.
    pub per_client: bool,
}

impl FleetSpec {
    /// gRPC A6's example: 10 tokens, 0.1 back per success, one bucket for all clients.
    pub const A6: FleetSpec = FleetSpec { max_tokens: 10, ratio_milli: 100, per_client: false };
    /// The same bucket, one per client.
    pub const A6_PER_CLIENT: FleetSpec = FleetSpec { per_client: true, ..FleetSpec::A6 };

    /// The label in tables.
    pub fn label(&self) -> String {
        let scope = if self.per_client { "per client" } else { "shared" };
        format!("A6 {}/{} {scope}", self.max_tokens, f64::from(self.ratio_milli) / 1000.0)
    }
}

/// What a run measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Calls the server received (every attempt).
    pub calls: u64,
    /// Clients whose call succeeded.
    pub succeeded: u64,
    /// Clients that gave up on a stop rule of their own (budget, attempts).
    pub gave_up: u64,
    /// Clients the fleet budget stopped.
    pub throttled: u64,
    /// Clients still retrying when the run ended (past the horizon or the call cap).
    pub unfinished: u64,
    /// The tick at which the last client finished.
    pub completion: u64,
    /// The most calls the server received in one tick after tick 0: the retries' peak, since
    /// every policy starts from the same herd of first attempts.
    pub peak_per_tick: u64,
    /// True if the run hit `max_calls`.
    pub truncated: bool,
}

impl Stats {
    /// Calls per client.
    pub fn amplification(&self, clients: u32) -> f64 {
        self.calls as f64 / f64::from(clients.max(1))
    }
}

/// Runs one simulation.
pub fn run(policy: &Policy, fleet: Option<FleetSpec>, world: &World) -> Stats {
    let n = world.clients as usize;
    let buckets: Vec<FleetBudget> = match fleet {
        None => Vec::new(),
        Some(f) => (0..if f.per_client { n } else { 1 })
            .map(|_| {
                FleetBudget::new(f.max_tokens, f.ratio_milli)
                    .unwrap_or_else(|e| panic!("fleet budget refused: {e:?}"))
            })
            .collect(),
    };
    let mut rng = fastrand::Rng::with_seed(world.seed);
    let mut states = vec![CallState::new(); n];
    // Min-heap on (tick, client): ties go to the lower client, so a run is a pure function of
    // its inputs.
    let mut queue: BinaryHeap<Reverse<(u64, u32)>> = (0..world.clients).map(|c| Reverse((0, c))).collect();
    let mut s = Stats::default();
    let (mut tick, mut served, mut this_tick) = (u64::MAX, 0u32, 0u64);
    while let Some(Reverse((t, client))) = queue.pop() {
        if world.horizon.is_some_and(|h| t >= h) || s.calls >= world.max_calls {
            s.truncated = s.calls >= world.max_calls;
            s.unfinished = queue.len() as u64 + 1;
            break;
        }
        if t != tick {
            (tick, served, this_tick) = (t, 0, 0);
        }
        this_tick += 1;
        if t > 0 {
            s.peak_per_tick = s.peak_per_tick.max(this_tick);
        }
        s.calls += 1;
        let outcome = if served < world.capacity {
            served += 1;
            Outcome::Ok
        } else {
            Outcome::status(503)
        };
        let rtt = world.latency - world.latency_spread + rng.u64(0..=2 * world.latency_spread);
        let now = t + rtt;
        let draw = Draw::unit(rng.u32(..));
        let state = &mut states[client as usize];
        // One bucket for all, or the client's own (an empty list: no fleet budget).
        let bucket = buckets.get(if buckets.len() == 1 { 0 } else { client as usize });
        // Every client starts at tick 0, so `now` is the call's elapsed time.
        let elapsed = Some(Duration::from_millis(now));
        let decision = match bucket {
            Some(b) => policy.decide_with_fleet(state, Operation::Idempotent, &outcome, draw, elapsed, b),
            None => policy.decide(state, Operation::Idempotent, &outcome, draw, elapsed),
        };
        match decision {
            Decision::Retry { wait } => queue.push(Reverse((now + u64::from(wait.as_millis()), client))),
            Decision::Done(v) => {
                s.completion = s.completion.max(now);
                match v {
                    Verdict::Ok => s.succeeded += 1,
                    Verdict::GaveUp(GiveUp::Throttled) => s.throttled += 1,
                    _ => s.gave_up += 1,
                }
            }
        }
    }
    s
}

/// A policy under study.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contender {
    /// Its name in tables and the plot.
    pub name: &'static str,
    /// The policy.
    pub policy: Policy,
}

/// The longest wait budget a policy accepts (one below the saturated [`Duration::MAX`]), about
/// 49.7 days: far beyond any run.
pub const LONGEST: Duration = Duration::from_millis(u32::MAX as u64 - 1);

/// The AWS study's clients: base 5, cap 2000, retrying until they succeed (an attempt cap and a
/// budget far beyond anything a run reaches, since full jitter needs a cap to be accepted).
pub fn aws(jitter: Jitter) -> Policy {
    Policy::builder(Preset::Default)
        .base(Duration::from_millis(BASE))
        .cap(Duration::from_millis(CAP))
        .jitter(jitter)
        .max_attempts(1_000_000)
        .budget(LONGEST)
        .build()
        .unwrap_or_else(|e| panic!("study policy refused: {e:?}"))
}

/// The four jitters of the study, then wary's defaults as shipped.
pub fn contenders() -> Vec<Contender> {
    let mut v: Vec<Contender> = [Jitter::None, Jitter::Equal, Jitter::Full, Jitter::Decorrelated]
        .into_iter()
        .map(|j| Contender { name: j.name(), policy: aws(j) })
        .collect();
    let default =
        Policy::builder(Preset::Default).build().unwrap_or_else(|e| panic!("default refused: {e:?}"));
    v.push(Contender { name: "wary default", policy: default });
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_fixes_the_run_and_another_seed_changes_it() {
        let p = aws(Jitter::Full);
        let a = run(&p, None, &World::contended(300, 7));
        assert_eq!(a, run(&p, None, &World::contended(300, 7)));
        assert_ne!(a, run(&p, None, &World::contended(300, 8)));
        assert_eq!(a.succeeded, 300);
    }

    #[test]
    fn without_jitter_the_herd_peaks_at_least_as_high() {
        let w = World::contended(1000, 1);
        let none = run(&aws(Jitter::None), None, &w);
        for j in [Jitter::Equal, Jitter::Full, Jitter::Decorrelated] {
            let jittered = run(&aws(j), None, &w);
            assert!(none.peak_per_tick >= jittered.peak_per_tick, "{j:?}: {none:?} vs {jittered:?}");
            assert_eq!(jittered.succeeded, 1000);
        }
    }

    #[test]
    fn full_jitter_needs_fewer_calls_than_none_under_contention() {
        let w = World::contended(500, 3);
        let none = run(&aws(Jitter::None), None, &w);
        let full = run(&aws(Jitter::Full), None, &w);
        assert!(full.calls < none.calls, "{full:?} vs {none:?}");
    }

    #[test]
    fn the_fleet_budget_bounds_amplification_in_a_total_outage() {
        let n = 1000u32;
        let w = World::outage(n, 60_000, 5);
        let f = FleetSpec::A6;
        // Every call fails, so no token comes back: beyond each client's first attempt, only the
        // bucket's retries above half its start are allowed.
        let bound =
            f64::from(n) * (1.0 + f64::from(f.ratio_milli) / 1000.0) + f64::from(f.max_tokens / 2 + 1);
        for c in contenders() {
            let without = run(&c.policy, None, &w);
            let with = run(&c.policy, Some(f), &w);
            assert!((with.calls as f64) <= bound, "{}: {with:?}", c.name);
            assert!(with.calls < without.calls, "{}", c.name);
            assert_eq!(with.succeeded, 0);
        }
    }

    #[test]
    fn a_bucket_per_client_bounds_each_client_in_an_outage() {
        let n = 300u32;
        let w = World::outage(n, 60_000, 5);
        let f = FleetSpec::A6_PER_CLIENT;
        // Each client's own bucket allows its first attempt and the retries while it stays above
        // half: tokens/2 − 1 of them with no success to refill it.
        let per_client = 1 + u64::from(f.max_tokens / 2 - 1);
        for c in contenders() {
            let with = run(&c.policy, Some(f), &w);
            assert!(with.calls <= u64::from(n) * per_client, "{}: {with:?}", c.name);
            let shared = run(&c.policy, Some(FleetSpec::A6), &w);
            assert!(shared.calls <= with.calls, "{}: one shared bucket stops sooner", c.name);
        }
    }

    #[test]
    fn wary_defaults_stop_by_their_budget_in_an_outage() {
        let p = contenders().pop().unwrap().policy;
        let s = run(&p, None, &World::outage(200, 600_000, 9));
        assert_eq!((s.gave_up, s.unfinished), (200, 0));
        let most = u64::from(p.max_retries().unwrap()) + 1;
        assert!(s.calls <= 200 * most, "{s:?}");
    }
}
