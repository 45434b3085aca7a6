//! The cloud's memory: idempotency store, legacy effects, counters.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use serde::Serialize;
use tokio::time::Instant;

use crate::faults::Faults;

/// How many duplicate keys or reading ids [`Stats`] lists by name.
const DUPLICATE_SAMPLE: usize = 100;
/// How many 1 s windows of load are counted (a day); later requests are still gated, not counted.
pub(crate) const MAX_LOAD_BINS: usize = 86_400;

/// One 1 s window's load, under a capacity or an outage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LoadBin {
    /// Requests in scope that arrived in the window.
    pub arrivals: u64,
    /// Those that passed the outage and the capacity (they may still meet a drawn fault).
    pub accepted: u64,
}

/// What the capacity and the outages say about one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Neither applies: the request goes on to the drawn faults.
    Pass,
    /// Inside a scheduled outage, answered its status (503 when `None`).
    Outage(Option<u16>),
    /// Over the capacity: the `refused`-th refused (from 1) in window number `window`.
    OverCapacity { window: u64, refused: u64 },
}

/// A response as stored for replay.
#[derive(Clone, Debug)]
pub(crate) struct Stored {
    pub status: u16,
    pub body: Bytes,
}

/// One idempotency key's record.
#[derive(Debug, Default)]
pub(crate) struct KeyEntry {
    /// The first result, once an effect was applied.
    pub stored: Option<Stored>,
    /// A request with this key is being handled.
    pub busy: bool,
    pub effects: u64,
    pub replays: u64,
    pub conflicts: u64,
    /// Length of the body that was applied; the bytes themselves are not kept.
    pub body_len: usize,
}

/// Per-key counters, as [`crate::Cloud::key_stats`] reports them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KeyStats {
    /// Times the effect was applied for this key (1 when the store works).
    pub effects: u64,
    /// Requests answered from the store.
    pub replays: u64,
    /// Requests answered 409 because another with this key was in flight.
    pub conflicts: u64,
    /// Length in bytes of the applied body.
    pub body_len: usize,
    /// Id of the first stored result, if any.
    pub id: Option<u64>,
}

/// Duplicate effects: keys or reading ids applied more than once.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Duplicates {
    /// Idempotency keys applied more than once (should stay 0).
    pub keys: u64,
    /// Legacy reading ids applied more than once.
    pub reading_ids: u64,
    /// Up to 100 of the duplicated keys, sorted.
    pub key_sample: Vec<String>,
    /// Up to 100 of the duplicated reading ids, sorted.
    pub reading_id_sample: Vec<String>,
}

/// A snapshot of the cloud's counters; also served as JSON on `GET /stats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Stats {
    /// Requests received (those that reached a handler).
    pub requests: u64,
    /// Effects applied on both write endpoints.
    pub effects_total: u64,
    /// Effects applied on `POST /readings`.
    pub keyed_effects: u64,
    /// Effects applied on `POST /legacy/readings`.
    pub legacy_effects: u64,
    /// Legacy effects whose request carried no `X-Reading-Id`.
    pub legacy_unlabelled: u64,
    /// Distinct idempotency keys seen with a non-faulted request.
    pub keys: u64,
    /// Number of keys by how many effects each got: `{"1": 40, "0": 2}`.
    pub effects_per_key: BTreeMap<String, u64>,
    /// Requests answered from the idempotency store.
    pub replays: u64,
    /// Requests answered 409 because their key was in flight.
    pub conflicts: u64,
    /// Keys or reading ids applied more than once.
    pub duplicates: Duplicates,
    /// Responses by status code; requests that got no well-formed reply are counted as
    /// `"dropped"` (closed without a reply byte), `"reset"` (RST), `"truncated"` (EOF inside
    /// the header block) or `"garbage"` (no HTTP status line).
    pub requests_by_status: BTreeMap<String, u64>,
    /// Faults injected, by name; `"refuse"` counts refusal windows.
    pub faults_injected: BTreeMap<String, u64>,
    /// Requests to `POST /readings/batch` that were read as a batch.
    pub batches: u64,
    /// Items in those batches.
    pub batch_items: u64,
    /// Under a capacity or an outage: arrivals and accepted requests in each 1 s window since the
    /// script was put in force (up to a day of them); empty otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub load: Vec<LoadBin>,
}

