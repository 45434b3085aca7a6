//! `wary`: plan, explain, replay and stats for wary retry policies.

use std::io::{self, BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use wary::{Duration, Jitter};
use wary_cli::{explain, from_defmt, plan, replay};
use wary_host::ledger::Line;
use wary_host::spec::{FleetSpec, PolicySpec, SpecError};

#[derive(Parser)]
#[command(name = "wary", version, about = "Retry policies for device uplinks: plan, explain, replay, stats")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Reads JSON-line cases on stdin and writes each one's waits and verdict (the pure plan).
    Plan,
    /// Prints a policy's worked schedule, classification grid and warnings.
    Explain(ExplainArgs),
    /// Recomputes every decision in a JSON-lines ledger and reports divergences.
    Replay {
        /// The ledger file.
        ledger: PathBuf,
    },
    /// Ledger conversions.
    #[command(subcommand)]
    Ledger(LedgerCommand),
    /// Attempts per call, verdicts and retry causes of a JSON-lines ledger.
    Stats {
        /// The ledger file.
        ledger: PathBuf,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum LedgerCommand {
    /// Reads `defmt-print` output on stdin and writes the device's ledger as JSON lines.
    FromDefmt {
        /// The device's policy as a TOML spec; written as the ledger's policy line.
        #[arg(long)]
        policy: Option<PathBuf>,
    },
}

/// `wary explain`'s settings. Every duration is in milliseconds, the core's unit, and each flag
/// says so in its name; the old names without the unit still work and mean the same.
#[derive(clap::Args)]
struct ExplainArgs {
    /// A TOML file with the policy's settings, durations in milliseconds (flags override it).
    #[arg(long)]
    config: Option<PathBuf>,
    /// default, basic or strict.
    #[arg(long)]
    preset: Option<String>,
    /// First ceiling, milliseconds.
    #[arg(long = "base-ms", visible_alias = "base", value_name = "MS")]
    base: Option<u64>,
    /// Largest ceiling, milliseconds.
    #[arg(long = "cap-ms", visible_alias = "cap", value_name = "MS")]
    cap: Option<u64>,
    /// Wait budget per call, milliseconds.
    #[arg(long = "budget-ms", visible_alias = "budget", value_name = "MS")]
    budget: Option<u64>,
    /// Deadline per call, milliseconds, attempts included.
    #[arg(long = "deadline-ms", visible_alias = "deadline", value_name = "MS")]
    deadline: Option<u64>,
    /// Attempt cap, the first attempt included.
    #[arg(long)]
    max_attempts: Option<u32>,
    /// equal, full, decorrelated or none.
    #[arg(long)]
    jitter: Option<String>,
    /// How Retry-After combines with the backoff: max or spread.
    #[arg(long)]
    retry_after: Option<String>,
    /// The longest Retry-After the API is known to send, in whole seconds as the header gives
    /// it (for a warning when the budget cannot wait it out).
    #[arg(long = "known-retry-after-s", visible_alias = "known-retry-after", value_name = "SECONDS")]
    known_retry_after: Option<u64>,
    /// Fleet budget tokens (1..=1000), checked like the policy.
    #[arg(long)]
    fleet_tokens: Option<u32>,
    /// Fleet budget token ratio in thousandths (1..=1000).
    #[arg(long)]
    fleet_ratio: Option<u32>,
    /// The tick rate of earlier versions: wary counts milliseconds, so only 1000 means what it
    /// meant.
    #[arg(long, hide = true)]
    tick_hz: Option<u32>,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("wary: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<ExitCode> {
    match Cli::parse().command {
        Command::Plan => run_plan(),
        Command::Explain(a) => run_explain(a),
        Command::Replay { ledger } => {
            let text =
                std::fs::read_to_string(&ledger).with_context(|| format!("reading {}", ledger.display()))?;
            let l = replay::load(&text);
            for (n, e) in &l.bad_lines {
                println!("line {n}: unreadable: {e}");
                eprintln!("warning: line {n} of {} is unreadable: {e}", ledger.display());
            }
            let d = replay::replay(&l);
            for x in &d {
                println!(
                    "divergence: call {} attempt {}: ledger says {}, the core decides {}",
                    x.key, x.attempt, x.recorded, x.replayed
                );
            }
            let attempts: usize = l.calls.iter().map(|c| c.records.len()).sum();
            println!(
                "replayed {} calls, {attempts} attempts: {} divergences, {} unreadable lines",
                l.calls.len(),
                d.len(),
                l.bad_lines.len()
            );
            Ok(if d.is_empty() && l.bad_lines.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Command::Ledger(LedgerCommand::FromDefmt { policy }) => run_from_defmt(policy),
        Command::Stats { ledger, json } => {
            let text =
                std::fs::read_to_string(&ledger).with_context(|| format!("reading {}", ledger.display()))?;
            let l = replay::load(&text);
            // Figures over part of a file must not pass for figures over all of it.
            for (n, e) in &l.bad_lines {
                eprintln!("warning: line {n} of {} is unreadable: {e}", ledger.display());
            }
            let s = replay::stats(&l);
            if json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                print!("{}", replay::render_stats(&s));
            }
            if s.unreadable_lines > 0 {
                eprintln!("warning: {} unreadable lines left out of these figures", s.unreadable_lines);
                return Ok(ExitCode::FAILURE);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn run_from_defmt(policy: Option<PathBuf>) -> Result<ExitCode> {
    let mut out = io::BufWriter::new(io::stdout().lock());
    let mut fingerprint = None;
    if let Some(path) = policy {
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let spec: PolicySpec =
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let p = spec.build()?;
        Line::Policy(p).write_to(&mut out)?;
        fingerprint = Some(p.fingerprint());
    }
    let mut bad = 0usize;
    for (n, line) in io::stdin().lock().lines().enumerate() {
        let line = line.context("reading stdin")?;
        match from_defmt::convert(&line) {
            Ok(Some(r)) => {
                if fingerprint.is_some_and(|fp| fp != r.policy) {
                    eprintln!("line {}: recorded under policy {:08x}, not the one given", n + 1, r.policy);
                }
                Line::Attempt(r).write_to(&mut out)?;
            }
            Ok(None) => {}
            Err(e) => {
                bad += 1;
                eprintln!("line {}: {e}", n + 1);
            }
        }
    }
    out.flush()?;
    Ok(if bad == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn run_plan() -> Result<ExitCode> {
    let stdin = io::stdin();
    let mut out = io::BufWriter::new(io::stdout().lock());
    let mut any_invalid = false;
    for line in stdin.lock().lines() {
        let line = line.context("reading stdin")?;
        if line.trim().is_empty() {
            continue;
        }
        let answer = plan::answer(&line).unwrap_or_else(|e| {
            any_invalid = true;
            plan::error_line(&e)
        });
        writeln!(out, "{answer}")?;
    }
    out.flush()?;
    Ok(if any_invalid { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

fn run_explain(a: ExplainArgs) -> Result<ExitCode> {
    if let Some(hz) = a.tick_hz
        && hz != 1000
    {
        bail!(
            "--tick-hz {hz}: wary counts milliseconds, not ticks; give durations in milliseconds \
             (--base-ms, --cap-ms, --budget-ms, --deadline-ms)"
        );
    }
    let mut spec: PolicySpec = match &a.config {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?
        }
        None => PolicySpec::default(),
    };
    macro_rules! flag {
        ($($f:ident),*) => { $( if a.$f.is_some() { spec.$f = a.$f.clone(); } )* };
    }
    flag!(preset, base, cap, budget, deadline, max_attempts, jitter, retry_after);
    match (a.fleet_tokens, a.fleet_ratio) {
        (Some(tokens), Some(ratio_milli)) => spec.fleet = Some(FleetSpec { tokens, ratio_milli }),
        (None, None) => {}
        _ => bail!("--fleet-tokens and --fleet-ratio go together"),
    }
    if let Some(f) = &spec.fleet {
        f.build().map_err(|e| anyhow::anyhow!("fleet budget: {e}"))?;
    }
    let policy = match spec.build() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("wary: {e}");
            if let SpecError::Policy(pe) = &e
                && let Some(why) = explain::why_refused(pe)
            {
                eprintln!("why: {why}");
            }
            if spec.jitter.as_deref() == Some(Jitter::Full.name()) && spec.max_attempts.is_none() {
                eprintln!("warning: full jitter with no attempt cap: waits near 0 spend no budget");
            }
            return Ok(ExitCode::from(2));
        }
    };
    let mut e = explain::explain(&policy, a.known_retry_after.map(Duration::from_secs));
    e.fleet = spec.fleet.and_then(|f| explain::fleet(f.tokens, f.ratio_milli));
    // The device's defaults under the settings given (a gateway states its own in its config).
    if let Some(p) = &spec.pace {
        p.build(wary::PaceSettings::DEVICE).map_err(|e| anyhow::anyhow!("{e}"))?;
        e.pace = explain::pace(p.settings(wary::PaceSettings::DEVICE));
    }
    if let Some(b) = &spec.breaker {
        b.build(wary::BreakerSettings::DEVICE).map_err(|e| anyhow::anyhow!("{e}"))?;
        e.breaker = explain::breaker(b.settings(wary::BreakerSettings::DEVICE));
    }
    if a.json {
        println!("{}", serde_json::to_string(&e)?);
    } else {
        print!("{}", explain::render(&e, &policy));
    }
    Ok(ExitCode::SUCCESS)
}
