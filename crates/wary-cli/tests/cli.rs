//! The `wary` binary end to end: plan, explain, replay and stats, as a user runs them.

#![allow(missing_docs)]

use std::cell::Cell;
use std::io::Write;
use std::process::{Command, Output, Stdio};

use embassy_futures::block_on;
use embedded_hal_async::delay::DelayNs;
use wary::run::{Clock, Runner};
use wary::{FleetBudget, Key, Operation, Outcome, Preset};
use wary_host::ledger::JsonLedger;
use wary_host::spec::PolicySpec;

fn wary(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_wary"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[test]
fn plan_answers_each_line_and_reports_invalid_ones() {
    let input = [
        r#"{"outcomes":[503,503,503,503,503,503,503,503,503,503],"op":"read","policy":{"base":2,"cap":60,"budget":120},"draws":[99,99,99,99,99,99,99,99,99]}"#,
        r#"{"outcomes":["timeout","ok"],"op":"write","policy":{"base":2,"cap":60,"budget":120},"draws":[50]}"#,
        "this is not json",
        r#"{"outcomes":[[429,30],"ok"],"op":"write","policy":{"base":2,"cap":60,"budget":120},"draws":[0]}"#,
    ]
    .join("\n");
    let out = wary(&["plan"], &input);
    assert_eq!(out.status.code(), Some(1), "an invalid line makes the exit status 1");
    let lines: Vec<String> = stdout(&out).lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 4);
    assert_eq!(lines[0], r#"{"waits":[1,3,7,15,31,59],"verdict":"gave_up"}"#);
    assert_eq!(lines[1], r#"{"waits":[],"verdict":"unknown"}"#);
    assert!(lines[2].starts_with(r#"{"error":"#), "{}", lines[2]);
    assert_eq!(lines[3], r#"{"waits":[30],"verdict":"ok"}"#, "processing continues after an error");
    let all_valid =
        wary(&["plan"], r#"{"outcomes":["ok"],"op":"read","policy":{"base":2,"cap":60,"budget":120}}"#);
    assert_eq!(all_valid.status.code(), Some(0));
}

#[test]
fn explain_json_gives_the_worked_waits() {
    let out = wary(&["explain", "--base", "2", "--cap", "60", "--budget", "120", "--json"], "");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["max_retries"], 7);
    assert_eq!(v["min_waits"], serde_json::json!([1, 2, 4, 8, 16, 30, 30]));
    assert_eq!(v["max_waits"], serde_json::json!([1, 3, 7, 15, 31, 59, 59]));
}

#[test]
fn explain_text_and_toml_and_refusals() {
    let dir = std::env::temp_dir().join(format!("wary-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("policy.toml");
    std::fs::write(&cfg, "preset = \"strict\"\nbudget = 300\n[fleet]\ntokens = 10\nratio_milli = 100\n")
        .unwrap();
    let out = wary(&["explain", "--config", cfg.to_str().unwrap()], "");
    let text = stdout(&out);
    assert!(text.contains("at most 2 retries"), "{text}");
    assert!(text.contains("retries stop fleet-wide after 5 failed attempts"), "{text}");
    let out = wary(&["explain", "--fleet-tokens", "10", "--fleet-ratio", "0"], "");
    assert_eq!(out.status.code(), Some(2), "a bad fleet budget is refused");
    assert!(text.contains("503"), "{text}");
    let out =
        wary(&["explain", "--base", "1", "--cap", "100", "--budget", "50", "--known-retry-after", "1"], "");
    let text = stdout(&out);
    assert!(text.contains("warning: base 1 is so small"), "{text}");
    assert!(text.contains("warning: cap 100 is above the budget 50"), "{text}");
    let out = wary(&["explain", "--jitter", "full"], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("full jitter with no attempt cap"));
    let out = wary(&["explain", "--base", "0"], "");
    assert_eq!(out.status.code(), Some(2));
    // A setting the formula defines but a running call refuses: explain says why.
    let out = wary(&["explain", "--budget", "0"], "");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("why: a budget of 0 allows no wait") && err.contains("wary plan"), "{err}");
    let out = wary(&["explain", "--base", "100", "--cap", "10"], "");
    assert!(String::from_utf8_lossy(&out.stderr).contains("every ceiling is the cap"));
}

#[derive(Default)]
struct FakeClock(Cell<u64>);

impl Clock for FakeClock {
    fn now(&self) -> u64 {
        self.0.get()
    }
}

struct Sleep<'a>(&'a FakeClock);

impl DelayNs for Sleep<'_> {
    async fn delay_ns(&mut self, ns: u32) {
        self.0.0.set(self.0.0.get() + u64::from(ns) / 1_000_000);
    }
}

struct Lcg(u64);

impl rand_core::RngCore for Lcg {
    fn next_u32(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 32) as u32
    }
    fn next_u64(&mut self) -> u64 {
        u64::from(self.next_u32()) << 32 | u64::from(self.next_u32())
    }
    fn fill_bytes(&mut self, dst: &mut [u8]) {
        dst.iter_mut().for_each(|b| *b = self.next_u32() as u8);
    }
}

/// Runs calls through the real runner into a JSON-lines ledger.
fn write_ledger() -> String {
    let spec = PolicySpec { preset: Some("default".into()), deadline: Some(20_000), ..PolicySpec::default() };
    let policy = spec.build().unwrap();
    let clock = FakeClock::default();
    let fleet = FleetBudget::new(10, 100).unwrap();
    let mut ledger = JsonLedger::new(Vec::new());
    ledger.policy(&policy, &PolicySpec::describe(Preset::Default, &policy, &[])).unwrap();
    let scripts: [&[Outcome]; 5] = [
        &[Outcome::Ok],
        &[Outcome::status(503), Outcome::status_after(429, 2), Outcome::Ok],
        &[Outcome::ResponseTimeout, Outcome::Reset, Outcome::status(502), Outcome::Ok],
        &[Outcome::status(400)],
        &[Outcome::status(503); 40],
    ];
    for (i, script) in scripts.iter().enumerate() {
        let mut runner =
            Runner::new(&policy, Sleep(&clock), &clock, Lcg(i as u64 + 1)).fleet(&fleet).ledger(&mut ledger);
        let key = Key::from_parts(7, 1, i as u64);
        let _ = block_on(runner.call(Operation::KeyedWrite, key, |a| {
            clock.0.set(clock.0.get() + 40);
            let o = script.get(a.number as usize - 1).copied().unwrap_or(Outcome::Ok);
            core::future::ready(if o == Outcome::Ok { Ok(()) } else { Err(o) })
        }));
    }
    String::from_utf8(ledger.into_inner()).unwrap()
}

#[test]
fn a_ledger_written_by_the_runner_replays_with_no_divergence() {
    let text = write_ledger();
    assert!(text.lines().count() > 10, "{text}");
    let dir = std::env::temp_dir().join(format!("wary-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ledger.jsonl");
    std::fs::write(&path, &text).unwrap();
    let out = wary(&["replay", path.to_str().unwrap()], "");
    let report = stdout(&out);
    assert!(out.status.success(), "{report}");
    assert!(report.contains("replayed 5 calls") && report.contains(": 0 divergences"), "{report}");

    // An edited draw is reported.
    let edited: Vec<String> = text
        .lines()
        .map(|l| {
            if l.contains("\"attempt\":2") && l.contains("\"unit\":") {
                let at = l.find("\"unit\":").unwrap() + 7;
                let end = at + l[at..].find('}').unwrap();
                format!("{}{}{}", &l[..at], 0, &l[end..])
            } else {
                l.to_owned()
            }
        })
        .collect();
    assert_ne!(edited.join("\n"), text.trim_end());
    std::fs::write(&path, edited.join("\n")).unwrap();
    let out = wary(&["replay", path.to_str().unwrap()], "");
    let report = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(report.contains("divergence: call "), "{report}");

    // Stats over the original ledger.
    std::fs::write(&path, &text).unwrap();
    let out = wary(&["stats", path.to_str().unwrap(), "--json"], "");
    let s: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(s["calls"], 5, "{s}");
    assert_eq!(s["verdicts"]["ok"], 3, "{s}");
    assert_eq!(s["verdicts"]["failed"], 1);
    // The fleet budget (10 tokens) throttles the 503 storm of the last call at once.
    assert_eq!(s["verdicts"]["gave_up (throttled)"], 1, "{s}");
    assert_eq!((s["p50"].as_u64(), s["max"].as_u64()), (Some(1), Some(4)), "{s}");
    assert_eq!(
        s["retry_causes"],
        serde_json::json!({"503": 1, "429": 1, "response_timeout": 1, "reset": 1, "502": 1})
    );
    let out = wary(&["stats", path.to_str().unwrap()], "");
    let text = stdout(&out);
    assert!(text.contains("attempts per call: mean"), "{text}");
    assert!(text.contains("   1 | #"), "{text}");
    assert_eq!(out.status.code(), Some(0), "a clean ledger");

    // Unreadable lines: both commands warn on stderr and exit non-zero, figures or not.
    let mut with_garbage = text_of(&path);
    with_garbage.push_str("this is not a ledger line\n{\"kind\":\"attempt\"}\n");
    std::fs::write(&path, &with_garbage).unwrap();
    for args in [
        vec!["stats", path.to_str().unwrap()],
        vec!["stats", path.to_str().unwrap(), "--json"],
        vec!["replay", path.to_str().unwrap()],
    ] {
        let out = wary(&args, "");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("unreadable"), "{args:?}: {err}");
    }
    let out = wary(&["stats", path.to_str().unwrap(), "--json"], "");
    let s: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!((s["calls"].as_u64(), s["unreadable_lines"].as_u64()), (Some(5), Some(2)), "{s}");
    // A file of nothing but garbage no longer passes for an empty ledger.
    std::fs::write(&path, "garbage\nmore garbage\n").unwrap();
    let out = wary(&["stats", path.to_str().unwrap()], "");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("2 unreadable lines"));
}

fn text_of(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

/// A ledger logged by the uplink firmware on the Cortex-M4 under QEMU (`cargo xtask qemu`, as
/// `defmt-print` shows it) converts to JSON lines and replays on the host with no divergence:
/// the fingerprint and every decision agree across targets.
#[test]
fn a_device_ledger_from_defmt_replays_on_the_host() {
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");
    let log = std::fs::read_to_string(format!("{data}/uplink-defmt.log")).unwrap();
    let out = wary(&["ledger", "from-defmt", "--policy", &format!("{data}/uplink-policy.toml")], &log);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "fingerprints disagree: {}", String::from_utf8_lossy(&out.stderr));
    let jsonl = stdout(&out);
    let attempts = log.lines().filter(|l| l.contains("wary-ledger v1")).count();
    assert_eq!(jsonl.lines().count(), attempts + 1, "one policy line, then one line per attempt");
    let dir = std::env::temp_dir().join(format!("wary-defmt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("device.jsonl");
    std::fs::write(&path, &jsonl).unwrap();
    let out = wary(&["replay", path.to_str().unwrap()], "");
    let report = stdout(&out);
    assert!(out.status.success(), "{report}");
    assert!(report.contains(": 0 divergences"), "{report}");
    // Under another policy the same lines are reported, not silently accepted.
    let other = dir.join("other.toml");
    std::fs::write(&other, "preset = \"default\"\nbase = 100\ncap = 2000\nbudget = 9000\nmax_attempts = 6\n")
        .unwrap();
    let out = wary(&["ledger", "from-defmt", "--policy", other.to_str().unwrap()], &log);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not the one given"));
}
