//! Devices' dead letters: what a device reports of the readings its server refused as they are.
//!
//! While a device holds dead letters on its flash, every HTTP request it sends carries
//!
//! ```text
//! Wary-Dead-Letters: held=<u32>, dropped=<u32>
//! ```
//!
//! an RFC 8941 structured-field dictionary with two integer members: `held`, the letters on its
//! flash now, and `dropped`, the letters it dropped over its life to make room. The gateway
//! keeps the last report of each authenticated device and shows it on `/metrics`
//! (`wary_gateway_device_dead_letters`, `wary_gateway_device_dead_letters_dropped`).
//!
//! - The field is parsed as RFC 8941 says (§4.2, by the `sfv` crate): members in any order, optional whitespace
//!   around the commas, parameters on a member and members of other names ignored, a key given
//!   twice taken at its last value, several field lines joined with commas first. `held` and
//!   `dropped` must both be there and both be integers in `0..=u32::MAX`.
//! - A malformed field is ignored, whole: it never refuses the reading, and it is never logged
//!   (only counted, `wary_gateway_dead_letter_reports_total{result="malformed"}`). An absent one
//!   changes nothing.
//! - Only a device that proved who it is reports, and its report is its own: the gateway files
//!   it under the authenticated device (the token's, or the client certificate's), never under a
//!   device the request names.
//! - The map is bounded: only devices the credentials file lists get an entry (a reload drops
//!   the entries of devices no longer listed), and at most [`MAX_DEVICES`] of them; a report
//!   from a further device is counted `untracked` and not kept.
//!
//! ```
//! use wary_gateway::dead_letters::Report;
//! assert_eq!(Report::parse(b"dropped=0,held=3"), Some(Report { held: 3, dropped: 0 }));
//! assert_eq!(Report::parse(b"held=3"), None);
//! assert_eq!(Report::parse(b"held=-1, dropped=0"), None);
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;

use http::{HeaderMap, HeaderName};

use crate::credentials::device_hex;

/// The request header a device reports its dead letters in (field names are case-insensitive).
pub const HEADER: HeaderName = HeaderName::from_static("wary-dead-letters");

/// Most devices whose last report is kept (the admission map's default bound too).
pub const MAX_DEVICES: usize = 100_000;

/// One device's report: `held=<u32>, dropped=<u32>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// Letters on the device's flash now.
    pub held: u32,
    /// Letters the device dropped over its life to make room.
    pub dropped: u32,
}

impl Report {
    /// The report in one field value, if it is a well-formed RFC 8941 dictionary (read by the
    /// `sfv` crate) whose `held` and `dropped` members are integers in `0..=u32::MAX`; other
    /// members, and parameters, are ignored.
    pub fn parse(value: &[u8]) -> Option<Report> {
        let dictionary: sfv::Dictionary = sfv::Parser::new(value).parse().ok()?;
        let count = |name: &str| match dictionary.get(name)? {
            sfv::ListEntry::Item(item) => {
                let n: i64 = item.bare_item.as_integer()?.into();
                u32::try_from(n).ok()
            }
            sfv::ListEntry::InnerList(_) => None,
        };
        Some(Report { held: count("held")?, dropped: count("dropped")? })
    }

    /// The report in `headers`: `None` if there is no such field, `Some(None)` if there is and
    /// it is malformed. Several field lines are one value joined with commas (RFC 9110, 5.3).
    pub fn from_headers(headers: &HeaderMap) -> Option<Option<Report>> {
        let mut lines = headers.get_all(HEADER).iter();
        let first = lines.next()?;
        let mut joined: Option<Vec<u8>> = None;
        for more in lines {
            let j = joined.get_or_insert_with(|| first.as_bytes().to_vec());
            j.extend_from_slice(b", ");
            j.extend_from_slice(more.as_bytes());
        }
        Some(Report::parse(joined.as_deref().unwrap_or(first.as_bytes())))
    }
}

/// The last report of each device, bounded, and the reports counted by what became of them.
#[derive(Debug, Clone, Default)]
pub struct DeadLetters {
    devices: BTreeMap<u64, Report>,
    /// Reports kept (a device's first, or one replacing its last).
    pub tracked: u64,
    /// Fields that were not a well-formed report (ignored).
    pub malformed: u64,
    /// Well-formed reports not kept: the map already held [`MAX_DEVICES`] other devices.
    pub untracked: u64,
}

impl DeadLetters {
    /// Notes `device`'s report (`None`: a malformed field). `device` is the authenticated one.
    pub fn note(&mut self, device: u64, report: Option<Report>) {
        let Some(report) = report else {
            self.malformed = self.malformed.saturating_add(1);
            return;
        };
        if self.devices.len() >= MAX_DEVICES && !self.devices.contains_key(&device) {
            self.untracked = self.untracked.saturating_add(1);
            return;
        }
        self.devices.insert(device, report);
        self.tracked = self.tracked.saturating_add(1);
    }

    /// `device`'s last report, if it made one that was kept.
    pub fn get(&self, device: u64) -> Option<Report> {
        self.devices.get(&device).copied()
    }

    /// Devices with a report kept.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// True if no device's report is kept.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// Keeps the reports of the devices `keep` says yes to (those still in the credentials).
    pub fn retain(&mut self, mut keep: impl FnMut(u64) -> bool) {
        self.devices.retain(|d, _| keep(*d));
    }

