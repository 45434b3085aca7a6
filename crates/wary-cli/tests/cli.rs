//! The `wary` binary end to end: plan, explain, replay and stats, as a user runs them.

#![allow(missing_docs)]

use std::cell::Cell;
use std::io::Write;
use std::process::{Command, Output, Stdio};

use embassy_futures::block_on;
use embedded_hal_async::delay::DelayNs;
use wary::{
    Breaker, BreakerSettings, Duration, Failure, FleetBudget, Guards, Instant, Key, Operation, Outcome, Pace,
    PaceSettings, Policy, Preset, Rule, Runner, Table,
};
use wary_host::ledger::{JsonLedger, Line};
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
    assert_eq!(v["min_waits_ms"], serde_json::json!([1, 2, 4, 8, 16, 30, 30]));
    assert_eq!(v["max_waits_ms"], serde_json::json!([1, 3, 7, 15, 31, 59, 59]));
    assert_eq!(v["longest_wait_ms"], 120);
    // The flags that name their unit are the same flags; the tick rate of milliseconds still
    // means what it meant.
    let named = wary(&["explain", "--base-ms", "2", "--cap-ms", "60", "--budget-ms", "120", "--json"], "");
    assert_eq!(stdout(&named), stdout(&out));
    let ticks = wary(
        &["explain", "--tick-hz", "1000", "--base", "2", "--cap", "60", "--budget", "120", "--json"],
        "",
    );
    assert_eq!(stdout(&ticks), stdout(&out));
    // Any other tick rate is refused, with the flags to use instead.
    let out = wary(&["explain", "--tick-hz", "1", "--base", "2"], "");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("milliseconds") && err.contains("--base-ms"), "{err}");
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
    assert!(text.contains("policy: base 100 ms, cap 400 ms, budget 300 ms"), "{text}");
    assert!(text.contains("retries stop fleet-wide after 5 failed attempts"), "{text}");
    let out = wary(&["explain", "--fleet-tokens", "10", "--fleet-ratio", "0"], "");
    assert_eq!(out.status.code(), Some(2), "a bad fleet budget is refused");
    assert!(text.contains("503"), "{text}");
    let out =
        wary(&["explain", "--base", "1", "--cap", "100", "--budget", "50", "--known-retry-after", "1"], "");
    let text = stdout(&out);
    assert!(text.contains("warning: base 1 ms is so small"), "{text}");
    assert!(text.contains("warning: cap 100 ms is above the budget 50 ms"), "{text}");
    assert!(text.contains("shorter than the Retry-After of 1 s"), "{text}");
    let out = wary(&["explain", "--known-retry-after-s", "1", "--budget-ms", "999"], "");
    assert!(stdout(&out).contains("warning: budget 999 ms is shorter than the Retry-After of 1 s"));
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
    // A duration past what wary counts: refused, with the limit.
    let out = wary(&["explain", "--budget-ms", "4294967295"], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("at most 4294967294 ms"));
}

#[derive(Default)]
struct FakeClock(Cell<u64>);

