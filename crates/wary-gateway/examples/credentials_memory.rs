//! What 100,000 device credentials and their admission buckets take in memory: the growth of
//! the process's resident set (VmRSS in /proc/self/status) while each is built, the file's
//! text already in memory before the first reading. (A counting allocator would be exact but
//! needs `unsafe`, which the workspace forbids; at these sizes the resident set is within a few
//! pages of the heap.)
//!
//! `cargo run --release -p wary-gateway --example credentials_memory [-- <devices>]`

use std::time::Instant;

use wary_gateway::admission::{Admission, Limits};
use wary_gateway::credentials::{Credentials, Identity};

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn main() -> anyhow::Result<()> {
    let devices: u64 = std::env::args().nth(1).map(|n| n.parse()).transpose()?.unwrap_or(100_000);
    let mut text = String::new();
    let mut tokens = Vec::new();
    for d in 1..=devices {
        let (token, line) = Credentials::issue(d);
        text.push_str(&line);
        text.push('\n');
        if d % 1000 == 1 {
            tokens.push((d, token));
        }
    }
    let rss0 = rss_kib();
    let creds: Credentials = text.parse()?;
    let rss1 = rss_kib();
    let mut admission = Admission::new(Limits { max_devices: devices as usize, ..Limits::default() });
    let now = Instant::now();
    for d in 1..=devices {
        let _ = admission.admit(d, now);
    }
    let rss2 = rss_kib();
    // The credentials work: a sample of tokens identify their devices.
    for (d, t) in &tokens {
        let h = format!("Bearer {t}");
        anyhow::ensure!(creds.identify(Some(h.as_bytes()), Some(*d)) == Identity::Device(*d));
    }
    let (c, b) = (rss1.saturating_sub(rss0), rss2.saturating_sub(rss1));
    let per = |kib: u64| (kib * 1024) as f64 / devices as f64;
    println!(
        "{{\"devices\":{devices},\"credentials_kib\":{c},\"credentials_bytes_per_device\":{:.0},\"buckets_kib\":{b},\"buckets_bytes_per_device\":{:.0}}}",
        per(c),
        per(b)
    );
    anyhow::ensure!(admission.len() == devices as usize && creds.len() == devices as usize);
    Ok(())
}
