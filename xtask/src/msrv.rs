//! The project's one minimum Rust version: the root workspace's `rust-version` is the source of
//! truth; every workspace of the repository (root, `boards/*`, `firmware/conformance-cores`,
//! `fuzz/`, `bench-size/`) states the same ([`agree`]), and every crate that publishes or ships is built
//! with that toolchain ([`build`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::harness::{TARGET, run_firmware_cargo};
use crate::util::{output, run, step};

/// The crates checked with the minimum toolchain in the root workspace: those meant for the
/// registry, and the outbox the firmware ships.
const ROOT_CRATES: [&str; 4] = ["wary", "wary-host", "wary-reqwest", "wary-outbox"];
/// Firmware workspaces that ship to a device, checked for the board's target.
const SHIPPED: [&str; 2] = ["boards/mps2-an386", "boards/nrf52840-dk"];

/// The root workspace's `[workspace.package] rust-version`, as rustup names the toolchain
/// (three parts).
pub fn rust_version(root: &Path) -> Result<String> {
    let manifest = root.join("Cargo.toml");
    let text =
        std::fs::read_to_string(&manifest).with_context(|| format!("reading {}", manifest.display()))?;
    let table: toml::Table = text.parse().with_context(|| format!("parsing {}", manifest.display()))?;
    let value = table
        .get("workspace")
        .and_then(|w| w.get("package"))
        .and_then(|p| p.get("rust-version"))
        .and_then(|v| v.as_str())
        .with_context(|| format!("{} has no [workspace.package] rust-version", manifest.display()))?;
    Ok(if value.split('.').count() == 2 { format!("{value}.0") } else { value.to_owned() })
}

/// Fails unless every manifest of the repository agrees with the root's `rust-version`: a
/// workspace or package that states one states the same, and every package states one or
/// inherits it from its workspace.
pub fn agree(root: &Path) -> Result<()> {
    let truth = rust_version(root)?;
    step(&format!("MSRV: every workspace's manifests state rust-version {truth}"));
    let mut manifests = vec![];
    collect_manifests(root, root, &mut manifests)?;
    let mut texts = vec![];
    for path in &manifests {
        let text = std::fs::read_to_string(root.join(path))
            .with_context(|| format!("reading {}", path.display()))?;
        texts.push((path.display().to_string(), text));
    }
    let problems = disagreements(&truth, &texts);
    if !problems.is_empty() {
        bail!("rust-version disagrees with the root's {truth}: {}", problems.join("; "));
    }
    eprintln!("    {} manifests agree", texts.len());
    Ok(())
}

/// Every `Cargo.toml` below `dir` (paths relative to `root`), skipping build output and
/// hidden folders.
fn collect_manifests(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                collect_manifests(root, &path, out)?;
            }
        } else if name == "Cargo.toml" {
            out.push(path.strip_prefix(root).unwrap_or(&path).to_path_buf());
        }
    }
    Ok(())
}

/// What disagrees with `truth` (three-part) in each `(path, text)` manifest.
fn disagreements(truth: &str, manifests: &[(String, String)]) -> Vec<String> {
    let same = |value: &str| {
        let three = if value.split('.').count() == 2 { format!("{value}.0") } else { value.to_owned() };
        three == truth
    };
    let mut problems = vec![];
    for (path, text) in manifests {
        let table: toml::Table = match text.parse() {
            Ok(table) => table,
            Err(err) => {
                problems.push(format!("{path}: not TOML ({err})"));
                continue;
            }
        };
        let workspace = table.get("workspace");
        if let Some(value) = workspace.and_then(|w| w.get("package")).and_then(|p| p.get("rust-version")) {
            match value.as_str() {
                Some(v) if same(v) => {}
                _ => problems.push(format!("{path}: [workspace.package] rust-version {value}")),
            }
        } else if workspace.is_some() && table.get("package").is_none() {
            problems.push(format!("{path}: a workspace without [workspace.package] rust-version"));
        }
        let Some(package) = table.get("package") else { continue };
        match package.get("rust-version") {
            None => problems.push(format!("{path}: [package] states no rust-version")),
            Some(toml::Value::String(v)) if same(v) => {}
            Some(toml::Value::Table(t))
                if t.get("workspace").and_then(toml::Value::as_bool) == Some(true) =>
            {
                // Inherited from its workspace, whose own value is checked where it is stated.
            }
            Some(value) => problems.push(format!("{path}: rust-version {value}")),
        }
    }
    problems
}

