//! `cargo xtask mutants`: cargo-mutants over the core's decision path, with the tests that
//! exercise it (the core's own and `wary-tests`' exhaustive, property and conformance suites).
//!
//! A mutant that survives is a rule no test pins: a `>` that could be `>=` at the budget, a cap
//! that could be dropped from the ceiling. The run fails if any mutant survives; a survivor that
//! is equivalent (no input can tell it from the original) is explained in `docs/semantics.md`'s
//! notes and excluded by name in [`EXCLUDE`], so the list of accepted survivors is reviewed code.
//!
//! Each mutant rebuilds the core and every crate the tests link, so a full run takes a while on
//! two cores: `--file` narrows it to one source file, `--shard k/n` to a slice of the mutants.

use std::path::Path;

use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::util::{ensure_cargo_install, run, step};

/// The core's decision path, with the send rate and the breaker that gate each attempt: the
/// files whose every mutant a test must catch.
pub const FILES: &[&str] = &[
    "crates/wary/src/backoff.rs",
    "crates/wary/src/breaker.rs",
    "crates/wary/src/classify.rs",
    "crates/wary/src/decide.rs",
    "crates/wary/src/drain.rs",
    "crates/wary/src/pace.rs",
    "crates/wary/src/plan.rs",
    "crates/wary/src/policy.rs",
    "crates/wary/src/retry_after.rs",
    "crates/wary/src/step.rs",
    "crates/wary/src/throttle.rs",
    "crates/wary/src/time.rs",
];

/// Mutants no test can kill, each with why (cargo-mutants' `--exclude-re` patterns over the
/// mutant's name).
pub const EXCLUDE: &[&str] = &[
    // Compiled only with the `defmt` feature, which the host tests do not enable: every mutant
    // of it builds and "survives" untested. Log formatting is not a decision.
    "defmt::Format",
    // The const min and max of two durations: at equality either operand is the answer, so
    // `<` → `<=` (and `>` → `>=`) gives the same result for every input. Their other mutants
    // (`==`, the reversed comparison, a constant result) are tested.
    r"replace < with <= in Duration::min",
    r"replace > with >= in Duration::max",
    // A percent draw built out of range counts as 99: at exactly 99 both branches give 99, so
    // `>` → `>=` is the same for every input (out of range, in range and 99 itself are tested).
    r"replace > with >= in Draw::scale",
    // Saturation at `u32::MAX`: at exactly that many milliseconds both branches give it.
    r"replace > with >= in Duration::from_millis",
    // Setting two bits a mask has just cleared: `|` and `^` give the same bits.
    r"replace \| with \^ in Table::put",
    r"replace \| with \^ in Table::with_transport",
    // The smaller of the attempt cap's and the budget's counts: at equality either is the answer.
    r"replace < with <= in Policy::max_retries",
    // The doubling at which the ceiling becomes the cap: where the doubled base equals the cap,
    // the shifted base and the cap are the same ceiling, so stopping there or one doubling
    // later gives every retry the same ceiling.
    r"replace < with <= in Policy::with_cap_shift",
    // `max_retries` divides once the shortest wait stops changing (the ceiling at the cap, or
    // decorrelated jitter, whose shortest wait is always the base) and otherwise walks one retry
    // at a time up to the 33rd, where it divides anyway. Dropping the `!` before the
    // decorrelated test only moves equal, full and no jitter to the walk, which reaches the same
    // count by the 33rd retry: no input can tell. (`||` → `&&` beside it is not excluded: with
    // decorrelated jitter and the longest budget it walks four billion retries, and a test
    // times out.)
    r"delete ! in Policy::retries_within",
    // The breaker's wait: the open time left (`until − now`) and a probe's time left
    // (`open − (now − since)`) are saturating differences, zero once the time is past, so each
    // guard (`now < until`, `now − since < open`) and its `<` → `<=` give the same wait for
    // every input. Without the guards the device's image is 40 bytes larger.
    r"replace match guard .* with true in Breaker::wait",
    r"replace < with <= in Breaker::wait",
];

