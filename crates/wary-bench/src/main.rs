//! Prints every benchmark figure beside its baseline and writes them under `target/bench/`.
//! `cargo xtask bench` runs the callgrind benchmarks and the flash builds first, then this.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use serde_json::json;
use wary_bench::decision::{CALLS, RETRIES};
use wary_bench::report::{Cell, sim_table, svg, table, thousands};
use wary_bench::sim::{self, FleetSpec, World};
use wary_bench::{iai, recovery, sizes, study};

#[derive(Parser)]
#[command(about = "wary benchmarks: decision cost, sizes, flash, fleet simulation")]
struct Args {
    /// Where results are written.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// iai-callgrind's output directory for this package's benchmarks.
    #[arg(long, default_value = "target/bench/iai/release/wary-bench")]
    iai: PathBuf,
    /// The same, for the build with fat LTO.
    #[arg(long, default_value = "target/bench/iai/lto/wary-bench")]
    iai_lto: PathBuf,
    /// Flash sizes measured by `cargo xtask bench` (name, text, data, bss per line).
    #[arg(long)]
    flash: Option<PathBuf>,
    /// The Cortex-M4 decision's instruction counts (`decide-cost`'s `call N: K instructions` lines).
    #[arg(long)]
    m4: Option<PathBuf>,
    /// The same for `pace_once`: the pace and the breaker asked before an attempt, told after it.
    #[arg(long)]
    m4_pace: Option<PathBuf>,
    /// Fleet sizes to simulate.
    #[arg(long, value_delimiter = ',', default_value = "100,1000,10000,100000")]
    clients: Vec<u32>,
    /// The simulation's seed.
    #[arg(long, default_value_t = 2015)]
    seed: u64,
    /// Length of the simulated total outage, in ms.
    #[arg(long, default_value_t = 60_000)]
    outage_ms: u64,
    /// Fleet sizes for the optimistic-concurrency model.
    #[arg(long, value_delimiter = ',', default_value = "10,20,50,75,100")]
    study_clients: Vec<u32>,
    /// Runs averaged per figure of the optimistic-concurrency model.
    #[arg(long, default_value_t = study::RUNS)]
    study_runs: u32,
    /// Run one part only, merging it into results.md and results.json.
    #[arg(long)]
    only: Option<Only>,
    /// With `--only fleet`: fail if the row with the pace and the breaker misses one of its
    /// targets (after writing the results), as `cargo xtask ci` runs it.
    #[arg(long)]
    require_targets: bool,
}

/// A part that runs on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Only {
    /// The optimistic-concurrency model (the AWS backoff study's setting): a few seconds.
    Study,
    /// The fleet's recovery after an outage: 10 000 devices draining a backlog.
    Fleet,
}

/// The optimistic-concurrency model's section and its results.json value.
fn study_part(args: &Args) -> (String, serde_json::Value) {
    let started = Instant::now();
    let sums = study::sweep(&study::contenders(), &args.study_clients, args.study_runs, args.seed);
    let at_100: Vec<u32> = args.study_clients.iter().copied().filter(|&n| n == 100).collect();
    let diagnostic = study::sweep(&study::diagnostics(), &at_100, args.study_runs, args.seed);
    let secs = started.elapsed().as_secs_f64();
    (study::section(&sums, &diagnostic, args.seed, secs), study::json(&sums, &diagnostic, args.seed))
}

