//! Where a firmware's flash goes: the sized code and read-only symbols of an ELF
//! (`llvm-nm --print-size --size-sort --demangle`) summed by the crate that owns them.
//!
//! A symbol is owned by the crate its path starts with (`smoltcp::wire::tcp::Repr::parse`); a
//! trait method (`<Type as Trait>::f`) by its type's crate when the type is a path, else (a
//! generic `<&mut S as wary::ledger::Sink>::record`) by the trait's; drop glue
//! (`core::ptr::drop_in_place<T>`) by `T`'s. Where prefixes overlap the longest wins
//! (`embassy_net_ppp` before `embassy_net`). Names in the legacy mangling that llvm-nm leaves
//! half-decoded (`_$LT$..$GT$`, `..` for `::`) are decoded first.
//!
//! [`shares`] sums by the groups of [`GROUPS`]; [`by_crate`] by each owning crate's name, the
//! same symbols with the same owners.
//!
//! The figures are lower bounds per crate: with LTO, code inlined into another crate's function
//! counts for that one (an application's task that inlines the HTTP exchange owns its bytes).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The shares reported, in this order, each with the symbol prefixes it owns; then [`OTHER`].
const GROUPS: &[(&str, &[&str])] = &[
    ("embassy-net/smoltcp", &["smoltcp::", "embassy_net"]),
    ("reqwless", &["reqwless::"]),
    ("embassy-net-ppp/ppproto", &["embassy_net_ppp", "ppproto::"]),
    ("sequential-storage", &["sequential_storage::"]),
    ("wary-outbox", &["wary_outbox::"]),
    ("wary", &["wary::"]),
    ("wary-uplink", &["wary_uplink::"]),
    ("wary-dial", &["wary_dial::"]),
    (
        "TLS (embedded-tls, crypto)",
        &[
            "embedded_tls::",
            "p256::",
            "primeorder::",
            "elliptic_curve::",
            "ecdsa::",
            "der::",
            "aes::",
            "aes_gcm::",
            "ghash::",
            "polyval::",
            "ctr::",
            "sha2::",
            "hmac::",
            "hkdf::",
            "rand_chacha::",
        ],
    ),
];

/// Flash owned by none of the groups: the application, embassy, the core library, etc.
pub(crate) const OTHER: &str = "other";

/// Runs `llvm_nm` on `elf` and returns the bytes of flash (code and read-only data) each group
/// owns, in [`GROUPS`] order, then [`OTHER`]; the entries add up to the sized flash symbols.
pub(crate) fn shares(llvm_nm: &Path, elf: &Path) -> Result<Vec<(String, u64)>> {
    Ok(tally(&nm(llvm_nm, elf)?))
}

/// Runs `llvm_nm` on `elf` and returns the bytes of flash each owning crate has (the first
/// segment of the owner's path; `(other)` for symbols without one).
pub(crate) fn by_crate(llvm_nm: &Path, elf: &Path) -> Result<BTreeMap<String, u64>> {
    Ok(tally_by_crate(&nm(llvm_nm, elf)?))
}

/// Prints the largest crates of `elf`'s flash beside their share of `other`'s.
pub(crate) fn by_crate_table(llvm_nm: &Path, elf: &Path, other: &Path) -> Result<()> {
    let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mine = by_crate(llvm_nm, elf)?;
    let theirs = by_crate(llvm_nm, other)?;
    let mut rows: Vec<(&String, &u64)> = mine.iter().collect();
    rows.sort_by(|a, b| b.1.cmp(a.1));
    println!("{:<24} {:>10} {:>10}", "crate", name(elf), name(other));
    for (krate, size) in rows.into_iter().take(14) {
        println!("{krate:<24} {size:>10} {:>10}", theirs.get(krate).copied().unwrap_or(0));
    }
    Ok(())
}