/// Everything a scenario checks at the end of a run, as `wary-cloud` prints it on shutdown and
/// `GET /report` serves it: `report["cloud"]` is [`Stats`], `report["keys"][key]["effects"]`
/// one key's effect count.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Report {
    /// The counters, as `GET /stats` serves them.
    pub cloud: Stats,
    /// Every idempotency key seen, with its counters.
    pub keys: BTreeMap<String, KeyStats>,
    /// Every legacy reading id applied, with its effect count.
    pub readings: BTreeMap<String, u64>,
    /// The fault script in force, in compact form.
    pub faults: String,
}

/// What the store says about a keyed request.
pub(crate) enum Claim {
    /// Another request with the key is in flight.
    Busy,
    /// Already applied: answer with this.
    Replay(Stored),
    /// Not applied yet; the key is now marked busy.
    Fresh,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    pub requests: u64,
    next_id: u64,
    keyed_effects: u64,
    legacy_effects: u64,
    legacy_unlabelled: u64,
    pub keys: HashMap<String, KeyEntry>,
    /// Legacy effects per reading id.
    pub readings: HashMap<String, u64>,
    replays: u64,
    conflicts: u64,
    by_status: BTreeMap<String, u64>,
    faults_injected: BTreeMap<String, u64>,
    /// Requests seen per fault stream, for the per-request fault choice.
    ordinals: HashMap<String, u64>,
    /// Requests seen on endpoints in the fault script's scope since it was put in force, for
    /// refusal windows.
    scoped: u64,
    pub batches: u64,
    pub batch_items: u64,
    /// When the fault script in force was put in force.
    epoch: Option<Instant>,
    /// The capacity's window: its number, requests accepted and refused in it.
    window: (u64, u64, u64),
    load: Vec<LoadBin>,
    /// Under a script with poisons: each key seen on `POST /readings` since it was put in force,
    /// numbered from 1 in the order first seen.
    key_numbers: HashMap<String, u64>,
}

impl State {
    /// The ordinal of this request on `stream`, counting from 0.
    pub fn next_ordinal(&mut self, stream: &str) -> u64 {
        let n = self.ordinals.entry(stream.to_owned()).or_default();
        let ordinal = *n;
        *n += 1;
        ordinal
    }

    /// Numbers requests from 1 again, for a new fault script.
    /// Also starts the clock of the capacity's windows and outages again, and the load count.
    pub fn restart_scoped(&mut self) {
        self.scoped = 0;
        self.epoch = Some(Instant::now());
        self.window = (0, 0, 0);
        self.load.clear();
        self.key_numbers.clear();
    }

    /// The number of `key` among the distinct keys seen on `POST /readings` since the script was
    /// put in force, from 1: a new key takes the next number, a key seen before keeps its own.
    pub fn key_number(&mut self, key: &str) -> u64 {
        let next = u64::try_from(self.key_numbers.len()).unwrap_or(u64::MAX).saturating_add(1);
        *self.key_numbers.entry(key.to_owned()).or_insert(next)
    }

    /// Applies `faults`' outages and capacity to a request in scope arriving now, and counts it
    /// in its 1 s window when the script has either.
    pub fn gate(&mut self, faults: &Faults) -> Gate {
        if !faults.counts_load() {
            return Gate::Pass;
        }
        let epoch = *self.epoch.get_or_insert_with(Instant::now);
        let elapsed = Instant::now().saturating_duration_since(epoch);
        let elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        let second = elapsed.as_secs();
        let gate = if let Some(outage) = faults.outages.iter().find(|o| o.covers(elapsed_ms)) {
            Gate::Outage(outage.status)
        } else if let Some(capacity) = &faults.capacity {
            if self.window.0 != second {
                self.window = (second, 0, 0);
            }
            if self.window.1 < capacity.per_second {
                self.window.1 += 1;
                Gate::Pass
            } else {
                self.window.2 += 1;
                Gate::OverCapacity { window: second, refused: self.window.2 }
            }
        } else {
            Gate::Pass
        };
        if let Ok(index) = usize::try_from(second)
            && index < MAX_LOAD_BINS
        {
            if self.load.len() <= index {
                self.load.resize(index + 1, LoadBin::default());
            }
            if let Some(bin) = self.load.get_mut(index) {
                bin.arrivals += 1;
                if gate == Gate::Pass {
                    bin.accepted += 1;
                }
            }
        }
        gate
    }

