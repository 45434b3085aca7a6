//! The crash-loop scenario: the uplink firmware under QEMU resets (`SYSRESETREQ`) as soon as
//! each of its first eight boots has the answer to its first exchange, against a calm test
//! cloud; the ninth boot delivers what is left. A boot that resets that early is unhealthy, so
//! the count of unhealthy boots on flash grows by one each boot, and the wait before each boot's
//! first network attempt grows with it.
//!
//! Checked from the device's own log, never from host time: boot k (k − 1 unhealthy boots
//! before it) chose a wait of at least `base·2^(k−2)` (the equal jitter's floor, capped) and at
//! most the ceiling; the wait ended before the link came up, and the first attempt came after
//! it; every boot's requests, counted from its ledger lines, add up to the cloud's own count;
//! and the cloud's request rate over each boot's life falls instead of staying flat. Every
//! accepted reading is applied exactly once (the device scenario's own check). The figures go
//! to the output and to `crash_loop` in target/bench/results.json.

use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::device::{Log, Route, Scenario, check, run_device};

/// Boots that crash.
const CRASHES: u32 = 8;
/// The scenario's base for the wait after unhealthy boots, small so eight boots take seconds.
const BASE_MS: u64 = 50;
/// Its cap: the ceiling of boot 8 (`BASE_MS·2^7`), so no crashing boot is capped.
const CAP_MS: u64 = 6_400;

/// The crash loop, as a device scenario: no cloud faults, one reading a boot.
pub const CRASH_LOOP: Scenario = Scenario {
    name: "crash-loop",
    faults: "seed=5",
    readings: 1,
    plan: "crash_loop=8 boot_base=50 boot_cap=6400",
    resets: &[
        ("crash-loop", 1),
        ("crash-loop", 2),
        ("crash-loop", 3),
        ("crash-loop", 4),
        ("crash-loop", 5),
        ("crash-loop", 6),
        ("crash-loop", 7),
        ("crash-loop", 8),
    ],
    route: Route::Direct,
};

/// One boot as its log tells it.
#[derive(Debug, Default, Clone, PartialEq)]
struct Boot {
    /// The `k` the firmware chose (1 + unhealthy boots before it).
    k: u32,
    wait_ms: u64,
    floor_ms: u64,
    ceiling_ms: u64,
    /// Guest uptime when the wait was over.
    over_ms: u64,
    /// HTTP requests the device's transport sent in this boot (from the crash line, or from the
    /// last boot's summary).
    requests: u32,
    /// Guest uptime at the crash, if it crashed.
    crash_ms: Option<u64>,
    /// The order of events was: wait chosen, wait over, first exchange, crash (or summary).
    ordered: bool,
}

/// Runs the scenario, checks it and returns its report; writes `crash_loop` into
/// target/bench/results.json.
pub fn run(root: &Path) -> Result<String> {
    let (lines, report, elapsed) = run_device(root, &CRASH_LOOP)?;
    let log = Log::read(&lines);
    let summary = check(&CRASH_LOOP, &log, &report)?;
    let boots = boots(&lines);
    let cloud_requests =
        report["cloud"]["requests"].as_u64().context("no request count in the cloud's report")?;
    let text = judge(&boots, cloud_requests)?;
    write_results(root, &boots, cloud_requests)?;
    Ok(format!("{text}\n{summary}\nwall time {elapsed:.1} s"))
}

fn field(line: &str, name: &str) -> Option<u64> {
    line.split_whitespace().find_map(|kv| kv.strip_prefix(name)).and_then(|v| v.parse().ok())
}