impl FakeClock {
    fn now(&self) -> Instant {
        Instant::from_millis(self.0.get())
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
fn write_ledger_under(policy: &Policy) -> String {
    let clock = FakeClock::default();
    let fleet = FleetBudget::new(10, 100).unwrap();
    let mut ledger = JsonLedger::new(Vec::new());
    ledger.policy(policy).unwrap();
    let scripts: [&[Outcome]; 5] = [
        &[Outcome::Ok],
        &[Outcome::status(503), Outcome::status_after(429, Duration::from_secs(2)), Outcome::Ok],
        &[Failure::ResponseTimeout.into(), Failure::Reset.into(), Outcome::status(502), Outcome::Ok],
        &[Outcome::status(400)],
        &[Outcome::status(503); 40],
    ];
    for (i, script) in scripts.iter().enumerate() {
        let mut runner = Runner::new(policy, Sleep(&clock), || clock.now(), Lcg(i as u64 + 1))
            .fleet(&fleet)
            .ledger(&mut ledger);
        let key = Key::from_parts(7, 1, i as u32);
        let _ = block_on(runner.call(Operation::KeyedWrite, key, |a| {
            clock.0.set(clock.0.get() + 40);
            let o = script.get(a.number as usize - 1).copied().unwrap_or(Outcome::Ok);
            core::future::ready(o.into_result())
        }));
    }
    String::from_utf8(ledger.into_inner()).unwrap()
}

fn write_ledger() -> String {
    let spec = PolicySpec { preset: Some("default".into()), deadline: Some(20_000), ..PolicySpec::default() };
    write_ledger_under(&spec.build().unwrap())
}

fn replay_text(name: &str, text: &str) -> (Output, String) {
    let dir = std::env::temp_dir().join(format!("wary-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    let out = wary(&["replay", path.to_str().unwrap()], "");
    let report = stdout(&out);
    (out, report)
}

/// Runs calls through the real runner with a pace and a breaker on (owned by the test, shared
/// by every call, as the uplink's task owns them) into a JSON-lines ledger.
fn write_paced_ledger() -> String {
    let spec = PolicySpec { preset: Some("default".into()), deadline: Some(20_000), ..PolicySpec::default() };
    let policy = spec.build().unwrap();
    let clock = FakeClock::default();
    let mut ledger = JsonLedger::new(Vec::new());
    ledger.policy(&policy).unwrap();
    let mut pace = Pace::new(PaceSettings {
        start_milli: 400,
        floor_milli: 25,
        ceiling_milli: 20_000,
        keep_percent: 50,
        regrow: Duration::from_secs(10),
        burst: 2,
        tolerate_percent: 0,
    })
    .unwrap();
    let mut breaker = Breaker::new(BreakerSettings {
        threshold: 2,
        open: Duration::from_secs(3),
        max_open: Duration::from_secs(20),
        refused_opens: false,
    })
    .unwrap();
    let refused = Outcome::Failure(Failure::Refused);
    let scripts: [&[Outcome]; 6] = [
        &[Outcome::status(503), Outcome::status(503), Outcome::Ok],
        &[Outcome::Ok],
        &[Outcome::status(503); 40],
        &[refused, refused, refused, Outcome::Ok],
        &[Outcome::status(429), Outcome::Ok],
        &[refused, Outcome::Ok],
    ];
    for i in 0..36u32 {
        let script = scripts[i as usize % scripts.len()];
        let mut runner = Runner::new(&policy, Sleep(&clock), || clock.now(), Lcg(u64::from(i) + 1))
            .ledger(&mut ledger)
            .endpoint(Guards::new(&mut pace, &mut breaker));
        let key = Key::from_parts(7, 2, i);
        let _ = block_on(runner.call(Operation::KeyedWrite, key, |a| {
            clock.0.set(clock.0.get() + 40);
            let o = script.get(a.number as usize - 1).copied().unwrap_or(Outcome::Ok);
            core::future::ready(o.into_result())
        }));
        // The time between readings.
        clock.0.set(clock.0.get() + 5_000);
    }
    String::from_utf8(ledger.into_inner()).unwrap()
}

/// With the pace and the breaker on, every decision they changed replays: the pace waits
/// charged to the budget, the retries they refused (the breaker open, a pace wait the budget
/// could not pay). A pace wait edited on one line is reported at that line's attempt, and a
/// version 3 line is refused with the reason.
#[test]
fn an_ask_holding_an_open_pace_replays() {
    // An open pace asked to wait 2 s by a 429 (a call of one attempt) holds the next call's
    // first attempt for what is left of the ask, with no rate in force: the ledger says so and
    // replay agrees.
    let spec = PolicySpec { preset: Some("default".into()), max_attempts: Some(1), ..PolicySpec::default() };
    let policy = spec.build().unwrap();
    let clock = FakeClock::default();
    let mut ledger = JsonLedger::new(Vec::new());
    ledger.policy(&policy).unwrap();
    let mut pace = Pace::new(PaceSettings::DEVICE).unwrap();
    let scripts: [&[Outcome]; 2] =
        [&[Outcome::status_after(429, Duration::from_secs(2)), Outcome::Ok], &[Outcome::Ok]];
    for (i, script) in scripts.iter().enumerate() {
        let mut runner = Runner::new(&policy, Sleep(&clock), || clock.now(), Lcg(1))
            .ledger(&mut ledger)
            .endpoint(Guards { pace: Some(&mut pace), breaker: None });
        let key = Key::from_parts(7, 3, u32::try_from(i).unwrap());
        let _ = block_on(runner.call(Operation::KeyedWrite, key, |a| {
            clock.0.set(clock.0.get() + 40);
            core::future::ready(
                script.get(a.number as usize - 1).copied().unwrap_or(Outcome::Ok).into_result(),
            )
        }));
    }
    assert!(pace.is_open());
    let text = String::from_utf8(ledger.into_inner()).unwrap();
    let attempts: Vec<serde_json::Value> =
        text.lines().skip(1).map(|l| serde_json::from_str(l).unwrap()).collect();
    let held: Vec<u64> = attempts
        .iter()
        .filter(|a| a["admitted"]["rate_milli"] == 0)
        .filter_map(|a| a["admitted"]["wait_ms"].as_u64())
        .collect();
    // The first call's attempt went at once; the second call, asked the instant the 429 came,
    // waited the whole ask.
    assert_eq!(held, [0, 2_000], "{text}");
    let (out, report) = replay_text("asked-open.jsonl", &text);
    assert!(out.status.success(), "{report}");
    assert!(report.contains(": 0 divergences, 0 unreadable lines"), "{report}");
}

#[test]
fn a_paced_ledger_replays_and_an_edited_pace_wait_is_reported() {
    let text = write_paced_ledger();
    let attempts: Vec<serde_json::Value> =
        text.lines().skip(1).map(|l| serde_json::from_str(l).unwrap()).collect();
    let paced = |a: &&serde_json::Value| a["admitted"]["wait_ms"].as_u64().is_some_and(|w| w > 0);
    let waited = attempts.iter().filter(paced).count();
    let reason = |a: &serde_json::Value| a["reason"].as_str().unwrap_or("").to_owned();
    let refused: Vec<String> = attempts.iter().filter(|a| a.get("refused").is_some()).map(reason).collect();
    assert!(waited >= 5, "{waited} attempts waited for the pace:\n{text}");
    assert!(refused.iter().any(|r| r == "circuit_open"), "{refused:?}");
    assert!(refused.iter().any(|r| r == "budget" || r == "deadline"), "{refused:?}");
    let (out, report) = replay_text("paced.jsonl", &text);
    assert!(out.status.success(), "{report}");
    assert!(report.contains(": 0 divergences, 0 unreadable lines"), "{report}");

    // Without the charged pace waits the policy alone would decide otherwise: a replay that
    // ignored them would not agree with this ledger (the check has something to find).
    let plain: Vec<String> = text
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            if let Some(o) = v.as_object_mut() {
                o.remove("admitted");
                o.remove("refused");
            }
            v.to_string()
        })
        .collect();
    let (out, report) = replay_text("paced-stripped.jsonl", &plain.join("\n"));
    assert_eq!(out.status.code(), Some(1), "{report}");

    // One pace wait edited by a millisecond.
    let target = attempts.iter().position(|a| paced(&a)).unwrap();
    let key = attempts[target]["key"].as_str().unwrap().to_owned();
    let number = attempts[target]["attempt"].as_u64().unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let mut v = attempts[target].clone();
    let w = v["admitted"]["wait_ms"].as_u64().unwrap();
    v["admitted"]["wait_ms"] = (w + 1).into();
    lines[target + 1] = v.to_string();
    let (out, report) = replay_text("paced-edited.jsonl", &lines.join("\n"));
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(report.contains(&format!("divergence: call {key} attempt {number}:")), "{report}");
    assert!(report.contains(&format!("a pace wait of {} ms", w + 1)), "{report}");
    assert!(report.contains(": 1 divergences"), "{report}");

    // The same line in version 3: refused, saying why.
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    lines[target + 1] = lines[target + 1].replace("\"v\":4", "\"v\":3");
    let (out, report) = replay_text("paced-v3.jsonl", &lines.join("\n"));
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        report.contains(&format!(
            "line {}: unreadable: ledger line version 3 (no record of the pace and the breaker), this wary reads version 4",
            target + 2
        )),
        "{report}"
    );
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

/// A policy line edited by hand from one preset's settings to another's, its fingerprint
/// changed with them, is a policy like any other: the records made under that policy replay
/// with no divergence.
#[test]
fn a_policy_line_edited_consistently_to_another_preset_replays() {
    let basic = Policy::builder(Preset::Basic)
        .base(Duration::from_millis(200))
        .cap(Duration::from_secs(5))
        .budget(Duration::from_secs(20))
        .deadline(Duration::from_secs(20))
        .build()
        .unwrap();
    let text = write_ledger_under(&basic);
    let default = Policy::builder(Preset::Default).build().unwrap();
    // The default preset's line, edited into the basic policy's settings and fingerprint, as a
    // person would edit the file.
    let mut edited: serde_json::Value = serde_json::from_str(&Line::Policy(default).to_json()).unwrap();
    let settings = serde_json::to_value(basic).unwrap();
    assert_ne!(edited["policy"], settings);
    for (field, value) in settings.as_object().unwrap() {
        edited["policy"][field] = value.clone();
    }
    edited["fingerprint"] = format!("{:08x}", basic.fingerprint()).into();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    assert!(lines[0].starts_with("{\"type\":\"policy\""), "{}", lines[0]);
    lines[0] = edited.to_string();
    let (out, report) = replay_text("edited.jsonl", &lines.join("\n"));
    assert!(out.status.success(), "{report}");
    assert!(
        report.contains("replayed 5 calls") && report.contains(": 0 divergences, 0 unreadable"),
        "{report}"
    );

    // Settings edited without their fingerprint: the line is refused, clearly, and the records
    // it should have described diverge.
    let mut stale = edited.clone();
    stale["fingerprint"] = format!("{:08x}", default.fingerprint()).into();
    lines[0] = stale.to_string();
    let (out, report) = replay_text("stale.jsonl", &lines.join("\n"));
    assert_eq!(out.status.code(), Some(1), "{report}");
    let err = String::from_utf8_lossy(&out.stderr);
    let why = format!(
        "policy line fingerprint {:08x}, but its policy's is {:08x}",
        default.fingerprint(),
        basic.fingerprint()
    );
    assert!(err.contains("line 1") && err.contains(&why), "{err}");
    assert!(report.contains("no policy line for fingerprint"), "{report}");
}

/// Records made under a policy with a 409 rule, and a policy line without it: the line's own
/// settings give its own fingerprint, not the records', so no decision can be checked against
/// it, and every call says so.
#[test]
fn a_status_rule_left_out_of_the_policy_line_is_a_divergence() {
    let with_409 = Policy::builder(Preset::Default)
        .table(Table::DEFAULT.with_status(409, Rule::RetryAny).unwrap())
        .deadline(Duration::from_secs(20))
        .build()
        .unwrap();
    let text = write_ledger_under(&with_409);
    let (out, report) = replay_text("with-409.jsonl", &text);
    assert!(out.status.success() && report.contains(": 0 divergences"), "{report}");
    let without = with_409.to_builder().table(Table::DEFAULT).build().unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    lines[0] = Line::Policy(without).to_json();
    let (out, report) = replay_text("without-409.jsonl", &lines.join("\n"));
    assert_eq!(out.status.code(), Some(1), "{report}");
    let missing = format!("the core decides no policy line for fingerprint {:08x}", with_409.fingerprint());
    assert_eq!(report.matches(&missing).count(), 5, "{report}");
    assert!(report.contains(": 5 divergences, 0 unreadable lines"), "{report}");
}

/// A ledger with no policy line at all: every call is a divergence that names the fingerprint.
#[test]
fn a_missing_policy_line_is_a_divergence() {
    let text = write_ledger();
    let fp = PolicySpec { preset: Some("default".into()), deadline: Some(20_000), ..PolicySpec::default() }
        .build()
        .unwrap()
        .fingerprint();
    let attempts: Vec<&str> = text.lines().skip(1).collect();
    let (out, report) = replay_text("no-policy.jsonl", &attempts.join("\n"));
    assert_eq!(out.status.code(), Some(1), "{report}");
    let line = format!("the core decides no policy line for fingerprint {fp:08x}");
    assert!(
        report.contains("divergence: call 00000000000000070000000100000000 attempt 1: ledger says ok"),
        "{report}"
    );
    assert_eq!(report.matches(&line).count(), 5, "{report}");
}

/// An uplink run's device lines as `defmt-print` shows them (`tests/data/uplink-defmt.log`) convert
/// to JSON lines and replay on the host with no divergence: the fingerprint and every decision
/// agree across targets. The log is the Cortex-M4's under QEMU, the `storm` scenario of
/// `cargo xtask qemu`, captured in ledger version 2 and carried to version 3 line by line: the
/// tag, and each key re-laid as device `574152590a386001` (the old 32-bit id in its low half),
/// the same boot, the same sequence (every one fitted 32 bits). Then carried to version 4: the
/// tag, and `- -` appended (the firmware of the capture had no pace and no breaker, so neither
/// said anything). Nothing else changed, so its decisions still replay;
/// `uplink-defmt-v3-carried.log` is a capture made in version 3, carried to version 4 the same way.
#[test]
fn a_device_ledger_from_defmt_replays_on_the_host() {
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");
    let log = std::fs::read_to_string(format!("{data}/uplink-defmt.log")).unwrap();
    let out = wary(&["ledger", "from-defmt", "--policy", &format!("{data}/uplink-policy.toml")], &log);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "fingerprints disagree: {}", String::from_utf8_lossy(&out.stderr));
    let jsonl = stdout(&out);
    let attempts = log.lines().filter(|l| l.contains(wary::ledger::DEVICE_TAG)).count();
    // Every key is the QEMU device's: its whole 64-bit id in the first 16 hex digits.
    for line in log.lines().filter(|l| l.contains(wary::ledger::DEVICE_TAG)) {
        let record = wary::ledger::parse_device_line(line).unwrap();
        assert_eq!(record.key.device_part(), 0x5741_5259_0a38_6001, "{line}");
        assert_eq!(record.key.boot_part(), 1, "{line}");
    }
    assert!(attempts > 40, "{attempts} device lines");
    assert_eq!(jsonl.lines().count(), attempts + 1, "one policy line, then one line per attempt");
    let (out, report) = replay_text("device.jsonl", &jsonl);
    assert!(out.status.success(), "{report}");
    assert!(report.contains(": 0 divergences, 0 unreadable lines"), "{report}");
    // Under another policy the same lines are reported, not silently accepted.
    let dir = std::env::temp_dir().join(format!("wary-defmt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let other = dir.join("other.toml");
    std::fs::write(&other, "preset = \"default\"\nbase = 100\ncap = 2000\nbudget = 9000\nmax_attempts = 6\n")
        .unwrap();
    let out = wary(&["ledger", "from-defmt", "--policy", other.to_str().unwrap()], &log);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not the one given"));
}

/// A version 3 capture from the device (`tests/data/uplink-defmt-v3-carried.log`: the `storm`
/// scenario of `cargo xtask qemu`, the firmware given `device=574152590a386001` and a
/// credential, with no pace or breaker; carried to version 4 by its tag and `- -`): every line converts and replays with no divergence, every key carries the whole
/// device id, and the policy's fingerprint is the one the version 2 capture carried (version 3
/// changed the keys, not the settings' encoding).
#[test]
fn a_version_3_device_capture_replays_and_its_keys_carry_the_whole_device_id() {
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");
    let log = std::fs::read_to_string(format!("{data}/uplink-defmt-v3-carried.log")).unwrap();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(wary::ledger::DEVICE_TAG)).collect();
    assert!(lines.len() > 20, "{} device lines", lines.len());
    for line in &lines {
        let record = wary::ledger::parse_device_line(line).unwrap();
        assert_eq!(record.key.device_part(), 0x5741_5259_0a38_6001, "{line}");
        assert_eq!(record.policy, 2_599_086_968, "{line}");
    }
    assert!(log.contains("credential set"), "the capture is of a device with a credential");
    let out = wary(&["ledger", "from-defmt", "--policy", &format!("{data}/uplink-policy.toml")], &log);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "fingerprints disagree: {}", String::from_utf8_lossy(&out.stderr));
    let jsonl = stdout(&out);
    assert_eq!(jsonl.lines().count(), lines.len() + 1, "one policy line, then one line per attempt");
    let (out, report) = replay_text("device-v3.jsonl", &jsonl);
    assert!(out.status.success(), "{report}");
    assert!(report.contains(": 0 divergences, 0 unreadable lines"), "{report}");
}

/// A device line of the first ledger format is refused by its version, with the line number,
/// and the exit status says so; the lines around it still convert.
#[test]
fn a_device_line_of_another_version_is_refused() {
    let v1 = "3.017 INFO  wary-ledger v1 0a386001a4cf94560000000000000000 1 keyed_write response_timeout 0 -1 retry unit 17852510 50 3005 3005 - - -1 3383049023";
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");
    let log = std::fs::read_to_string(format!("{data}/uplink-defmt.log")).unwrap();
    let first = log.lines().find(|l| l.contains(wary::ledger::DEVICE_TAG)).unwrap();
    let input = format!("{first}\n{v1}\n{first}\n");
    let out = wary(&["ledger", "from-defmt"], &input);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "line 2: ledger line version 1 (times were ticks and seconds), this wary reads version 4"
        ),
        "{err}"
    );
    assert_eq!(stdout(&out).lines().count(), 2, "the v4 lines around it");
    // A line of the second format, whose keys held a 32-bit device id, is refused the same way.
    let v2 = "0.029 INFO  wary-ledger v2 0a386001000000010000000000000000 1 keyed_write ok 0 -1 ok none 0 0 10 10 ok - -1 2599086968 0";
    let out = wary(&["ledger", "from-defmt"], &format!("{first}\n{v2}\n"));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "line 2: ledger line version 2 (keys held a 32-bit device id), this wary reads version 4"
        ),
        "{err}"
    );
}