    /// The number of this request among those on endpoints in scope, counting from 1.
    pub fn next_scoped(&mut self) -> u64 {
        self.scoped = self.scoped.saturating_add(1);
        self.scoped
    }

    pub fn count_fault(&mut self, name: &str) {
        *self.faults_injected.entry(name.to_owned()).or_default() += 1;
    }

    /// Counts a reply by its status code, or by what broke it (`"dropped"`, `"reset"`, …).
    pub fn count_reply(&mut self, label: &str) {
        *self.by_status.entry(label.to_owned()).or_default() += 1;
    }

    pub fn claim(&mut self, key: &str) -> Claim {
        let entry = self.keys.entry(key.to_owned()).or_default();
        if entry.busy {
            entry.conflicts += 1;
            self.conflicts += 1;
            return Claim::Busy;
        }
        if let Some(stored) = &entry.stored {
            entry.replays += 1;
            self.replays += 1;
            return Claim::Replay(stored.clone());
        }
        entry.busy = true;
        Claim::Fresh
    }

    pub fn release(&mut self, key: &str) {
        if let Some(entry) = self.keys.get_mut(key) {
            entry.busy = false;
        }
    }

    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Applies a keyed effect and stores its result for replay.
    pub fn apply_keyed(&mut self, key: &str, body_len: usize) -> Stored {
        let id = self.next_id();
        self.keyed_effects += 1;
        let stored = Stored { status: 201, body: id_body(id) };
        let entry = self.keys.entry(key.to_owned()).or_default();
        entry.effects += 1;
        entry.body_len = body_len;
        // Only the first result is kept; a second effect would be a bug, and is counted.
        if entry.stored.is_none() {
            entry.stored = Some(stored.clone());
        }
        stored
    }

    /// Applies a legacy effect: every call does the work again.
    pub fn apply_legacy(&mut self, reading_id: Option<&str>) -> Stored {
        let id = self.next_id();
        self.legacy_effects += 1;
        match reading_id {
            Some(rid) => *self.readings.entry(rid.to_owned()).or_default() += 1,
            None => self.legacy_unlabelled += 1,
        }
        Stored { status: 201, body: id_body(id) }
    }

    pub fn key_stats(&self, key: &str) -> Option<KeyStats> {
        self.keys.get(key).map(key_stats)
    }

    pub fn report(&self, faults: String) -> Report {
        Report {
            cloud: self.stats(),
            keys: self.keys.iter().map(|(k, e)| (k.clone(), key_stats(e))).collect(),
            readings: self.readings.iter().map(|(r, n)| (r.clone(), *n)).collect(),
            faults,
        }
    }

    pub fn stats(&self) -> Stats {
        let mut effects_per_key = BTreeMap::new();
        let mut dup_keys: Vec<&String> = Vec::new();
        for (key, entry) in &self.keys {
            *effects_per_key.entry(entry.effects.to_string()).or_default() += 1;
            if entry.effects > 1 {
                dup_keys.push(key);
            }
        }
        let mut dup_readings: Vec<&String> =
            self.readings.iter().filter(|(_, n)| **n > 1).map(|(rid, _)| rid).collect();
        dup_keys.sort();
        dup_readings.sort();
        let sample = |v: &[&String]| v.iter().take(DUPLICATE_SAMPLE).map(|s| (*s).clone()).collect();
        Stats {
            requests: self.requests,
            effects_total: self.keyed_effects + self.legacy_effects,
            keyed_effects: self.keyed_effects,
            legacy_effects: self.legacy_effects,
            legacy_unlabelled: self.legacy_unlabelled,
            keys: self.keys.len() as u64,
            effects_per_key,
            replays: self.replays,
            conflicts: self.conflicts,
            duplicates: Duplicates {
                keys: dup_keys.len() as u64,
                reading_ids: dup_readings.len() as u64,
                key_sample: sample(&dup_keys),
                reading_id_sample: sample(&dup_readings),
            },
            requests_by_status: self.by_status.clone(),
            faults_injected: self.faults_injected.clone(),
            batches: self.batches,
            batch_items: self.batch_items,
            load: self.load.clone(),
        }
    }
}