/// Runs the model alone: replaces its section in results.md (or adds it) and sets
/// `study_model` in results.json, keeping every other section and key.
fn study_only(args: &Args) -> Result<()> {
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let (section, value) = study_part(args);
    print!("{section}");
    let md_path = args.out.join("results.md");
    let md = match std::fs::read_to_string(&md_path) {
        Ok(old) => study::splice(&old, &section),
        Err(_) => format!("# wary benchmarks\n{section}"),
    };
    std::fs::write(&md_path, md).with_context(|| format!("writing {}", md_path.display()))?;
    let js_path = args.out.join("results.json");
    let mut all = std::fs::read_to_string(&js_path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .filter(serde_json::Value::is_object)
        .unwrap_or_else(|| json!({}));
    all["study_model"] = value;
    std::fs::write(&js_path, serde_json::to_string_pretty(&all)?)
        .with_context(|| format!("writing {}", js_path.display()))?;
    println!("\nwritten: {}, {}", md_path.display(), js_path.display());
    Ok(())
}

/// The fleet recovery's section, its results.json value and the targets it missed.
fn fleet_part(args: &Args) -> (String, serde_json::Value, Vec<recovery::Target>) {
    let started = Instant::now();
    let cells = recovery::sweep(args.seed);
    let secs = started.elapsed().as_secs_f64();
    let missed = recovery::targets(&cells).into_iter().filter(|t| !t.met()).collect();
    (recovery::section(&cells, args.seed, secs), recovery::json(&cells, args.seed), missed)
}

/// Runs the fleet recovery alone: replaces its section in results.md (or adds it) and sets
/// `fleet_recovery` in results.json, keeping every other section and key.
fn fleet_only(args: &Args) -> Result<()> {
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let (section, value, missed) = fleet_part(args);
    print!("{section}");
    let md_path = args.out.join("results.md");
    let md = match std::fs::read_to_string(&md_path) {
        Ok(old) => recovery::splice(&old, &section),
        Err(_) => format!("# wary benchmarks\n{section}"),
    };
    std::fs::write(&md_path, md).with_context(|| format!("writing {}", md_path.display()))?;
    let js_path = args.out.join("results.json");
    let mut all = std::fs::read_to_string(&js_path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .filter(serde_json::Value::is_object)
        .unwrap_or_else(|| json!({}));
    all["fleet_recovery"] = value;
    std::fs::write(&js_path, serde_json::to_string_pretty(&all)?)
        .with_context(|| format!("writing {}", js_path.display()))?;
    println!("\nwritten: {}, {}", md_path.display(), js_path.display());
    if args.require_targets && !missed.is_empty() {
        let list: Vec<String> = missed.iter().map(ToString::to_string).collect();
        anyhow::bail!("the fleet recovery misses {} target(s):\n  {}", missed.len(), list.join("\n  "));
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.only == Some(Only::Study) {
        return study_only(&args);
    }
    if args.only == Some(Only::Fleet) {
        return fleet_only(&args);
    }
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let mut md =
        String::from("# wary benchmarks\n\nEvery figure beside the baseline measured in the same run.\n");
    let mut js = serde_json::Map::new();

    // Decision cost.
    let _ = writeln!(
        md,
        "\n## Decision cost (callgrind instructions)\n\nSame inputs for both: base 5 ms, cap 2 s, jitter from a \
         wyrand seeded alike, {CALLS} calls of {RETRIES} failures each. Per retry decision = all instructions / \
         {}; wary's count also carries each call's final success decision.\n",
        CALLS as usize * RETRIES
    );
    for (dir, profile) in [
        (&args.iai, "the workspace's release profile (no LTO: calls into each crate stay calls)"),
        (&args.iai_lto, "fat LTO, one codegen unit (as the firmware builds)"),
    ] {
        let _ = writeln!(md, "\n### Built with {profile}\n");
        let counts = if dir.exists() { iai::read(dir)? } else { Vec::new() };
        let get = |f: &str| counts.iter().find(|c| c.function == f).map(|c| c.instructions);
        let decisions = CALLS as f64 * RETRIES as f64;
        let Some(base) = get("backon_exponential_jitter") else {
            let _ = writeln!(
                md,
                "not measured: no iai-callgrind summaries under {} (`cargo xtask bench` runs them)",
                dir.display()
            );
            continue;
        };
        let mut rows = Vec::new();
        let mut jrows = Vec::new();
        for (f, what) in [
            ("wary_decide", "wary: classify + backoff + per-call budget (`Policy::decide`)"),
            ("wary_decide_fleet", "wary: the above + fleet budget, as the runner does"),
            ("backon_exponential_jitter", "backon 1.x: exponential + jitter (baseline)"),
            ("wary_harness", "the harness alone: loops, generator, outcomes handed over"),
            ("wary_classify", "the harness + `Policy::classify` (what `decide` starts with)"),
        ] {
            if let Some(ir) = get(f) {
                let per = ir as f64 / decisions;
                let ratio = ir as f64 / base as f64;
                rows.push(vec![what.to_owned(), thousands(ir), format!("{per:.1}"), format!("{ratio:.2}")]);
                jrows.push(
                    json!({"bench": f, "instructions": ir, "per_decision": per, "ratio_to_backon": ratio}),
                );
            }
        }
        md.push_str(&table(&["path", "instructions", "per retry decision", "× backon"], &rows));
        // Where `decide`'s count goes: the harness every wary figure carries, the
        // classification (the classify bench less the harness), and the rest of the decision.
        if let (Some(all), Some(harness), Some(classify)) =
            (get("wary_decide"), get("wary_harness"), get("wary_classify"))
        {
            let share = |n: u64| n as f64 / base as f64;
            let classification = classify.saturating_sub(harness);
            let rest = all.saturating_sub(classify);
            let _ = writeln!(
                md,
                "\nOf `decide`'s {:.3}× backon: the harness {:.3}×, the classification {:.3}× (the classify bench \
                 less the harness), the rest of the decision (attempt cap, backoff and jitter, Retry-After, \
                 budget, the state's update) {:.3}×. Without its classification `decide` is {:.3}× backon's.",
                share(all),
                share(harness),
                share(classification),
                share(rest),
                share(all.saturating_sub(classification)),
            );
            let key = if std::ptr::eq(dir, &args.iai) {
                "decision_breakdown_release"
            } else {
                "decision_breakdown_lto"
            };
            js.insert(
                key.into(),
                json!({
                    "harness_ratio": share(harness),
                    "classification_ratio": share(classification),
                    "rest_ratio": share(rest),
                    "without_classification_ratio": share(all.saturating_sub(classification)),
                }),
            );
        }
        let key = if std::ptr::eq(dir, &args.iai) { "decision_release" } else { "decision_lto" };
        js.insert(key.into(), jrows.into());
    }

    // Sizes.
    md.push_str("\n## Sizes (`size_of`, x86_64 host)\n\n");
    let rows: Vec<Vec<String>> = sizes::all()
        .iter()
        .map(|s| vec![s.what.to_owned(), s.bytes.map_or("n/a".into(), |b| b.to_string()), s.note.to_owned()])
        .collect();
    md.push_str(&table(&["type", "bytes", "note"], &rows));
    js.insert(
        "sizes".into(),
        sizes::all().iter().map(|s| json!({"type": s.what, "bytes": s.bytes})).collect::<Vec<_>>().into(),
    );

    // Flash.
    md.push_str("\n## Flash, thumbv7em-none-eabihf, opt-level z, fat LTO (text + data, bytes)\n\n");
    match &args.flash {
        Some(path) if path.exists() => {
            let text = std::fs::read_to_string(path)?;
            let parsed: Vec<(String, u64)> = text
                .lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    let n = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok());
                    Some((f.first()?.to_string(), n(1)? + n(2)?))
                })
                .collect();
            let base = parsed.iter().find(|(n, _)| n == "baseline").map(|(_, b)| *b).unwrap_or(0);
            let rows: Vec<Vec<String>> = parsed
                .iter()
                .map(|(n, b)| vec![n.clone(), b.to_string(), format!("{:+}", *b as i64 - base as i64)])
                .collect();
            md.push_str(&table(&["binary", "flash", "delta vs baseline"], &rows));
            js.insert(
                "flash".into(),
                parsed
                    .iter()
                    .map(|(n, b)| json!({"binary": n, "bytes": b, "delta": *b as i64 - base as i64}))
                    .collect::<Vec<_>>()
                    .into(),
            );
        }
        _ => md.push_str("not measured: `cargo xtask bench` builds bench-size/ and passes --flash\n"),
    }

    // The decision on a Cortex-M4.
    md.push_str(
        "\n## The decision on a Cortex-M4 (instructions retired)\n\nMethod: QEMU models no cycles and \
         mps2-an386 has no DWT cycle counter to read, so `firmware/conformance/decide-cost` counts the \
         instructions retired by each `decide_once` call (one `Policy::decide_with_fleet`, out of line, \
         callees included) in the M4 conformance image's single-stepped execution trace \
         (`-singlestep -d exec,nochain`, `-icount shift=0,align=off`).\n\n",
    );
    m4_section(
        &mut md,
        &mut js,
        "m4_decision",
        args.m4.as_deref(),
        &[
            "a retry (503), fleet charged",
            "a retry the fleet refuses (throttled)",
            "a success, fleet refunded",
        ],
        "not measured: `cargo xtask bench` runs decide-cost and passes --m4\n",
    );

    md.push_str(
        "\n## The pace and the breaker on a Cortex-M4 (instructions retired)\n\nThe same method for \
         `pace_once` (`firmware/conformance`): the device's pace and breaker (`PaceSettings::DEVICE`, \
         `BreakerSettings::DEVICE`) asked before an attempt (`Attempts::admit`, with what they said kept \
         for the ledger) and, when it goes, told its outcome (`Attempts::report`).\n\n",
    );
    m4_section(
        &mut md,
        &mut js,
        "m4_pace",
        args.m4_pace.as_deref(),
        &[
            "open pace, closed breaker: go; a 503 cuts the rate",
            "a pace wait the call's budget cannot pay: the call ends",
            "after the wait: go; a success heard",
            "an open breaker: the call ends at once",
        ],
        "not measured: `cargo xtask bench` runs decide-cost for pace_once and passes --m4-pace\n",
    );

    // The decision's targets, from the figures above.
    let targets = targets(&js);
    md.push_str("\n## Targets\n\n");
    let rows: Vec<Vec<String>> = targets
        .iter()
        .map(|t| {
            let value = t.value.map_or("not measured".to_owned(), |v| {
                if v.fract() == 0.0 { format!("{v}") } else { format!("{v:.3}") }
            });
            let met = t.value.map_or("-", |v| if v <= t.limit { "yes" } else { "no" });
            vec![t.what.to_owned(), value, format!("{}", t.limit), met.to_owned()]
        })
        .collect();
    md.push_str(&table(&["figure", "measured", "at most", "met"], &rows));
    js.insert(
        "targets".into(),
        targets
            .iter()
            .map(|t| {
                (
                    t.key.to_owned(),
                    json!({"value": t.value, "limit": t.limit, "met": t.value.map(|v| v <= t.limit)}),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into(),
    );
    // What the unmet decision targets would be without the classification, the rule that
    // costs the most: its flash is `classify` alone (its code, the outcome, and the policy's
    // data, the status table included), its instructions the classify bench less the harness.
    let delta =
        |bin: &str| js.get("flash")?.as_array()?.iter().find(|r| r["binary"] == bin)?["delta"].as_i64();
    let breakdown = |key: &str| js.get(key)?.get("without_classification_ratio")?.as_f64();
    if let (Some(decide), Some(classify)) = (delta("wary"), delta("wary_classify")) {
        let _ = writeln!(
            md,
            "\nThe classification is what the unmet targets pay for: `classify` alone adds {classify} B of \
             flash (its code, the policy's data with the status table, the outcome it reads), so the rest \
             of `decide` is {} B; without it `decide` runs in {} of backon's instructions (fat LTO; \
             release {}).",
            decide - classify,
            breakdown("decision_breakdown_lto").map_or("-".to_owned(), |r| format!("{r:.3}×")),
            breakdown("decision_breakdown_release").map_or("-".to_owned(), |r| format!("{r:.3}×")),
        );
        js.insert("decide_flash_without_classification".into(), json!(decide - classify));
    }

    // Fleet simulation.
    let started = Instant::now();
    let contenders = sim::contenders();
    let names: Vec<&'static str> = contenders.iter().map(|c| c.name).collect();
    let mut cells = Vec::new();
    for &n in &args.clients {
        for c in &contenders {
            for spec in [None, Some(FleetSpec::A6), Some(FleetSpec::A6_PER_CLIENT)] {
                let world = World::contended(n, args.seed);
                let contended = sim::run(&c.policy, spec, &world);
                let outage = sim::run(&c.policy, spec, &World::outage(n, args.outage_ms, args.seed));
                cells.push(Cell {
                    name: c.name,
                    fleet: spec.is_some(),
                    fleet_label: spec.map_or_else(|| "off".to_owned(), |f| f.label()),
                    per_client: spec.is_some_and(|f| f.per_client),
                    world,
                    contended,
                    outage,
                });
            }
        }
    }
    let sim_secs = started.elapsed().as_secs_f64();
    let _ = writeln!(
        md,
        "\n## Fleet simulation\n\nDeterministic (seed {}): every client starts one call at t = 0; the server \
         serves 1 call per ms and sheds the rest with 503; round trip 10 ± 2 ms; ticks are ms. \
         `none`/`equal`/`full`/`decorrelated`: base 5, cap 2000, retry until success (the AWS study's clients). \
         `wary default`: `Preset::Default` as shipped (base 100, cap 10 s, equal jitter, 30 s budget). \
         Fleet budget: `wary::FleetBudget` (10 tokens, 0.1 per success), either one shared by all clients (as by \
         every task of one gateway) or one per client (as on each device of a fleet). \
         Peak calls per tick leaves out t = 0, where every policy sends the same herd of first attempts. Outage: the same clients for {} s with every call failing. ≥: run stopped at its call cap.\n",
        args.seed,
        args.outage_ms / 1000
    );
    md.push_str(&sim_table(&cells));
    md.push_str("\n### Against the AWS study's shape (no fleet budget)\n\n");
    let mut shape = Vec::new();
    for &n in &args.clients {
        let of = |name: &str| cells.iter().find(|c| c.name == name && !c.fleet && c.world.clients == n);
        let (Some(none), Some(full)) = (of("none"), of("full")) else { continue };
        let study: Vec<_> = ["none", "equal", "full", "decorrelated"].iter().filter_map(|s| of(s)).collect();
        let fewest = study.iter().min_by_key(|c| c.contended.calls).map_or("-", |c| c.name);
        let fastest = study.iter().min_by_key(|c| c.contended.completion).map_or("-", |c| c.name);
        let def = of("wary default");
        // A herd stopped at its call cap had not finished: its ratios are lower bounds.
        let ge = if none.contended.truncated { "≥" } else { "" };
        shape.push(vec![
            thousands(u64::from(n)),
            fewest.to_owned(),
            format!(
                "{:.2}",
                full.contended.calls as f64
                    / study.iter().map(|c| c.contended.calls).min().unwrap_or(1) as f64
            ),
            format!("{ge}{:.1}", none.contended.calls as f64 / full.contended.calls as f64),
            fastest.to_owned(),
            format!("{ge}{:.1}", none.contended.completion as f64 / full.contended.completion.max(1) as f64),
            def.map_or("-".into(), |d| {
                format!("{:.2}", d.contended.calls as f64 / full.contended.calls as f64)
            }),
            def.map_or("-".into(), |d| {
                format!("{:.0}%", 100.0 * d.contended.succeeded as f64 / f64::from(n))
            }),
        ]);
    }
    md.push_str(&table(
        &[
            "clients",
            "fewest calls",
            "full ÷ fewest (calls)",
            "none ÷ full (calls)",
            "fastest",
            "none ÷ full (time)",
            "wary default ÷ full (calls)",
            "wary default succeeded",
        ],
        &shape,
    ));
    let _ = writeln!(md, "\nSimulation wall time: {sim_secs:.1} s.");
    let (section, value) = study_part(&args);
    md.push_str(&section);
    js.insert("study_model".into(), value);
    let (section, value, _) = fleet_part(&args);
    md.push_str(&section);
    js.insert("fleet_recovery".into(), value);
    js.insert(
        "simulation".into(),
        cells
            .iter()
            .map(|c| {
                json!({
                    "policy": c.name, "fleet": c.fleet, "clients": c.world.clients,
                    "calls": c.contended.calls, "succeeded": c.contended.succeeded, "gave_up": c.contended.gave_up,
                    "throttled": c.contended.throttled, "completion_ms": c.contended.completion,
                    "peak_per_tick": c.contended.peak_per_tick, "truncated": c.contended.truncated,
                    "outage_calls": c.outage.calls, "outage_amplification": c.outage.amplification(c.world.clients),
                })
            })
            .collect::<Vec<_>>()
            .into(),
    );

    print!("{md}");
    let write = |name: &str, body: &str| -> Result<()> {
        let p = args.out.join(name);
        std::fs::write(&p, body).with_context(|| format!("writing {}", p.display()))
    };
    write("results.md", &md)?;
    write("fleet.svg", &svg(&cells, &names))?;
    write("results.json", &serde_json::to_string_pretty(&serde_json::Value::Object(js))?)?;
    println!("\nwritten: {}/results.md, fleet.svg, results.json", args.out.display());
    Ok(())
}

/// One Cortex-M4 table: the `call N: K instructions` lines of the file at `path` as rows, each
/// with its `what`, into `md` and into `js` under `key` (or `missing` when not measured).
fn m4_section(
    md: &mut String,
    js: &mut serde_json::Map<String, serde_json::Value>,
    key: &str,
    path: Option<&std::path::Path>,
    what: &[&str],
    missing: &str,
) {
    let calls: Vec<(String, u64)> = path
        .and_then(|p| std::fs::read_to_string(p).ok())
        .map(|t| t.lines().filter_map(m4_line).collect())
        .unwrap_or_default();
    if calls.is_empty() {
        md.push_str(missing);
        return;
    }
    let what = |i: usize| what.get(i).copied().unwrap_or("-");
    let rows: Vec<Vec<String>> = calls
        .iter()
        .enumerate()
        .map(|(i, (call, n))| vec![call.clone(), what(i).to_owned(), n.to_string()])
        .collect();
    md.push_str(&table(&["call", "what", "instructions"], &rows));
    js.insert(
        key.into(),
        json!({
            "method": "instructions retired in a single-stepped QEMU trace (mps2-an386, Cortex-M4)",
            "calls": calls
                .iter()
                .enumerate()
                .map(|(i, (c, n))| json!({"call": c, "what": what(i), "instructions": n}))
                .collect::<Vec<_>>(),
        }),
    );
}

/// `call 2: 178 instructions` → ("call 2", 178).
fn m4_line(line: &str) -> Option<(String, u64)> {
    let (call, rest) = line.split_once(':')?;
    let n = rest.trim().strip_suffix(" instructions")?.parse().ok()?;
    Some((call.trim().to_owned(), n))
}

/// One target of the decision's cost.
struct Target {
    key: &'static str,
    what: &'static str,
    value: Option<f64>,
    limit: f64,
}

/// The decision's targets, read from this run's results: flash added by `decide` and by `plan`
/// over the baseline binary, the per-call state, and `decide`'s instructions against backon's.
fn targets(js: &serde_json::Map<String, serde_json::Value>) -> Vec<Target> {
    let flash =
        |bin: &str| js.get("flash")?.as_array()?.iter().find(|r| r["binary"] == bin)?["delta"].as_f64();
    let ratio = |key: &str| {
        js.get(key)?.as_array()?.iter().find(|r| r["bench"] == "wary_decide")?["ratio_to_backon"].as_f64()
    };
    vec![
        Target {
            key: "decide_flash_bytes",
            what: "`decide` flash over the baseline (bytes)",
            value: flash("wary"),
            limit: 512.0,
        },
        Target {
            key: "plan_flash_bytes",
            what: "`plan` flash over the baseline (bytes; its result moved out links `memcpy`)",
            value: flash("wary_plan"),
            limit: 1536.0,
        },
        Target {
            key: "plan_into_flash_bytes",
            what: "`plan_into` flash over the baseline (bytes; the plan filled in place)",
            value: flash("wary_plan_into"),
            limit: 1536.0,
        },
        Target {
            key: "call_state_bytes",
            what: "`wary::CallState` (bytes)",
            value: Some(core::mem::size_of::<wary::CallState>() as f64),
            limit: 12.0,
        },
        Target {
            key: "decide_ratio_to_backon_lto",
            what: "`decide` instructions ÷ backon's, fat LTO",
            value: ratio("decision_lto"),
            limit: 0.35,
        },
        Target {
            key: "decide_ratio_to_backon_release",
            what: "`decide` instructions ÷ backon's, release profile",
            value: ratio("decision_release"),
            limit: 0.35,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::m4_line;

    #[test]
    fn reads_decide_costs_lines_and_nothing_else() {
        assert_eq!(m4_line("call 2: 178 instructions"), Some(("call 2".to_owned(), 178)));
        assert_eq!(m4_line("no complete call traced"), None);
        assert_eq!(m4_line("call 1: many instructions"), None);
    }
}
