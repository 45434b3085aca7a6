//! `cargo xtask bench`: decision cost under callgrind (wary against backon, same run), sizes,
//! flash deltas on thumbv7em, the fleet simulation, the optimistic-concurrency model of the AWS
//! backoff study, the gateway under load beside nginx, and a recovery on real processes;
//! printed and written to target/bench/. Installs what it needs when missing: valgrind,
//! iai-callgrind-runner, the thumb target, llvm-tools and nginx.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::util::{NGINX, ensure_apt, ensure_nginx, ensure_targets, output, run, run_env, step};

/// Must match the `iai-callgrind` version in crates/wary-bench: the runner refuses any other.
const IAI_RUNNER_VERSION: &str = "0.16.1";
/// The size binaries in bench-size/, `baseline` first: the others are deltas against it.
const SIZE_BINARIES: [&str; 8] =
    ["baseline", "wary", "wary_classify", "wary_plan", "wary_plan_into", "wary_fleet", "wary_pace", "backon"];
const THUMB: &str = "thumbv7em-none-eabihf";

/// A part of the bench that runs on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    /// The gateway's throughput, latency and memory against nginx.
    Gateway,
    /// The optimistic-concurrency model of the AWS backoff study (a few seconds in release).
    Study,
    /// The fleet's recovery after an outage: 10 000 devices, six rows, four worlds.
    Fleet,
    /// The gateway's MQTT ingress beside `mosquitto_sub` on the same stream.
    MqttIngress,
    /// The fleet's recovery on real processes: the test cloud with a capacity and an outage, the
    /// gateway binary paced and unpaced, sensors with a backlog.
    Recovery,
}

