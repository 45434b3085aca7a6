//! The device image's panic sites in wary's `no_std` crates (`wary`, `wary-outbox`,
//! `wary-dial`): each must be an `async` body's guard, nothing else.
//!
//! The three crates deny the lints that name a panic (`unwrap`, indexing, arithmetic, ...), and
//! `cargo xtask ci` proves the core's decision path built alone links no panic code. A lint does
//! not see every call that may panic, though (`copy_from_slice` checks its lengths), and the
//! decision path is not all the firmware uses. So this reads what the linked image keeps: every
//! panic site leaves a `core::panic::Location` in `.rodata` (the file's path, line and column).
//! The one kind a crate cannot avoid is the guard every `async fn` and `async` block carries
//! against being polled after it finished (`panic_const_async_fn_resumed`), whose location is
//! the body's opening brace or its `async`. Any other location in those crates' sources fails.

use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::util::output;

/// The crates whose panic sites must all be `async` guards (the ones that deny the panic lints),
/// as their sources' folders.
const NO_PANIC: [&str; 3] = ["crates/wary/src/", "crates/wary-outbox/src/", "crates/wary-dial/src/"];

/// One `core::panic::Location` read from the image.
#[derive(Debug, PartialEq, Eq)]
struct Site {
    file: String,
    line: u32,
    column: u32,
}

/// Checks the firmware image `elf`; `llvm_size` locates the LLVM tools beside it. Prints how
/// many panic sites the image holds and how many are in the checked crates.
pub fn check(root: &Path, llvm_size: &Path, elf: &Path) -> Result<()> {
    let readobj = llvm_size.with_file_name("llvm-readobj");
    let elf_arg = elf.to_str().context("ELF path is not UTF-8")?;
    let sections = output(readobj.to_str().context("tool path is not UTF-8")?, &["--sections", elf_arg])
        .with_context(|| format!("llvm-readobj --sections {}", elf.display()))?;
    let (address, offset, size) =
        rodata(&sections).with_context(|| format!("{}: no .rodata section", elf.display()))?;
    let image = std::fs::read(elf).with_context(|| format!("reading {}", elf.display()))?;
    let start = usize::try_from(offset)?;
    let end = start.checked_add(usize::try_from(size)?).context(".rodata past the file's end")?;
    let data = image.get(start..end).context(".rodata past the file's end")?;
    let sites = locations(data, address);
    if sites.is_empty() {
        bail!(
            "{}: no panic location found in .rodata; the layout this check reads may have changed",
            elf.display()
        );
    }
    let ours: Vec<&Site> = sites.iter().filter(|s| NO_PANIC.iter().any(|dir| s.file.contains(dir))).collect();
    let mut offending = Vec::new();
    for site in &ours {
        if !is_async_guard(root, site)? {
            offending.push(format!("{}:{}:{}", site.file, site.line, site.column));
        }
    }
    if !offending.is_empty() {
        bail!(
            "{}: a panic site in wary, wary-outbox or wary-dial that is not an async body's guard:\n{}",
            elf.display(),
            offending.join("\n")
        );
    }
    let name = elf.file_name().and_then(|n| n.to_str()).unwrap_or("image");
    eprintln!(
        "    {name}: {} panic sites, {} of them in wary, wary-outbox and wary-dial (all async bodies' guards)",
        sites.len(),
        ours.len()
    );
    Ok(())
}

/// The address, file offset and size of `.rodata` from `llvm-readobj --sections`.
fn rodata(sections: &str) -> Option<(u64, u64, u64)> {
    let block =
        sections.split("Section {").find(|b| b.lines().any(|l| l.trim().starts_with("Name: .rodata (")))?;
    let field = |name: &str| -> Option<u64> {
        let value = block.lines().find_map(|l| l.trim().strip_prefix(name))?.trim();
        match value.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => value.parse().ok(),
        }
    };
    Some((field("Address:")?, field("Offset:")?, field("Size:")?))
}

