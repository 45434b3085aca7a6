//! Tables (markdown, printed as-is) and the plot (hand-written SVG).

use std::fmt::Write as _;

use crate::sim::{Stats, World};

/// A markdown table from a header and rows.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| {} |", header.join(" | "));
    // Names left, figures right.
    let align: Vec<&str> = (0..header.len()).map(|i| if i == 0 { "---" } else { "---:" }).collect();
    let _ = writeln!(s, "|{}|", align.join("|"));
    for r in rows {
        let _ = writeln!(s, "| {} |", r.join(" | "));
    }
    s
}

/// One simulated cell: a contender, with or without the fleet budget, at one fleet size.
#[derive(Debug, Clone)]
pub struct Cell {
    /// The contender's name.
    pub name: &'static str,
    /// With the fleet budget.
    pub fleet: bool,
    /// The fleet budget's label ("off" without one).
    pub fleet_label: String,
    /// One bucket per client rather than one for all.
    pub per_client: bool,
    /// The contended run's world.
    pub world: World,
    /// The contended run.
    pub contended: Stats,
    /// The same clients in a total outage.
    pub outage: Stats,
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The simulation table.
pub fn sim_table(cells: &[Cell]) -> String {
    let header = [
        "policy",
        "fleet budget",
        "clients",
        "total calls",
        "calls/client",
        "succeeded",
        "gave up",
        "throttled",
        "completion (ms)",
        "peak calls/tick after t=0",
        "outage calls/client",
    ];
    let rows: Vec<Vec<String>> = cells
        .iter()
        .map(|c| {
            let s = &c.contended;
            let stop = if s.truncated { "≥" } else { "" };
            vec![
                c.name.to_owned(),
                c.fleet_label.clone(),
                thousands(u64::from(c.world.clients)),
                format!("{stop}{}", thousands(s.calls)),
                format!("{stop}{:.2}", s.amplification(c.world.clients)),
                thousands(s.succeeded),
                thousands(s.gave_up),
                thousands(s.throttled),
                if s.truncated { format!("> {}", thousands(s.completion)) } else { thousands(s.completion) },
                thousands(s.peak_per_tick),
                format!("{:.3}", c.outage.amplification(c.world.clients)),
            ]
        })
        .collect();
    table(&header, &rows)
}

const COLORS: [&str; 6] = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#7f7f7f"];

/// Two log-log panels, calls per client and completion time against clients, one line per
/// contender without the fleet budget (the study's shape), and a third with outage
/// amplification with and without it.
pub fn svg(cells: &[Cell], names: &[&'static str]) -> String {
    let (w, h, pad) = (330.0_f64, 260.0_f64, 48.0_f64);
    let mut s = String::new();
    let total_w = 3.0 * (w + pad) + pad;
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{}" font-family="sans-serif" font-size="11">"#,
        h + 2.0 * pad + 20.0 * names.len() as f64 / 2.0
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    type Metric = fn(&Cell) -> f64;
    let panels: [(&str, Metric, bool); 3] = [
        ("calls per client (contended)", |c| c.contended.amplification(c.world.clients), false),
        ("completion time, ms (contended)", |c| c.contended.completion.max(1) as f64, false),
        (
            "calls per client in a 60 s outage (dashed: fleet budget)",
            |c| c.outage.amplification(c.world.clients),
            true,
        ),
    ];
    let xs: Vec<f64> = {
        let mut v: Vec<f64> = cells.iter().map(|c| f64::from(c.world.clients)).collect();
        v.sort_by(f64::total_cmp);
        v.dedup();
        v
    };
    let (x0, x1) =
        (xs.first().copied().unwrap_or(1.0).log10(), xs.last().copied().unwrap_or(10.0).log10().max(1e-9));
    for (p, (title, metric, with_fleet)) in panels.iter().enumerate() {
        let ox = pad + p as f64 * (w + pad);
        let oy = pad;
        // The plot shows the shared bucket; per-client buckets are in the table.
        let chosen: Vec<&Cell> =
            cells.iter().filter(|c| !c.per_client && (*with_fleet || !c.fleet)).collect();
        let ys: Vec<f64> = chosen.iter().map(|c| metric(c).max(1e-3)).collect();
        let y0 = ys.iter().copied().fold(f64::INFINITY, f64::min).log10().floor();
        let y1 = ys.iter().copied().fold(0.0, f64::max).log10().ceil().max(y0 + 1.0);
        let px = |x: f64| ox + (x.log10() - x0) / (x1 - x0).max(1e-9) * w;
        let py = |y: f64| oy + h - (y.max(1e-3).log10() - y0) / (y1 - y0) * h;
        let _ =
            writeln!(s, r##"<rect x="{ox}" y="{oy}" width="{w}" height="{h}" fill="none" stroke="#444"/>"##);
        let _ = writeln!(s, r#"<text x="{ox}" y="{}" font-weight="bold">{title}</text>"#, oy - 8.0);
        for x in &xs {
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
                px(*x),
                oy + h + 14.0,
                thousands(*x as u64)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">clients</text>"#,
            ox + w / 2.0,
            oy + h + 28.0
        );
        let mut e = y0;
        while e <= y1 {
            let y = 10f64.powf(e);
            let (x2, ly) = (ox + w, py(y));
            let _ = writeln!(s, r##"<line x1="{ox}" x2="{x2}" y1="{ly}" y2="{ly}" stroke="#ddd"/>"##);
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
                ox - 4.0,
                py(y) + 4.0,
                fmt_pow(e)
            );
            e += 1.0;
        }
        for (i, name) in names.iter().enumerate() {
            for fleet in [false, true] {
                if fleet && !with_fleet {
                    continue;
                }
                let pts: Vec<String> = chosen
                    .iter()
                    .filter(|c| c.name == *name && c.fleet == fleet && !c.per_client)
                    .map(|c| format!("{:.1},{:.1}", px(f64::from(c.world.clients)), py(metric(c))))
                    .collect();
                let dash = if fleet { r#" stroke-dasharray="4 3""# } else { "" };
                let _ = writeln!(
                    s,
                    r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"#,
                    pts.join(" "),
                    COLORS[i % COLORS.len()]
                );
            }
        }
    }
    for (i, name) in names.iter().enumerate() {
        let x = pad + (i % 3) as f64 * 160.0;
        let y = h + 2.0 * pad + 10.0 + (i / 3) as f64 * 16.0;
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="{}" width="14" height="4" fill="{}"/>"#,
            y - 4.0,
            COLORS[i % COLORS.len()]
        );
        let _ = writeln!(s, r#"<text x="{}" y="{y}">{name}</text>"#, x + 18.0);
    }
    s.push_str("</svg>\n");
    s
}

fn fmt_pow(e: f64) -> String {
    let v = 10f64.powf(e);
    if v >= 1.0 { thousands(v.round() as u64) } else { format!("{v}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }
}