/// Runs every benchmark and the simulation, or only `only`.
pub fn bench(root: &Path, only: Option<Part>) -> Result<()> {
    let started = Instant::now();
    if let Some(part) = only {
        match part {
            Part::Gateway => gateway(root)?,
            Part::Study => study(root)?,
            Part::Fleet => fleet(root, false)?,
            Part::MqttIngress => mqtt_ingress(root)?,
            Part::Recovery => recovery(root)?,
        }
        eprintln!("\nbench finished in {:.0} s", started.elapsed().as_secs_f64());
        return Ok(());
    }
    ensure_apt("valgrind", "valgrind")?;
    ensure_iai_runner()?;
    ensure_targets(&[THUMB])?;
    let llvm_size = llvm_size()?;
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;

    // Two builds: the workspace's release profile, and fat LTO as the firmware is built, where
    // the core's calls inline into the caller.
    let iai_release = out.join("iai/release");
    let iai_lto = out.join("iai/lto");
    let bench_args = ["bench", "-p", "wary-bench", "--bench", "decision"];
    step("decision cost under callgrind (release profile)");
    run_env(
        root,
        "cargo",
        &bench_args,
        &[("IAI_CALLGRIND_HOME", s(&iai_release)?), ("IAI_CALLGRIND_SAVE_SUMMARY", "json")],
    )?;
    step("decision cost under callgrind (fat LTO, one codegen unit)");
    run_env(
        root,
        "cargo",
        &bench_args,
        &[
            ("IAI_CALLGRIND_HOME", s(&iai_lto)?),
            ("IAI_CALLGRIND_SAVE_SUMMARY", "json"),
            ("CARGO_PROFILE_BENCH_LTO", "fat"),
            ("CARGO_PROFILE_BENCH_CODEGEN_UNITS", "1"),
        ],
    )?;

    step("flash on thumbv7em-none-eabihf, opt-level z (bench-size/)");
    let size_target = root.join("target/bench-size");
    run(&root.join("bench-size"), "cargo", &["build", "--release", "--target-dir", s(&size_target)?])?;
    check_no_panic(&llvm_size, &size_target)?;
    let mut flash = String::new();
    for bin in SIZE_BINARIES {
        let elf = size_target.join(THUMB).join("release").join(bin);
        let report =
            output(&llvm_size, &[s(&elf)?]).with_context(|| format!("{llvm_size} {}", elf.display()))?;
        // Berkeley format: text data bss dec hex filename.
        let fields: Vec<&str> = report.lines().last().unwrap_or_default().split_whitespace().collect();
        let [text, data, bss, ..] = fields.as_slice() else { bail!("unexpected llvm-size output: {report}") };
        flash.push_str(&format!("{bin} {text} {data} {bss}\n"));
    }
    let flash_file = out.join("flash.tsv");
    std::fs::write(&flash_file, flash).with_context(|| format!("writing {}", flash_file.display()))?;

    let m4 = m4_decision(root, &out)?;
    let m4_pace = m4_pace(root, &out)?;

    step("report and fleet simulation");
    run(
        root,
        "cargo",
        &[
            "run",
            "--release",
            "-q",
            "-p",
            "wary-bench",
            "--",
            "--out",
            s(&out)?,
            "--iai",
            s(&iai_release.join("wary-bench"))?,
            "--iai-lto",
            s(&iai_lto.join("wary-bench"))?,
            "--flash",
            s(&flash_file)?,
            "--m4",
            s(&m4)?,
            "--m4-pace",
            s(&m4_pace)?,
        ],
    )?;
    gateway(root)?;
    mqtt_ingress(root)?;
    recovery(root)?;
    eprintln!("\nbench finished in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// The decision on a Cortex-M4: instructions retired by each `decide_once` call of the M4
/// conformance image, counted from a single-stepped QEMU trace by
/// `firmware/conformance/decide-cost` (QEMU models no cycles). Writes its lines to
/// `target/bench/m4.txt` and returns that path.
fn m4_decision(root: &Path, out: &Path) -> Result<PathBuf> {
    step(
        "the decision on a Cortex-M4: instructions retired, from a QEMU trace (firmware/conformance/decide-cost)",
    );
    ensure_apt("qemu-system-arm", "qemu-system-arm")?;
    let firmware = root.join(crate::harness::QEMU_BOARD);
    crate::harness::build(&firmware)?;
    let script = root.join("firmware/conformance/decide-cost");
    let text = output(s(&script)?, &[]).with_context(|| format!("{} failed", script.display()))?;
    let file = out.join("m4.txt");
    std::fs::write(&file, &text).with_context(|| format!("writing {}", file.display()))?;
    eprint!("{text}");
    Ok(file)
}

/// The pace and the breaker on a Cortex-M4: instructions retired by each `pace_once` call of
/// the M4 conformance image (asked before an attempt, told after it), by the same script.
/// Writes `target/bench/m4-pace.txt` and returns that path.
fn m4_pace(root: &Path, out: &Path) -> Result<PathBuf> {
    step("the pace and the breaker on a Cortex-M4: instructions retired (decide-cost … pace_once)");
    let script = root.join("firmware/conformance/decide-cost");
    let text =
        output(s(&script)?, &["", "pace_once"]).with_context(|| format!("{} failed", script.display()))?;
    let file = out.join("m4-pace.txt");
    std::fs::write(&file, &text).with_context(|| format!("writing {}", file.display()))?;
    eprint!("{text}");
    Ok(file)
}

/// The gateway under load beside nginx, one run against the test cloud on 127.0.0.1 (the load
/// generator is crates/wary-gateway/examples/gateway_load.rs, bounded in count and time); adds a
/// `gateway` section to target/bench/results.json, keeping whatever else the file holds.
fn gateway(root: &Path) -> Result<()> {
    ensure_nginx()?;
    let nginx = if Path::new(NGINX).exists() { NGINX.to_owned() } else { "nginx".to_owned() };
    step(
        "gateway under load: throughput at 0% and 30% upstream 503s, added latency, RSS; nginx beside it; then both over TLS, 5 runs each",
    );
    run(
        root,
        "cargo",
        &[
            "build",
            "--release",
            "-q",
            "-p",
            "wary-gateway",
            "--bin",
            "wary-gateway",
            "--example",
            "gateway_load",
        ],
    )?;
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let section = out.join("gateway.json");
    let load = root.join("target/release/examples/gateway_load");
    let gw = root.join("target/release/wary-gateway");
    run(root, s(&load)?, &["--gateway-bin", s(&gw)?, "--nginx", &nginx, "--out", s(&section)?])?;
    let text = std::fs::read_to_string(&section).with_context(|| format!("reading {}", section.display()))?;
    let figures: serde_json::Value = serde_json::from_str(&text).context("the gateway bench's JSON")?;
    add_to_results(&out, "gateway", figures)
}

/// Sets `key` in target/bench/results.json to `figures`, every other key kept.
fn add_to_results(out: &Path, key: &str, figures: serde_json::Value) -> Result<()> {
    let results = out.join("results.json");
    let mut all = match std::fs::read_to_string(&results) {
        Ok(t) => serde_json::from_str::<serde_json::Value>(&t).unwrap_or_else(|_| serde_json::json!({})),
        Err(_) => serde_json::json!({}),
    };
    if !all.is_object() {
        all = serde_json::json!({});
    }
    all[key] = figures;
    std::fs::write(&results, serde_json::to_string_pretty(&all)?)
        .with_context(|| format!("writing {}", results.display()))?;
    eprintln!("    {key} figures added to {}", results.display());
    Ok(())
}

/// The MQTT ingress's throughput beside `mosquitto_sub` on the same queued stream (the
/// `mqtt_ingress_load` example); its figures go into results.json as `mqtt_ingress`.
fn mqtt_ingress(root: &Path) -> Result<()> {
    crate::util::ensure_mosquitto()?;
    step("gateway MQTT ingress beside mosquitto_sub on the same stream, in-flight windows 20 and 100");
    run(
        root,
        "cargo",
        &[
            "build",
            "--release",
            "-q",
            "-p",
            "wary-gateway",
            "--bin",
            "wary-gateway",
            "--example",
            "mqtt_ingress_load",
        ],
    )?;
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let section = out.join("mqtt_ingress.json");
    let load = root.join("target/release/examples/mqtt_ingress_load");
    let gw = root.join("target/release/wary-gateway");
    run(root, s(&load)?, &["--gateway-bin", s(&gw)?, "--out", s(&section)?])?;
    let text = std::fs::read_to_string(&section).with_context(|| format!("reading {}", section.display()))?;
    let figures: serde_json::Value = serde_json::from_str(&text).context("the MQTT ingress bench's JSON")?;
    add_to_results(&out, "mqtt_ingress", figures)
}

/// The fleet's recovery on real processes (crates/wary-demo/examples/recovery.rs): its figures go
/// into results.json as `recovery`, its chart to target/bench/recovery.svg.
fn recovery(root: &Path) -> Result<()> {
    step(
        "recovery on real processes: test cloud at 200 requests/s after a 5 s outage, the gateway paced (default and tuned) and unpaced",
    );
    run(
        root,
        "cargo",
        &[
            "build",
            "--release",
            "-q",
            "-p",
            "wary-gateway",
            "--bin",
            "wary-gateway",
            "-p",
            "wary-demo",
            "--example",
            "recovery",
        ],
    )?;
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let section = out.join("recovery.json");
    let svg = out.join("recovery.svg");
    let example = root.join("target/release/examples/recovery");
    let gw = root.join("target/release/wary-gateway");
    run(root, s(&example)?, &["--gateway-bin", s(&gw)?, "--out", s(&section)?, "--svg", s(&svg)?])?;
    let text = std::fs::read_to_string(&section).with_context(|| format!("reading {}", section.display()))?;
    let figures: serde_json::Value = serde_json::from_str(&text).context("the recovery run's JSON")?;
    add_to_results(&out, "recovery", figures)
}

/// The optimistic-concurrency model alone: its section replaces (or joins) the one in
/// target/bench/results.md, and `study_model` is set in results.json, every other key kept.
/// The full run gets the same section from the report step.
fn study(root: &Path) -> Result<()> {
    step("optimistic-concurrency model: the study's five policies and wary's default, 10–100 clients");
    let out = root.join("target/bench");
    run(
        root,
        "cargo",
        &["run", "--release", "-q", "-p", "wary-bench", "--", "--only", "study", "--out", s(&out)?],
    )
}

/// The fleet recovery alone: its section replaces (or joins) the one in target/bench/results.md,
/// and `fleet_recovery` is set in results.json, every other key kept. With `require_targets`
/// (as `cargo xtask ci` runs it, about 20 s) it fails if the row with the pace and the breaker
/// misses one of its targets.
pub fn fleet(root: &Path, require_targets: bool) -> Result<()> {
    step("fleet recovery: 10 000 devices × 20 readings after a 60 s outage, six rows, four worlds");
    let out = root.join("target/bench");
    let mut args =
        vec!["run", "--release", "-q", "-p", "wary-bench", "--", "--only", "fleet", "--out", s(&out)?];
    if require_targets {
        args.push("--require-targets");
    }
    run(root, "cargo", &args)
}

/// The binaries that hold only the core's decision path (and the fleet budget).
const CORE_ONLY: [&str; 4] = ["wary", "wary_plan", "wary_fleet", "wary_pace"];

/// Builds bench-size (opt-level z, fat LTO) and fails if the core's decision path pulls in any
/// panic or formatting code: the link-time proof that the lints' "no panic paths" holds.
pub fn no_panic(root: &Path) -> Result<()> {
    ensure_targets(&[THUMB])?;
    let llvm_size = llvm_size()?;
    let size_target = root.join("target/bench-size");
    step("no panic path: the core's decision path built alone for thumbv7em (bench-size/)");
    run(&root.join("bench-size"), "cargo", &["build", "--release", "--target-dir", s(&size_target)?])?;
    check_no_panic(&llvm_size, &size_target)
}

fn check_no_panic(llvm_size: &str, size_target: &Path) -> Result<()> {
    // llvm-nm sits beside llvm-size in rustup's llvm-tools.
    let nm = Path::new(llvm_size).with_file_name("llvm-nm");
    for bin in CORE_ONLY {
        let elf = size_target.join(THUMB).join("release").join(bin);
        let symbols =
            output(s(&nm)?, &["-C", s(&elf)?]).with_context(|| format!("llvm-nm {}", elf.display()))?;
        let offending: Vec<&str> = symbols
            .lines()
            .filter(|l| l.contains("panic") || l.contains("core::fmt") || l.contains("unwrap_failed"))
            .collect();
        if !offending.is_empty() {
            bail!(
                "{bin}: the core's decision path links panic or formatting code:\n{}",
                offending.join("\n")
            );
        }
        eprintln!("    {bin}: {} symbols, none for panics or formatting", symbols.lines().count());
    }
    Ok(())
}

fn s(p: &Path) -> Result<&str> {
    p.to_str().with_context(|| format!("path is not UTF-8: {}", p.display()))
}

/// iai-callgrind-runner at exactly the library's version.
fn ensure_iai_runner() -> Result<()> {
    let have = output("iai-callgrind-runner", &["--version"]).unwrap_or_default();
    if have.contains(IAI_RUNNER_VERSION) {
        return Ok(());
    }
    step(&format!(
        "iai-callgrind-runner {IAI_RUNNER_VERSION} is missing (found: {:?}): cargo install, about 2 minutes once",
        have.trim()
    ));
    run(
        Path::new("."),
        "cargo",
        &["install", "iai-callgrind-runner", "--version", IAI_RUNNER_VERSION, "--locked"],
    )
}

/// The toolchain's own llvm-size (rustup's llvm-tools), installed when missing.
fn llvm_size() -> Result<String> {
    let sysroot = output("rustc", &["--print", "sysroot"]).context("rustc --print sysroot")?;
    let host = output("rustc", &["--print", "host-tuple"])
        .or_else(|| {
            output("rustc", &["-vV"])?.lines().find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        })
        .context("finding the host target")?;
    let tool: PathBuf = [sysroot.trim(), "lib", "rustlib", host.trim(), "bin", "llvm-size"].iter().collect();
    if !tool.exists() {
        step("llvm-tools is missing: rustup component add llvm-tools");
        run(Path::new("."), "rustup", &["component", "add", "llvm-tools"])?;
    }
    Ok(s(&tool)?.to_owned())
}