/// Builds the root's publishable crates and the outbox with the minimum toolchain, and checks
/// each shipped firmware workspace with it for the board's target, installing the toolchain
/// and the target when missing (about 1 min once). `--locked` so the old cargo cannot rewrite a
/// lockfile, and their own target directories so the main builds stay warm. Firmware is
/// checked, not built: the toolchain's front end is what the version bounds, and a release
/// build with LTO would take minutes more.
pub fn build(root: &Path) -> Result<()> {
    let version = rust_version(root)?;
    step(&format!("MSRV: every crate that publishes or ships, with rust {version}"));
    let installed = output("rustup", &["toolchain", "list"]).unwrap_or_default();
    if !installed.lines().any(|l| l.starts_with(&version)) {
        step(&format!("installing the {version} toolchain (minimal profile) for the MSRV build"));
        run(root, "rustup", &["toolchain", "install", &version, "--profile", "minimal"])?;
    }
    run(root, "rustup", &["target", "add", "--toolchain", &version, TARGET])?;
    let toolchain = format!("+{version}");
    let mut args = vec![toolchain.as_str(), "build", "--locked", "--target-dir", "target/msrv"];
    for krate in ROOT_CRATES {
        args.extend(["-p", krate]);
    }
    args.extend(["--features", "wary/runner,wary/payload-key,wary/serde"]);
    run(root, "cargo", &args)?;
    for dir in SHIPPED {
        firmware_check(&root.join(dir), dir, &toolchain)?;
    }
    Ok(())
}

/// `cargo +<toolchain> check --locked --bins` in a firmware workspace.
fn firmware_check(dir: &Path, label: &str, toolchain: &str) -> Result<()> {
    let args = [toolchain, "check", "--release", "--locked", "--bins", "--target-dir", "target/msrv"];
    run_firmware_cargo(dir, label, &args, &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(path: &str, text: &str) -> (String, String) {
        (path.to_owned(), text.to_owned())
    }

    #[test]
    fn agreeing_manifests_pass_in_either_spelling() {
        let all = [
            manifest("Cargo.toml", "[workspace]\n[workspace.package]\nrust-version = \"1.91\"\n"),
            manifest("crates/a/Cargo.toml", "[package]\nname = \"a\"\nrust-version.workspace = true\n"),
            manifest(
                "boards/b/Cargo.toml",
                "[package]\nname = \"b\"\nrust-version = \"1.91.0\"\n[workspace]\n",
            ),
        ];
        assert_eq!(disagreements("1.91.0", &all), Vec::<String>::new());
    }

    #[test]
    fn each_disagreement_is_named_by_its_manifest() {
        let all = [
            manifest("firmware/Cargo.toml", "[workspace]\n[workspace.package]\nrust-version = \"1.85\"\n"),
            manifest("fuzz/Cargo.toml", "[package]\nname = \"f\"\n[workspace]\n"),
            manifest("boards/b/Cargo.toml", "[package]\nname = \"b\"\nrust-version = \"1.87\"\n"),
            manifest("bench-size/Cargo.toml", "[workspace]\n"),
            manifest("bad/Cargo.toml", "[package\n"),
        ];
        let problems = disagreements("1.91.0", &all);
        assert_eq!(problems.len(), 5, "{problems:?}");
        for path in ["firmware/", "fuzz/", "boards/b/", "bench-size/", "bad/"] {
            assert!(problems.iter().any(|p| p.starts_with(path)), "{path} not named in {problems:?}");
        }
    }

    /// The repository itself agrees: the check `cargo xtask ci` runs.
    #[test]
    fn this_repository_agrees() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        agree(root).unwrap();
    }
}