/// The test targets of `wary-tests` that exercise the decision path and run in seconds. The
/// exhaustive walk (a minute in a debug build) and the end-to-end gateway tests (sockets) are
/// left out: every mutant would pay for them.
pub const CROSS_TESTS: &[&str] = &["conformance", "bad_input", "properties"];

/// Runs cargo-mutants over `files` (all of [`FILES`] when empty), optionally one shard.
/// `core_only` runs the core's own tests alone: a few seconds a mutant instead of a rebuild of
/// every crate `wary-tests` links, for a quick pass while writing tests.
pub fn mutants(
    root: &Path,
    files: &[String],
    shard: Option<&str>,
    list: bool,
    core_only: bool,
) -> Result<()> {
    ensure_cargo_install("cargo-mutants", "cargo-mutants", &[])?;
    let chosen: Vec<String> =
        if files.is_empty() { FILES.iter().map(|f| (*f).to_owned()).collect() } else { files.to_vec() };
    let mut args: Vec<String> = ["mutants", "-p", "wary", "--test-package", "wary", "--all-features"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    // Unit and integration tests, not doctests: the examples show the API, the tests pin the
    // rules, and compiling every example again for each mutant would double the run.
    let mut test_args = vec!["--lib".to_owned(), "--test".to_owned(), "runner".to_owned()];
    if !core_only {
        args.extend(["--test-package".to_owned(), "wary-tests".to_owned()]);
        // cargo-mutants 27 tests only the mutated package even with `--test-package` when `-p`
        // is given, so the package and its targets also go to `cargo test` directly.
        test_args.push("--package=wary-tests".to_owned());
        for t in CROSS_TESTS {
            test_args.extend(["--test".to_owned(), (*t).to_owned()]);
        }
    }
    for a in test_args {
        args.push(format!("--cargo-test-arg={a}"));
    }
    for f in &chosen {
        args.push("-f".into());
        args.push(f.clone());
    }
    for e in EXCLUDE {
        args.push("--exclude-re".into());
        args.push((*e).to_owned());
    }
    if let Some(s) = shard {
        args.push("--shard".into());
        args.push(s.to_owned());
    }
    // A fixed test timeout: cargo-mutants derives one from its baseline, which tests only the
    // mutated package, and the cross-crate suites take longer than that on a busy machine.
    // The core's own tests take well under a second: a minute is a hang.
    let timeout = if core_only { "60" } else { "300" };
    args.extend(["--timeout".to_owned(), timeout.to_owned()]);
    // Beside the build outputs, so a run leaves nothing to commit.
    args.extend(["--output".to_owned(), "target".to_owned()]);
    if list {
        args.push("--list".into());
    }
    step(&format!(
        "cargo-mutants over {} file(s){}: every mutant must be caught",
        chosen.len(),
        shard.map(|s| format!(", shard {s}")).unwrap_or_default()
    ));
    if list {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        return run(root, "cargo", &refs);
    }
    eprintln!("    $ cargo {}", args.join(" "));
    let status =
        Command::new("cargo").args(&args).current_dir(root).status().context("starting cargo mutants")?;
    let out = root.join("target/mutants.out");
    // cargo-mutants' exit codes: 0 every mutant caught, 2 some missed, 3 some timed out. A run
    // with both missed and timed-out mutants exits 3, so the missed list is read as well.
    let missed = std::fs::read_to_string(out.join("missed.txt")).unwrap_or_default();
    let missed = missed.lines().filter(|l| !l.trim().is_empty()).count();
    if missed > 0 && matches!(status.code(), Some(0 | 2 | 3)) {
        bail!("{missed} mutant(s) survived: {}/missed.txt lists them; pin each with a test", out.display());
    }
    match status.code() {
        Some(0) => eprintln!("no mutant survived (details: {}/outcomes.json)", out.display()),
        // A mutant that makes a test hang is caught: the test never passes.
        Some(3) => eprintln!(
            "no mutant survived; some made a test hang and were stopped ({}/timeout.txt)",
            out.display()
        ),
        _ => bail!("cargo mutants failed ({status}); see {}/debug.log", out.display()),
    }
    Ok(())
}