/// llvm-nm's listing of `elf`'s sized symbols, demangled.
fn nm(llvm_nm: &Path, elf: &Path) -> Result<String> {
    let out = Command::new(llvm_nm)
        .args(["--print-size", "--size-sort", "--demangle"])
        .arg(elf)
        .output()
        .with_context(|| format!("running {}", llvm_nm.display()))?;
    if !out.status.success() {
        bail!(
            "{} {} failed: {}",
            llvm_nm.display(),
            elf.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).context("llvm-nm printed something that is not UTF-8")
}

/// [`shares`] of llvm-nm's text: `<address> <size> <type> <name>` lines; lines without a size
/// (undefined or absolute symbols) and RAM symbols (`b`, `d`, ...) are not flash and are skipped.
fn tally(nm: &str) -> Vec<(String, u64)> {
    let mut sums = vec![0u64; GROUPS.len() + 1];
    for (size, owner) in flash_symbols(nm) {
        let slot = by_prefix(&owner).unwrap_or(GROUPS.len());
        if let Some(sum) = sums.get_mut(slot) {
            *sum = sum.saturating_add(size);
        }
    }
    GROUPS.iter().map(|(label, _)| *label).chain([OTHER]).map(String::from).zip(sums).collect()
}

/// [`by_crate`] of llvm-nm's text.
fn tally_by_crate(nm: &str) -> BTreeMap<String, u64> {
    let mut sums = BTreeMap::new();
    for (size, owner) in flash_symbols(nm) {
        let first = owner.split("::").next().unwrap_or_default();
        let krate = if !first.is_empty() && first.chars().all(|c| c.is_alphanumeric() || c == '_') {
            first.to_owned()
        } else {
            "(other)".to_owned()
        };
        let sum: &mut u64 = sums.entry(krate).or_default();
        *sum = sum.saturating_add(size);
    }
    sums
}

/// Each flash symbol of llvm-nm's text: its size and its owner's path. Lines without a size
/// (undefined or absolute symbols) and RAM symbols (`b`, `d`, ...) are not flash and are skipped.
fn flash_symbols(nm: &str) -> impl Iterator<Item = (u64, String)> + '_ {
    nm.lines().filter_map(|line| {
        let (size, kind, name) = sized_symbol(line)?;
        // Code (t/T), read-only data (r/R), weak definitions (w/W).
        if !matches!(kind, 't' | 'T' | 'r' | 'R' | 'w' | 'W') {
            return None;
        }
        Some((size, owner(&decode(name)).to_owned()))
    })
}

/// `(size, type, name)` of a line with four fields; the name may hold spaces.
fn sized_symbol(line: &str) -> Option<(u64, char, &str)> {
    let (address, rest) = line.trim_start().split_once(' ')?;
    let (size, rest) = rest.trim_start().split_once(' ')?;
    let (kind, name) = rest.trim_start().split_once(' ')?;
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    let mut kind_chars = kind.chars();
    let (Some(kind), None) = (kind_chars.next(), kind_chars.next()) else { return None };
    if !hex(address) || !hex(size) {
        return None;
    }
    Some((u64::from_str_radix(size, 16).ok()?, kind, name.trim()))
}

/// The path of the code that owns a decoded symbol name: the symbol's own, a trait method's
/// self type's when that is a path, else the trait's; drop glue's type's.
fn owner(name: &str) -> &str {
    let name = name.strip_prefix('_').filter(|n| n.starts_with('<')).unwrap_or(name);
    if let Some(glue) = name.strip_prefix("core::ptr::drop_in_place<") {
        return owner(glue);
    }
    let Some(inner) = name.strip_prefix('<') else { return name };
    let mut ty = inner;
    for prefix in ["&", "mut ", "*const ", "*mut ", "dyn ", "[", "("] {
        while let Some(rest) = ty.strip_prefix(prefix) {
            ty = rest.trim_start();
        }
    }
    let ty_end = ty.find([' ', '<', '>', ',', ';', ']', ')']).unwrap_or(ty.len());
    let self_path = ty.get(..ty_end).unwrap_or(ty);
    if self_path.contains("::") {
        return self_path;
    }
    // A generic or primitive self type: the trait's crate wrote the code.
    inner.split_once(" as ").map_or("", |(_, tr)| tr.trim_start())
}