    /// The Prometheus text: one gauge row of each per device, by device id, and the counter.
    pub fn prometheus(&self) -> String {
        let mut s = String::new();
        let mut metric =
            |name: &str, kind: &str, help: &str, rows: &mut dyn Iterator<Item = (String, u64)>| {
                let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
                for (labels, v) in rows {
                    let _ = writeln!(s, "{name}{labels} {v}");
                }
            };
        let device = |d: &u64| format!("{{device=\"{}\"}}", device_hex(*d));
        metric(
            "wary_gateway_device_dead_letters",
            "gauge",
            "Dead letters the device last reported holding on its flash (Wary-Dead-Letters: held).",
            &mut self.devices.iter().map(|(d, r)| (device(d), u64::from(r.held))),
        );
        metric(
            "wary_gateway_device_dead_letters_dropped",
            "gauge",
            "Dead letters the device last reported dropped over its life to make room (Wary-Dead-Letters: dropped).",
            &mut self.devices.iter().map(|(d, r)| (device(d), u64::from(r.dropped))),
        );
        let results =
            [("tracked", self.tracked), ("malformed", self.malformed), ("untracked", self.untracked)];
        metric(
            "wary_gateway_dead_letter_reports_total",
            "counter",
            "Wary-Dead-Letters fields from authenticated devices: kept, malformed (ignored), or not kept (too many devices).",
            &mut results.into_iter().map(|(r, n)| (format!("{{result=\"{r}\"}}"), n)),
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn r(held: u32, dropped: u32) -> Option<Report> {
        Some(Report { held, dropped })
    }

    #[test]
    fn well_formed_reports_in_any_order_and_spacing() {
        assert_eq!(Report::parse(b"held=2, dropped=0"), r(2, 0));
        assert_eq!(Report::parse(b"dropped=7,held=1"), r(1, 7));
        assert_eq!(Report::parse(b"  held=1 ,\tdropped=2  "), r(1, 2));
        assert_eq!(Report::parse(b"held=4294967295, dropped=4294967295"), r(u32::MAX, u32::MAX));
        assert_eq!(Report::parse(b"held=0, dropped=0"), r(0, 0));
        assert_eq!(Report::parse(b"held=007, dropped=0"), r(7, 0));
        // Parameters and unknown members (even with commas in a string) are read past.
        assert_eq!(Report::parse(b"held=2;since=5, note=\"a, b=9\", dropped=1;x"), r(2, 1));
        assert_eq!(
            Report::parse(b"x=(1 2 \"y\");p=?1, held=3, t=tok/en:1, b=:aGk=:, d=1.5, dropped=4"),
            r(3, 4)
        );
        // The last of a key given twice.
        assert_eq!(Report::parse(b"held=1, dropped=1, held=9"), r(9, 1));
    }

    #[test]
    fn malformed_or_out_of_range_reports_are_none() {
        for bad in [
            &b""[..],
            b"   ",
            b"held=2",
            b"dropped=2",
            b"held=2, dropped=",
            b"held=2, dropped=0,",
            b"held=2,, dropped=0",
            b"held=2 dropped=0",
            b"held=2; dropped=0",
            b"Held=2, Dropped=0",
            b"HELD=2, dropped=0",
            b"held=-1, dropped=0",
            b"held=4294967296, dropped=0",
            b"held=9999999999999999, dropped=0",
            b"held=1.0, dropped=0",
            b"held=\"1\", dropped=0",
            b"held=?1, dropped=0",
            b"held, dropped=0",
            b"held=(1), dropped=0",
            b"held=1x, dropped=0",
            b"held=1, dropped=0, note=\"open",
            b"held=1, dropped=0, 9=1",
            b"held = 1, dropped = 0",
            b"held=+1, dropped=0",
            b"held=1, dropped=0\x7f",
        ] {
            assert_eq!(Report::parse(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn several_field_lines_are_one_dictionary_and_the_name_is_case_insensitive() {
        let mut h = HeaderMap::new();
        assert_eq!(Report::from_headers(&h), None);
        h.append(HeaderName::from_bytes(b"Wary-Dead-Letters").unwrap(), HeaderValue::from_static("held=3"));
        assert_eq!(Report::from_headers(&h), Some(None));
        h.append(HEADER, HeaderValue::from_static("dropped=5"));
        assert_eq!(Report::from_headers(&h), Some(r(3, 5)));
    }

    #[test]
    fn the_map_is_bounded_and_a_report_replaces_the_last() {
        let mut d = DeadLetters::default();
        d.note(1, r(5, 0));
        d.note(1, r(2, 1));
        assert_eq!(d.get(1), r(2, 1));
        d.note(1, None);
        assert_eq!((d.get(1), d.tracked, d.malformed), (r(2, 1), 2, 1));
        for dev in 2..=MAX_DEVICES as u64 {
            d.note(dev, r(1, 0));
        }
        assert_eq!(d.len(), MAX_DEVICES);
        d.note(u64::MAX, r(1, 0));
        assert_eq!((d.get(u64::MAX), d.untracked, d.len()), (None, 1, MAX_DEVICES));
        // A device already kept is still updated.
        d.note(1, r(0, 3));
        assert_eq!(d.get(1), r(0, 3));
        d.retain(|dev| dev != 1);
        assert_eq!(d.get(1), None);
        d.note(u64::MAX, r(1, 0));
        assert_eq!(d.get(u64::MAX), r(1, 0));
    }

    #[test]
    fn the_gauges_name_devices_by_16_lowercase_hex() {
        let mut d = DeadLetters::default();
        d.note(0xab, r(2, 9));
        let text = d.prometheus();
        assert!(text.contains("# TYPE wary_gateway_device_dead_letters gauge\n"), "{text}");
        assert!(
            text.contains("\nwary_gateway_device_dead_letters{device=\"00000000000000ab\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("\nwary_gateway_device_dead_letters_dropped{device=\"00000000000000ab\"} 9\n"),
            "{text}"
        );
        assert!(text.contains("\nwary_gateway_dead_letter_reports_total{result=\"tracked\"} 1\n"), "{text}");
    }
}