fn key_stats(e: &KeyEntry) -> KeyStats {
    KeyStats {
        effects: e.effects,
        replays: e.replays,
        conflicts: e.conflicts,
        body_len: e.body_len,
        id: e
            .stored
            .as_ref()
            .and_then(|s| serde_json::from_slice::<serde_json::Value>(&s.body).ok())
            .and_then(|v| v["id"].as_u64()),
    }
}

fn id_body(id: u64) -> Bytes {
    Bytes::from(format!("{{\"id\":{id}}}"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::faults::{CapacityRetryAfter, RetryAfter};

    fn gates(state: &mut State, faults: &Faults, n: usize) -> Vec<Gate> {
        (0..n).map(|_| state.gate(faults)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn capacity_and_outage_follow_the_clock_and_are_counted_per_second() {
        let faults: Faults = "capacity=3,outage=2000:ms=1000".parse().unwrap();
        let mut state = State::default();
        state.restart_scoped();
        let pass = Gate::Pass;
        assert_eq!(
            gates(&mut state, &faults, 5),
            [
                pass,
                pass,
                pass,
                Gate::OverCapacity { window: 0, refused: 1 },
                Gate::OverCapacity { window: 0, refused: 2 }
            ]
        );
        // A new window accepts `per_second` again.
        tokio::time::advance(Duration::from_millis(1000)).await;
        assert_eq!(
            gates(&mut state, &faults, 4),
            [pass, pass, pass, Gate::OverCapacity { window: 1, refused: 1 }]
        );
        // Inside the outage everything is refused, capacity or not.
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert_eq!(gates(&mut state, &faults, 2), [Gate::Outage(None), Gate::Outage(None)]);
        // It ends after its `ms`.
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(gates(&mut state, &faults, 1), [pass]);
        let load: Vec<(u64, u64)> = state.stats().load.iter().map(|b| (b.arrivals, b.accepted)).collect();
        assert_eq!(load, [(5, 3), (4, 3), (2, 0), (1, 1)]);
        // A new script starts the clock and the count again.
        state.restart_scoped();
        assert_eq!(gates(&mut state, &faults, 1), [pass]);
        assert_eq!(state.stats().load, [LoadBin { arrivals: 1, accepted: 1 }]);
    }

    #[test]
    fn without_capacity_or_outage_nothing_is_gated_or_counted() {
        let faults: Faults = "503=0.5,refuse_at=3".parse().unwrap();
        let mut state = State::default();
        state.restart_scoped();
        assert!(gates(&mut state, &faults, 10).iter().all(|g| *g == Gate::Pass));
        assert!(state.stats().load.is_empty());
        let json = serde_json::to_value(state.stats()).unwrap();
        assert!(json.get("load").is_none(), "{json}");
    }

    #[test]
    fn spread_retry_after_covers_the_seconds_the_excess_needs() {
        let faults: Faults = "capacity=10:ra=spread,seed=5".parse().unwrap();
        let capacity = faults.capacity.unwrap();
        assert_eq!(capacity.retry_after, Some(CapacityRetryAfter::Spread));
        let secs = |refused: u64| match capacity.retry_after(&faults, 3, refused) {
            Some(RetryAfter::Seconds(s)) => s,
            other => panic!("{other:?}"),
        };
        // The first ten refused fit in the next second.
        assert!((1..=10).all(|r| secs(r) == 1));
        // The 200th refused may be sent up to 20 s out, and the draws use that span.
        let late: Vec<u64> = (191..=200).chain(1000..1100).map(secs).collect();
        assert!(late.iter().all(|s| (1..=110).contains(s)), "{late:?}");
        assert!((191..=200).map(secs).all(|s| s <= 20));
        assert!(late.iter().any(|s| *s > 10), "{late:?}");
        // A fixed value is sent as is; none without `ra`.
        let fixed: Faults = "capacity=10:ra=4".parse().unwrap();
        assert_eq!(fixed.capacity.unwrap().retry_after(&fixed, 0, 7), Some(RetryAfter::Seconds(4)));
        let bare: Faults = "capacity=10".parse().unwrap();
        assert_eq!(bare.capacity.unwrap().retry_after(&bare, 0, 7), None);
    }
}