/// The group whose longest prefix `path` starts with.
fn by_prefix(path: &str) -> Option<usize> {
    GROUPS
        .iter()
        .enumerate()
        .flat_map(|(i, (_, prefixes))| prefixes.iter().map(move |p| (i, *p)))
        .filter(|(_, p)| path.starts_with(p))
        .max_by_key(|(_, p)| p.len())
        .map(|(i, _)| i)
}

/// Decodes rustc's legacy mangling escapes that llvm-nm's demangler leaves (`$LT$` → `<`,
/// `$u20$` → ` `, `..` → `::`) and drops the trailing `::h<16 hex>` hash.
fn decode(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(c) = rest.chars().next() {
        if c == '$'
            && let Some(end) = rest.get(1..).and_then(|r| r.find('$'))
            && let Some(code) = rest.get(1..=end)
            && let Some(ch) = escape(code)
        {
            out.push(ch);
            rest = rest.get(end.saturating_add(2)..).unwrap_or("");
        } else if let Some(tail) = rest.strip_prefix("..") {
            out.push_str("::");
            rest = tail;
        } else {
            out.push(c);
            rest = rest.get(c.len_utf8()..).unwrap_or("");
        }
    }
    if let Some(at) = out.rfind("::h") {
        let hash = out.get(at.saturating_add(3)..).unwrap_or("");
        if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            out.truncate(at);
        }
    }
    out
}

