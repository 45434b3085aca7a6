//! The core's modules import one another without a circle: each module sits above the ones it
//! uses, so it can be read (and changed) knowing only what is below it. A constant two layers
//! need lives in a leaf both import.
//!
//! Reads `src/*.rs` as text: a module's imports are the `crate::<module>` paths in its code
//! (comments and its unit tests left out), `use crate::{…}` groups included.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic)]
#![allow(clippy::arithmetic_side_effects, clippy::print_stdout, missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each module of `src/` (but `lib.rs`) and the sibling modules its code names.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut texts = BTreeMap::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.extension().is_some_and(|e| e == "rs") && name != "lib" {
            texts.insert(name, std::fs::read_to_string(&path).unwrap());
        }
    }
    let modules: BTreeSet<String> = texts.keys().cloned().collect();
    let mut graph = BTreeMap::new();
    for (name, text) in &texts {
        // The unit tests sit at the bottom of each file, after their `#[cfg(...test...)]`.
        let code_end = text
            .lines()
            .scan(0, |at, line| {
                let start = *at;
                *at += line.len() + 1;
                Some((start, line))
            })
            .find(|(_, line)| line.starts_with("#[cfg(test)]") || line.starts_with("#[cfg(all(test"))
            .map_or(text.len(), |(start, _)| start);
        let code: String = text[..code_end]
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut uses = BTreeSet::new();
        let mut word = |w: &str| {
            if modules.contains(w) && w != name {
                uses.insert(w.to_owned());
            }
        };
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                for item in group.split(',') {
                    word(item.trim().split([':', ' ']).next().unwrap_or(""));
                }
            } else {
                word(rest.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).next().unwrap_or(""));
            }
        }
        graph.insert(name.clone(), uses);
    }
    graph
}

/// The modules in an order where each comes after everything it imports, or the ones left in
/// a circle.
fn layers(graph: &BTreeMap<String, BTreeSet<String>>) -> Result<Vec<String>, BTreeSet<String>> {
    let mut placed: Vec<String> = Vec::new();
    let mut left: BTreeSet<String> = graph.keys().cloned().collect();
    while !left.is_empty() {
        let ready: Vec<String> =
            left.iter().filter(|m| graph[*m].iter().all(|d| placed.contains(d))).cloned().collect();
        if ready.is_empty() {
            return Err(left);
        }
        for m in ready {
            left.remove(&m);
            placed.push(m);
        }
    }
    Ok(placed)
}

#[test]
fn the_core_has_no_import_circle() {
    let graph = imports();
    for (m, uses) in &graph {
        println!("{m:12} -> {}", uses.iter().cloned().collect::<Vec<_>>().join(", "));
    }
    match layers(&graph) {
        Ok(order) => println!("no circle: {}", order.join(" < ")),
        Err(circle) => panic!("modules importing one another in a circle: {circle:?}"),
    }
}

#[test]
fn the_checker_finds_a_circle() {
    let edge = |a: &str, b: &[&str]| (a.to_owned(), b.iter().map(|s| (*s).to_owned()).collect());
    let circle: BTreeMap<String, BTreeSet<String>> = [
        edge("policy", &["ledger"]),
        edge("ledger", &["forms"]),
        edge("forms", &["policy"]),
        edge("time", &[]),
    ]
    .into_iter()
    .collect();
    let left = layers(&circle).unwrap_err();
    assert_eq!(left.into_iter().collect::<Vec<_>>(), ["forms", "ledger", "policy"]);
    let graph = imports();
    // The leaves the format version and the hash live in import nothing.
    assert!(graph["version"].is_empty() && graph["fingerprint"].is_empty());
    // What the checker reads: the policy imports its leaf, not the ledger.
    assert!(graph["policy"].contains("version") && !graph["policy"].contains("ledger"));
}