/// Every `core::panic::Location` in `data` (a 32-bit image's `.rodata` loaded at `address`):
/// a word-aligned pointer into `data` and length naming a `.rs` path, then a line and column.
fn locations(data: &[u8], address: u64) -> Vec<Site> {
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(data.get(at..at.checked_add(4)?)?.try_into().ok()?))
    };
    let mut sites = Vec::new();
    let mut at = 0usize;
    while at.saturating_add(16) <= data.len() {
        if let Some(site) = (|| {
            let (ptr, len, line, column) = (word(at)?, word(at + 4)?, word(at + 8)?, word(at + 12)?);
            if !(1..=4096).contains(&len) || !(1..=1_000_000).contains(&line) || !(1..=4096).contains(&column)
            {
                return None;
            }
            let from = usize::try_from(u64::from(ptr).checked_sub(address)?).ok()?;
            let text = data.get(from..from.checked_add(usize::try_from(len).ok()?)?)?;
            let file = std::str::from_utf8(text).ok()?;
            file.ends_with(".rs").then(|| Site { file: file.to_owned(), line, column })
        })() {
            sites.push(site);
        }
        at += 4;
    }
    sites
}

/// Whether `site` points at an `async` body: its column is the body's `{` or its `async`.
fn is_async_guard(root: &Path, site: &Site) -> Result<bool> {
    let relative = NO_PANIC
        .iter()
        .find_map(|dir| site.file.find(dir).map(|at| &site.file[at..]))
        .context("not one of the checked crates")?;
    let path = root.join(relative);
    let source = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let line = source.lines().nth(usize::try_from(site.line)?.saturating_sub(1)).unwrap_or_default();
    let rest: String = line.chars().skip(usize::try_from(site.column)?.saturating_sub(1)).collect();
    if rest.starts_with("async") {
        return Ok(true);
    }
    if !rest.starts_with('{') {
        return Ok(false);
    }
    // A brace opens an async body only if it opens an `async fn`'s: the signature (which may run
    // over several lines) reaches back to its `fn` with no other brace or `;` between.
    let line_no = usize::try_from(site.line)?;
    let before: String = line.chars().take(usize::try_from(site.column)?.saturating_sub(1)).collect();
    let mut head = before;
    for earlier in source.lines().take(line_no.saturating_sub(1)).collect::<Vec<_>>().iter().rev().take(40) {
        if head.contains("fn ") {
            break;
        }
        head = format!("{earlier} {head}");
    }
    let Some(at) = head.rfind("fn ") else { return Ok(false) };
    let (item, signature) = head.split_at(at);
    // A `;` inside brackets is an array type's length, not the end of a statement.
    let mut depth = 0u32;
    let ends = signature.chars().any(|c| {
        match c {
            '[' => depth = depth.saturating_add(1),
            ']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        c == '{' || (c == ';' && depth == 0)
    });
    Ok(item.contains("async ") && !ends)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `.rodata` image: a path, then a `Location` naming it.
    fn image(address: u32, path: &str, line: u32, column: u32) -> Vec<u8> {
        let mut data = path.as_bytes().to_vec();
        while !data.len().is_multiple_of(4) {
            data.push(0);
        }
        for word in [address, path.len() as u32, line, column] {
            data.extend_from_slice(&word.to_le_bytes());
        }
        data
    }

    #[test]
    fn a_location_is_read_back_from_its_words() {
        let data = image(0x2_0000, "/x/crates/wary/src/run.rs", 307, 5);
        assert_eq!(
            locations(&data, 0x2_0000),
            vec![Site { file: "/x/crates/wary/src/run.rs".into(), line: 307, column: 5 }]
        );
        assert!(locations(&data, 0x1_0000).is_empty(), "a pointer outside the section is not one");
    }

    #[test]
    fn only_an_async_body_passes() {
        let root = std::env::temp_dir().join(format!("wary-panic-sites-{}", std::process::id()));
        let dir = root.join("crates/wary/src");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("a.rs"),
            "pub async fn go(\n    x: [u8; 2],\n) -> u8\n{\n    let f = async move { 1 };\n    if x > 1 {\n    }\n    x\n}\nfn copy(a: &mut [u8]) {\n    a.copy_from_slice(&[1]);\n}\n",
        )
        .unwrap();
        let site = |line, column| Site { file: "/elsewhere/crates/wary/src/a.rs".into(), line, column };
        assert!(is_async_guard(&root, &site(4, 1)).unwrap(), "the async fn's brace");
        assert!(is_async_guard(&root, &site(5, 13)).unwrap(), "the async block");
        assert!(!is_async_guard(&root, &site(6, 14)).unwrap(), "a brace inside the async fn");
        assert!(!is_async_guard(&root, &site(10, 24)).unwrap(), "a plain fn's brace");
        assert!(!is_async_guard(&root, &site(11, 7)).unwrap(), "a call that may panic");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