/// The number after `marker` in `line`.
fn number_after(line: &str, marker: &str) -> Option<u64> {
    let at = line.find(marker)? + marker.len();
    line[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// Reads the boots out of the device's log.
fn boots(lines: &[String]) -> Vec<Boot> {
    let mut boots: Vec<Boot> = vec![];
    // 0: nothing yet; 1: wait chosen; 2: wait over; 3: attempted; 4: crashed.
    let mut stage = 0;
    for line in lines {
        if line.contains("BOOT ") && line.contains(" pending") {
            boots.push(Boot { ordered: true, ..Boot::default() });
            stage = 0;
            continue;
        }
        let Some(boot) = boots.last_mut() else { continue };
        let mut step = |to: u32, boot: &mut Boot| {
            if stage + 1 != to {
                boot.ordered = false;
            }
            stage = to;
        };
        if line.contains("FIRST_WAIT k=") {
            boot.k = field(line, "k=").unwrap_or(0) as u32;
            boot.wait_ms = field(line, "wait_ms=").unwrap_or(0);
            boot.floor_ms = field(line, "floor_ms=").unwrap_or(0);
            boot.ceiling_ms = field(line, "ceiling_ms=").unwrap_or(0);
            step(1, boot);
        } else if line.contains("FIRST_WAIT over at ") {
            boot.over_ms = number_after(line, "over at ").unwrap_or(0);
            step(2, boot);
        } else if line.contains("EXCHANGE first at ") {
            step(3, boot);
        } else if line.contains("RESET crash-loop") {
            boot.crash_ms = number_after(line, "over at ");
            boot.requests = field(line, "requests=").unwrap_or(0) as u32;
            step(4, boot);
        } else if line.contains("SUMMARY ") {
            boot.requests = field(line, "exchanges=").unwrap_or(0) as u32;
            step(4, boot);
        }
    }
    boots
}

/// The floor of boot k's wait, worked out here from the scenario's settings: half the capped
/// ceiling `min(cap, base·2^(k−1))`, which is `base·2^(k−2)` below the cap; 0 for k = 1.
fn floor_ms(k: u32) -> u64 {
    if k <= 1 {
        return 0;
    }
    let ceiling = BASE_MS.saturating_mul(1u64 << (k - 1).min(40)).min(CAP_MS);
    ceiling / 2
}

/// Requests per minute of the boot's life (its uptime at the crash).
fn rate(boot: &Boot) -> Option<f64> {
    let life = boot.crash_ms? as f64 / 60_000.0;
    (life > 0.0).then(|| f64::from(boot.requests) / life)
}

fn judge(boots: &[Boot], cloud_requests: u64) -> Result<String> {
    let mut errors = vec![];
    let expected = CRASHES as usize + 1;
    if boots.len() != expected {
        bail!("{} boots in the log, expected {expected}", boots.len());
    }
    let mut table = vec![
        "boot  k  wait ms  floor ms  ceiling ms  wait over at ms  requests  crash at ms  req/min of life"
            .to_owned(),
    ];
    for (i, boot) in boots.iter().enumerate() {
        let n = i as u32 + 1;
        // Each boot before crashed unhealthy: boot n is k = n.
        if boot.k != n {
            errors.push(format!("boot {n}: k={} (the unhealthy count did not grow by one a boot)", boot.k));
        }
        let floor = floor_ms(n);
        if boot.wait_ms < floor || boot.floor_ms != floor {
            errors.push(format!(
                "boot {n}: waited {} ms, floor {} ms reported, {floor} ms expected (base·2^(k−2))",
                boot.wait_ms, boot.floor_ms
            ));
        }
        if boot.wait_ms > boot.ceiling_ms.max(floor) {
            errors.push(format!(
                "boot {n}: waited {} ms, above its ceiling {} ms",
                boot.wait_ms, boot.ceiling_ms
            ));
        }
        if boot.over_ms < boot.wait_ms {
            errors.push(format!(
                "boot {n}: the wait was over at {} ms of uptime, before {} ms",
                boot.over_ms, boot.wait_ms
            ));
        }
        let crashes = n <= CRASHES;
        if !boot.ordered || boot.requests == 0 || crashes != boot.crash_ms.is_some() {
            errors.push(format!("boot {n}: events out of order or missing: {boot:?}"));
        }
        if let Some(crash) = boot.crash_ms
            && crash < boot.over_ms
        {
            errors.push(format!(
                "boot {n}: crashed at {crash} ms, before its wait was over ({} ms)",
                boot.over_ms
            ));
        }
        table.push(format!(
            "{n:>4} {:>2} {:>8} {:>9} {:>11} {:>16} {:>9} {:>12} {:>16}",
            boot.k,
            boot.wait_ms,
            boot.floor_ms,
            boot.ceiling_ms,
            boot.over_ms,
            boot.requests,
            boot.crash_ms.map_or("-".to_owned(), |c| c.to_string()),
            rate(boot).map_or("-".to_owned(), |r| format!("{r:.1}"))
        ));
    }
    let device_requests: u64 = boots.iter().map(|b| u64::from(b.requests)).sum();
    if device_requests != cloud_requests {
        errors.push(format!(
            "the device logged {device_requests} requests, the cloud counted {cloud_requests}"
        ));
    }
    // The rate falls: the last two crashing boots send at under half the rate of the first two.
    let rates: Vec<f64> = boots.iter().filter_map(rate).collect();
    let (early, late) = match rates.as_slice() {
        [a, b, .., y, z] => ((a + b) / 2.0, (y + z) / 2.0),
        _ => (0.0, 0.0),
    };
    if !(late > 0.0 && late < early / 2.0) {
        errors.push(format!(
            "the request rate did not fall: {early:.1}/min over boots 1–2, {late:.1}/min over boots 7–8"
        ));
    }
    if !errors.is_empty() {
        bail!("crash-loop scenario failed:\n  {}\n{}", errors.join("\n  "), table.join("\n"));
    }
    let waits: Vec<u64> = boots.iter().map(|b| b.wait_ms).collect();
    let requests: Vec<u32> = boots.iter().map(|b| b.requests).collect();
    let mut out = vec![format!(
        "crash-loop: {CRASHES} crashing boots then one that delivers; base {BASE_MS} ms, cap {CAP_MS} ms; waits before the first attempt {waits:?} ms; requests per boot {requests:?} (cloud total {cloud_requests}); request rate {early:.1}/min over boots 1–2, {late:.1}/min over boots 7–8"
    )];
    out.extend(table);
    Ok(out.join("\n"))
}

fn write_results(root: &Path, boots: &[Boot], cloud_requests: u64) -> Result<()> {
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let results = out.join("results.json");
    let mut all = match std::fs::read_to_string(&results) {
        Ok(t) => serde_json::from_str::<serde_json::Value>(&t).unwrap_or_else(|_| serde_json::json!({})),
        Err(_) => serde_json::json!({}),
    };
    if !all.is_object() {
        all = serde_json::json!({});
    }
    let per_boot: Vec<serde_json::Value> = boots
        .iter()
        .enumerate()
        .map(|(i, b)| {
            serde_json::json!({
                "boot": i + 1,
                "k": b.k,
                "wait_ms": b.wait_ms,
                "floor_ms": b.floor_ms,
                "ceiling_ms": b.ceiling_ms,
                "requests": b.requests,
                "crash_uptime_ms": b.crash_ms,
                "requests_per_minute_of_life": rate(b),
            })
        })
        .collect();
    all["crash_loop"] = serde_json::json!({
        "base_ms": BASE_MS,
        "cap_ms": CAP_MS,
        "crashing_boots": CRASHES,
        "cloud_requests": cloud_requests,
        "boots": per_boot,
    });
    std::fs::write(&results, serde_json::to_string_pretty(&all)?)
        .with_context(|| format!("writing {}", results.display()))?;
    eprintln!("    crash-loop figures added to {}", results.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_base_times_two_to_the_k_minus_two_under_the_cap() {
        assert_eq!(floor_ms(1), 0);
        assert_eq!(floor_ms(2), 50);
        assert_eq!(floor_ms(3), 100);
        assert_eq!(floor_ms(8), 3_200);
        // Boot 9's ceiling would be 12.8 s: capped at 6.4 s, floor 3.2 s.
        assert_eq!(floor_ms(9), 3_200);
    }

    fn boot_lines(k: u32, wait: u64, requests: u32, crash: Option<u64>) -> Vec<String> {
        let mut v = vec![
            format!("0.000 INFO  BOOT {k}: 0 pending, boot range reset None"),
            format!(
                "0.001 INFO  FIRST_WAIT k={k} unhealthy={} wait_ms={wait} floor_ms={} ceiling_ms={}",
                k - 1,
                floor_ms(k),
                floor_ms(k) * 2
            ),
            format!("0.002 INFO  FIRST_WAIT over at {} ms", wait + 1),
        ];
        if requests > 0 {
            v.push("0.003 INFO  EXCHANGE first at 5 ms".to_owned());
        }
        match crash {
            Some(c) => v.push(format!(
                "0.004 INFO  RESET crash-loop: first exchange over at {c} ms (answered true) requests={requests}"
            )),
            None => v.push(format!("0.004 INFO  SUMMARY device=1 landed=1 exchanges={requests} calls=1")),
        }
        v
    }

    #[test]
    fn the_log_is_read_in_order_and_a_crash_before_the_wait_is_out_of_order() {
        let mut lines = boot_lines(3, 120, 1, Some(900));
        lines.extend(boot_lines(4, 250, 3, None));
        let read = boots(&lines);
        assert_eq!(read.len(), 2);
        assert_eq!((read[0].k, read[0].wait_ms, read[0].over_ms, read[0].crash_ms), (3, 120, 121, Some(900)));
        assert_eq!((read[0].requests, read[1].requests, read[1].crash_ms), (1, 3, None));
        assert!(read[0].ordered && read[1].ordered);
        let no_exchange = boots(&boot_lines(3, 120, 0, Some(900)));
        assert!(!no_exchange[0].ordered, "no exchange between the wait and the crash");
        let mut swapped = boot_lines(2, 60, 1, None);
        swapped.swap(1, 2);
        assert!(!boots(&swapped)[0].ordered, "the wait over before it was chosen");
    }

    #[test]
    fn a_wait_under_the_floor_or_a_flat_rate_fails() {
        let boot = |k: u32, wait: u64, crash: u64| Boot {
            k,
            wait_ms: wait,
            floor_ms: floor_ms(k),
            ceiling_ms: floor_ms(k) * 2,
            over_ms: wait + 1,
            requests: 1,
            crash_ms: (k <= CRASHES).then_some(crash),
            ordered: true,
        };
        let good: Vec<Boot> = (1..=9).map(|k| boot(k, floor_ms(k), 1_000 + floor_ms(k) * 2)).collect();
        assert!(judge(&good, 9).is_ok(), "{:?}", judge(&good, 9));
        assert!(judge(&good, 10).unwrap_err().to_string().contains("the cloud counted 10"));
        let mut short = good.clone();
        short[4].wait_ms = floor_ms(5) - 1;
        assert!(judge(&short, 9).unwrap_err().to_string().contains("boot 5: waited"));
        // Every boot the same length: the rate stays flat.
        let flat: Vec<Boot> = (1..=9).map(|k| boot(k, floor_ms(k), 10_000)).collect();
        assert!(judge(&flat, 9).unwrap_err().to_string().contains("did not fall"));
    }
}
