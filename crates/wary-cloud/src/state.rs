//! The cloud's memory: idempotency store, legacy effects, counters.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use serde::Serialize;

/// How many duplicate keys or reading ids [`Stats`] lists by name.
const DUPLICATE_SAMPLE: usize = 100;

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
    pub fn restart_scoped(&mut self) {
        self.scoped = 0;
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
