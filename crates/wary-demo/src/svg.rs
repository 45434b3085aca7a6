//! The retry timeline as SVG: time across, attempt number up; each attempt a dot coloured by
//! outcome, the wait after it a bar, each verdict marked; phases as background bands; and the
//! requests arriving at the cloud in each second, as a line across the top.

use std::fmt::Write as _;

use wary::{Failure, Instant, Outcome, Verdict};
use wary_gateway::Event;

const W: f64 = 1200.0;
const H: f64 = 420.0;
const LEFT: f64 = 50.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 40.0;
const ROWS: u32 = 10;

fn colour(e: &Event) -> &'static str {
    match e.code {
        Some(503) => "#f08c00",
        Some(429) => "#7b3fbf",
        Some(_) => "#d9480f",
        None if e.outcome == Outcome::Ok.name() => "#2a9d4a",
        None if e.outcome == Failure::BadBody.name() => "#868e96",
        None => "#c92a2a",
    }
}

/// Upstream requests arriving at the cloud in each 1 s bin, from the start of each attempt
/// (its end less its own time), on the gateway's clock.
pub fn arrivals(events: &[Event]) -> Vec<u32> {
    let mut bins: Vec<u32> = Vec::new();
    for e in events {
        let start = e.at.as_millis().saturating_sub(u64::from(e.attempt_time.as_millis()));
        let bin = usize::try_from(start / 1000).unwrap_or(usize::MAX);
        if bins.len() <= bin {
            bins.resize(bin + 1, 0);
        }
        if let Some(b) = bins.get_mut(bin) {
            *b += 1;
        }
    }
    bins
}

/// The SVG text for `events` and the phase `bands` (name, start, end), on the gateway's clock.
pub fn timeline(events: &[Event], bands: &[(&str, Instant, Instant)]) -> String {
    let end = events
        .iter()
        .map(|e| e.at + e.wait)
        .chain(bands.iter().map(|b| b.2))
        .map(Instant::as_millis)
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let x = |t: Instant| LEFT + (W - LEFT - 10.0) * (t.as_millis() as f64 / end);
    let row_h = (H - TOP - BOTTOM) / f64::from(ROWS);
    let y = |attempt: u32| H - BOTTOM - row_h * (f64::from(attempt.clamp(1, ROWS)) - 0.5);
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"11\">\
         <rect width=\"{W}\" height=\"{H}\" fill=\"white\"/>"
    );
    let shades = ["#f8f9fa", "#fff4e6", "#f3f0ff", "#fff5f5", "#ffe3e3", "#ebfbee"];
    for (i, (name, a, b)) in bands.iter().enumerate() {
        let _ = write!(
            s,
            "<rect x=\"{:.1}\" y=\"{TOP}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\">{name}</text>",
            x(*a),
            (x(*b) - x(*a)).max(0.0),
            H - TOP - BOTTOM,
            shades.get(i % shades.len()).copied().unwrap_or("#fff"),
            x(*a) + 3.0,
            TOP - 8.0,
        );
    }
    for k in 1..=ROWS {
        let label = if k == ROWS { format!("{k}+") } else { k.to_string() };
        let _ = write!(s, "<text x=\"8\" y=\"{:.1}\">#{label}</text>", y(k) + 4.0);
    }
    let _ = write!(
        s,
        "<text x=\"{LEFT}\" y=\"{:.1}\">time → ({:.0} s)   attempt number ↑   dot: attempt (green ok, orange 503, purple 429, \
         red other failure)   blue bar: wait   ✕ gave up   ▲ unknown</text>",
        H - 12.0,
        end / 1000.0
    );
    // Arrivals per second, scaled so the busiest second reaches a third of the plot's height.
    let bins = arrivals(events);
    let peak = bins.iter().copied().max().unwrap_or(0).max(1);
    let band = (H - TOP - BOTTOM) / 3.0;
    let points: Vec<String> = bins
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let t = Instant::from_millis(i as u64 * 1000 + 500);
            format!("{:.1},{:.1}", x(t), TOP + band - band * f64::from(*n) / f64::from(peak))
        })
        .collect();
    let _ = write!(
        s,
        "<polyline points=\"{}\" fill=\"none\" stroke=\"#495057\" stroke-width=\"1.2\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\" fill=\"#495057\">line: requests arriving at the cloud per second (busiest {peak}/s)</text>",
        points.join(" "),
        W - 420.0,
        TOP + 12.0,
    );
    for e in events.iter().filter(|e| e.wait > wary::Duration::ZERO) {
        let _ = write!(
            s,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.2}\" height=\"3\" fill=\"#1c7ed6\" fill-opacity=\"0.25\"/>",
            x(e.at),
            y(e.attempt) + 4.0,
            (x(e.at + e.wait) - x(e.at)).max(0.5),
        );
    }
    for e in events {
        let (cx, cy) = (x(e.at), y(e.attempt));
        let _ = write!(
            s,
            "<circle cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"2\" fill=\"{}\" fill-opacity=\"0.7\"/>",
            colour(e)
        );
        match e.verdict {
            Some(Verdict::GaveUp(_)) => {
                let _ = write!(
                    s,
                    "<path d=\"M{:.1} {:.1}l6 6m0 -6l-6 6\" stroke=\"black\" stroke-width=\"1\"/>",
                    cx - 3.0,
                    cy - 11.0
                );
            }
            Some(Verdict::Unknown) => {
                let _ = write!(s, "<path d=\"M{cx:.1} {:.1}l4 6h-8z\" fill=\"#e8590c\"/>", cy - 12.0);
            }
            _ => {}
        }
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use wary::{Duration, Key};

    use super::*;

    fn event(end_ms: u64, took_ms: u64) -> Event {
        Event {
            at: Instant::from_millis(end_ms),
            key: Key::from_parts(1, 1, 1),
            attempt: 1,
            attempt_time: Duration::from_millis(took_ms),
            wait: Duration::ZERO,
            outcome: Outcome::Ok.name(),
            code: None,
            verdict: None,
        }
    }

    #[test]
    fn arrivals_are_counted_by_the_second_each_attempt_started() {
        // Ends at 1.2 s after 300 ms: it arrived at 0.9 s, in the first second.
        let events = [event(1_200, 300), event(1_100, 50), event(3_999, 0), event(40, 40)];
        assert_eq!(arrivals(&events), [2, 1, 0, 1]);
        assert!(arrivals(&[]).is_empty());
        let svg = timeline(&events, &[]);
        assert!(svg.contains("<polyline") && svg.contains("busiest 2/s"), "{svg}");
    }
}