fn escape(code: &str) -> Option<char> {
    Some(match code {
        "LT" => '<',
        "GT" => '>',
        "RF" => '&',
        "BP" => '*',
        "SP" => '@',
        "C" => ',',
        "LP" => '(',
        "RP" => ')',
        _ => char::from_u32(u32::from_str_radix(code.strip_prefix('u')?, 16).ok()?)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as llvm-nm prints them for the nRF52840-DK application (sizes changed to keep the
    /// sums readable), plus the shapes the parser must skip.
    const NM: &str = "\
         U __undefined_symbol
00000100 T __reset_no_size
00012f14 00000100 t wary_dial::chat::Chat::send::_$u7b$$u7b$closure$u7d$$u7d$::h2d2187a2b28f0118
000183b4 00000200 t smoltcp::wire::tcp::Repr::parse::hd9abc83d7764c456
0000e8e0 00000004 t _$LT$$RF$mut$u20$S$u20$as$u20$wary..ledger..Sink$GT$::record::ha30b8c3282118fe0
0000e474 00000010 t wary::budget::_$LT$impl$u20$wary..policy..Policy$GT$::decide_class::h37e5d7f3703d052c
0000db04 00000020 t sequential_storage::queue::QueueIterator$LT$S$C$C$GT$::next_inner::h874a565c0cd89fb1
000169aa 00000040 t httparse::parse_headers_iter_uninit::h8df0f722dd7752df
00010000 00000400 t embassy_net_ppp::Runner::run::_$u7b$$u7b$closure$u7d$$u7d$::h0000000000000001
00010400 00000800 t ppproto::pppos::PPPoS::poll::h0000000000000002
00010c00 00001000 t embassy_net::Stack::set_config_v4::h0000000000000003
00011c00 00002000 t embassy_net_driver_channel::Runner::borrow_split::h0000000000000004
00013c00 00004000 t _$LT$wary_nrf52840_dk..link..LinkAware$LT$T$GT$$u20$as$u20$wary_uplink..transport..Transport$GT$::post::h637402793e1e059e
00017c00 00008000 t _$LT$embassy_net..tcp..TcpSocket$u20$as$u20$embedded_io_async..Write$GT$::write::h0000000000000005
0001fc00 00010000 t core::ptr::drop_in_place$LT$reqwless..request..Request$LT$$RF$$u5b$u8$u5d$$GT$$GT$::h0000000000000006
0002fc00 00020000 r wary_uplink::http::post::CONSTANT::h0000000000000007
0004fc00 00040000 T <wary_outbox::Outbox<F, E> as core::fmt::Debug>::fmt
0008fc00 00080000 t <&mut S as wary::ledger::Sink>::record
20006a88 00000490 b wary_nrf52840_dk::RESOURCES::ha7f4f30e2ae80285
20000000 00000050 d wary::SOME_DATA::h0000000000000008
";

    fn share(shares: &[(String, u64)], label: &str) -> u64 {
        shares.iter().find(|(l, _)| l == label).map(|(_, n)| *n).unwrap_or_else(|| panic!("no share {label}"))
    }

    #[test]
    fn sums_each_crate_by_owner_and_skips_ram_and_unsized_symbols() {
        let shares = tally(NM);
        let labels: Vec<&str> = shares.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(
            labels,
            [
                "embassy-net/smoltcp",
                "reqwless",
                "embassy-net-ppp/ppproto",
                "sequential-storage",
                "wary-outbox",
                "wary",
                "wary-uplink",
                "wary-dial",
                "TLS (embedded-tls, crypto)",
                "other"
            ]
        );
        // smoltcp, embassy_net, embassy_net_driver_channel, and a trait impl on a TcpSocket.
        assert_eq!(share(&shares, "embassy-net/smoltcp"), 0x200 + 0x1000 + 0x2000 + 0x8000);
        // The longest prefix wins: embassy_net_ppp is not embassy-net's.
        assert_eq!(share(&shares, "embassy-net-ppp/ppproto"), 0x400 + 0x800);
        // Drop glue belongs to the type dropped.
        assert_eq!(share(&shares, "reqwless"), 0x10000);
        assert_eq!(share(&shares, "sequential-storage"), 0x20);
        // A trait impl on a wary_outbox type, fully demangled (spaces in the name).
        assert_eq!(share(&shares, "wary-outbox"), 0x40000);
        // Generic self types defer to the trait's crate; `wary::` is not `wary_outbox::`.
        // The `d` symbol is RAM and does not count.
        assert_eq!(share(&shares, "wary"), 0x4 + 0x10 + 0x80000);
        // Read-only data counts; the application's own impl of an uplink trait does not.
        assert_eq!(share(&shares, "wary-uplink"), 0x20000);
        assert_eq!(share(&shares, "wary-dial"), 0x100);
        // httparse and the application's LinkAware::post.
        assert_eq!(share(&shares, OTHER), 0x40 + 0x4000);
    }

    #[test]
    fn sums_by_owning_crate_with_the_same_owners() {
        let crates = tally_by_crate(NM);
        let get = |k: &str| crates.get(k).copied().unwrap_or(0);
        assert_eq!(get("smoltcp"), 0x200);
        assert_eq!(get("embassy_net"), 0x1000 + 0x8000);
        assert_eq!(get("embassy_net_driver_channel"), 0x2000);
        assert_eq!(get("reqwless"), 0x10000);
        assert_eq!(get("wary"), 0x4 + 0x10 + 0x80000);
        assert_eq!(get("wary_nrf52840_dk"), 0x4000);
        assert_eq!(get("wary_outbox"), 0x40000);
        assert_eq!(get("httparse"), 0x40);
        // RAM symbols are not flash, in either tally.
        assert_eq!(crates.values().sum::<u64>(), tally(NM).iter().map(|(_, n)| n).sum::<u64>());
    }

    #[test]
    fn a_missing_llvm_nm_is_an_error_naming_it() {
        let err = shares(Path::new("/nonexistent/llvm-nm"), Path::new("firmware.elf")).unwrap_err();
        assert!(format!("{err:#}").contains("/nonexistent/llvm-nm"), "{err:#}");
    }

    #[test]
    fn decodes_legacy_escapes_and_drops_the_hash() {
        assert_eq!(
            decode("_$LT$$RF$mut$u20$S$u20$as$u20$wary..ledger..Sink$GT$::record::ha30b8c3282118fe0"),
            "_<&mut S as wary::ledger::Sink>::record"
        );
        assert_eq!(decode("a::b::hnot_a_hash"), "a::b::hnot_a_hash");
        assert_eq!(decode("x$zz$y"), "x$zz$y");
    }
}
