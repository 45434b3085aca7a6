//! Rate-limit signals beside Retry-After, each opt-in per policy ([`Signals`]).
//!
//! Some servers say "not before" in headers of their own rather than in Retry-After. Each
//! signal read here becomes one more ask, in whole seconds, and the outcome carries the
//! **longest** ask of all (Retry-After included) as its Retry-After: the core's rule then
//! applies unchanged, so a wait is never shorter than any header asked, and an ask longer than
//! the call can afford gives up at once with the ask reported.
//!
//! | signal | header | ask |
//! |---|---|---|
//! | [`Signals::ratelimit`] | `RateLimit` (with `RateLimit-Policy`) | `t` of a quota whose `r` is 0; without `t`, the window `w` of the policy of that name |
//! | [`Signals::x_ratelimit_reset`] | `X-RateLimit-Reset` | the epoch second it names, less the response's `Date` (else the wall clock), when `X-RateLimit-Remaining` is 0 or the status is 429 |
//! | [`Signals::retry_after_ms`] | `retry-after-ms` | the milliseconds, rounded up to a second |
//!
//! `RateLimit` and `RateLimit-Policy` are the IETF httpapi working group's structured-field
//! lists: `RateLimit: "burst";r=0;t=30` and `RateLimit-Policy: "burst";q=100;w=60`. A quota with
//! requests left (`r` > 0) asks nothing: the server said more may be sent. Rounding milliseconds
//! up, never down, keeps "never sooner than asked" (Retry-After's own unit is the second).
//!
//! A value that does not parse is ignored, as a bad Retry-After is: the backoff applies.

use http::HeaderMap;
use serde::{Deserialize, Serialize};
use wary::Duration;

/// Which rate-limit headers a policy reads beside Retry-After. All off by default: a header a
/// server did not mean as a wait must not stall a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Signals {
    /// `RateLimit` / `RateLimit-Policy` (IETF httpapi).
    pub ratelimit: bool,
    /// `X-RateLimit-Reset` in epoch seconds, with `X-RateLimit-Remaining`.
    pub x_ratelimit_reset: bool,
    /// `retry-after-ms`.
    pub retry_after_ms: bool,
}

impl Signals {
    /// Every signal on.
    pub const ALL: Signals = Signals { ratelimit: true, x_ratelimit_reset: true, retry_after_ms: true };

    /// No signal: Retry-After alone.
    pub const NONE: Signals = Signals { ratelimit: false, x_ratelimit_reset: false, retry_after_ms: false };

    /// The longest ask, in whole seconds, of the signals switched on; `None` if none asks.
    /// `status` is the response's; `now_unix` the wall clock, used only when the response has
    /// no `Date` header.
    pub fn ask(&self, status: u16, headers: &HeaderMap, now_unix: Option<u64>) -> Option<Duration> {
        let mut asks = [None; 3];
        if self.ratelimit {
            asks[0] = ratelimit_ask(headers);
        }
        if self.x_ratelimit_reset {
            asks[1] = x_ratelimit_reset_ask(status, headers, now_unix);
        }
        if self.retry_after_ms {
            asks[2] = retry_after_ms_ask(headers);
        }
        asks.into_iter().flatten().max().map(Duration::from_secs)
    }
}

/// Every value of a header, comma lists split (as HTTP joins repeated fields).
fn members<'a>(headers: &'a HeaderMap, name: &'static str) -> impl Iterator<Item = &'a str> + 'a {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|m| !m.is_empty())
}

/// One list member of `RateLimit` or `RateLimit-Policy`: `"name";k=v;k=v`, or a bare token as
/// its name. Returns the name and the integer parameters asked for.
fn item<'a>(member: &'a str, keys: [&str; 2]) -> Option<(&'a str, [Option<u64>; 2])> {
    let mut parts = member.split(';').map(str::trim);
    let raw = parts.next()?;
    let name = match raw.strip_prefix('"') {
        Some(rest) => rest.strip_suffix('"')?,
        None => raw,
    };
    let mut out = [None; 2];
    for p in parts {
        let Some((k, v)) = p.split_once('=') else { continue };
        for (slot, key) in out.iter_mut().zip(keys) {
            if k.trim() == key {
                *slot = v.trim().parse::<u64>().ok();
            }
        }
    }
    Some((name, out))
}

fn ratelimit_ask(headers: &HeaderMap) -> Option<u64> {
    members(headers, "ratelimit")
        .filter_map(|m| item(m, ["r", "t"]))
        .filter(|(_, [r, _])| *r == Some(0))
        .filter_map(|(name, [_, t])| t.or_else(|| policy_window(headers, name)))
        .max()
}

/// The window `w` of the `RateLimit-Policy` quota named `name`.
fn policy_window(headers: &HeaderMap, name: &str) -> Option<u64> {
    members(headers, "ratelimit-policy")
        .filter_map(|m| item(m, ["w", "q"]))
        .find(|(n, _)| *n == name)
        .and_then(|(_, [w, _])| w)
}

fn x_ratelimit_reset_ask(status: u16, headers: &HeaderMap, now_unix: Option<u64>) -> Option<u64> {
    let number = |name: &'static str| members(headers, name).next().and_then(|v| v.parse::<u64>().ok());
    if status != 429 && number("x-ratelimit-remaining") != Some(0) {
        return None;
    }
    let reset = number("x-ratelimit-reset")?;
    let date =
        headers.get(http::header::DATE).and_then(|d| wary::retry_after::parse_http_date(d.as_bytes()).ok());
    let now = date.or(now_unix)?;
    Some(reset.saturating_sub(now))
}

fn retry_after_ms_ask(headers: &HeaderMap) -> Option<u64> {
    members(headers, "retry-after-ms").filter_map(|v| v.parse::<u64>().ok()).max().map(|ms| ms.div_ceil(1000))
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn h(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(*k, HeaderValue::from_static(v));
        }
        m
    }

    #[test]
    fn ratelimit_asks_only_for_an_exhausted_quota() {
        let s = Signals { ratelimit: true, ..Signals::NONE };
        assert_eq!(s.ask(429, &h(&[("ratelimit", "\"burst\";r=0;t=30")]), None), Some(secs(30)));
        // Requests left: no ask.
        assert_eq!(s.ask(429, &h(&[("ratelimit", "\"burst\";r=5;t=30")]), None), None);
        // Two quotas, the longest exhausted one wins; a field split over two lines still counts.
        let two =
            h(&[("ratelimit", "\"burst\";r=0;t=3, \"day\";r=0;t=900"), ("ratelimit", "\"hour\";r=2;t=9999")]);
        assert_eq!(s.ask(503, &two, None), Some(secs(900)));
        // No `t`: the policy's window of the same name.
        let no_t = h(&[
            ("ratelimit", "\"day\";r=0"),
            ("ratelimit-policy", "\"burst\";q=10;w=1, \"day\";q=1000;w=86400"),
        ]);
        assert_eq!(s.ask(429, &no_t, None), Some(secs(86_400)));
        // Off by default.
        assert_eq!(Signals::default().ask(429, &h(&[("ratelimit", "\"b\";r=0;t=30")]), None), None);
        // Garbage is ignored.
        for bad in ["\"b\";r=zero;t=30", "\"b;r=0;t=30", "", ";;;", "\"b\";r=0;t=-4"] {
            let hv = HeaderMap::from_iter([(
                http::HeaderName::from_static("ratelimit"),
                HeaderValue::from_str(bad).unwrap(),
            )]);
            assert_eq!(s.ask(429, &hv, None), None, "{bad}");
        }
    }

    #[test]
    fn x_ratelimit_reset_is_measured_against_the_date_header() {
        let s = Signals { x_ratelimit_reset: true, ..Signals::NONE };
        // Sun, 06 Nov 1994 08:49:37 GMT is 784111777.
        let date = ("date", "Sun, 06 Nov 1994 08:49:37 GMT");
        let hdr = h(&[date, ("x-ratelimit-reset", "784111837")]);
        assert_eq!(s.ask(429, &hdr, Some(4_000_000_000)), Some(secs(60)));
        // Without a Date header: the wall clock.
        assert_eq!(s.ask(429, &h(&[("x-ratelimit-reset", "1000")]), Some(990)), Some(secs(10)));
        // A 503 asks only when the remaining count is 0.
        assert_eq!(s.ask(503, &hdr, None), None);
        let spent = h(&[date, ("x-ratelimit-reset", "784111837"), ("x-ratelimit-remaining", "0")]);
        assert_eq!(s.ask(503, &spent, None), Some(secs(60)));
        // A reset in the past asks for no wait; no clock at all asks nothing.
        assert_eq!(s.ask(429, &h(&[("x-ratelimit-reset", "10")]), Some(990)), Some(secs(0)));
        assert_eq!(s.ask(429, &h(&[("x-ratelimit-reset", "1000")]), None), None);
    }

    #[test]
    fn retry_after_ms_rounds_up_never_down() {
        let s = Signals { retry_after_ms: true, ..Signals::NONE };
        assert_eq!(s.ask(429, &h(&[("retry-after-ms", "1")]), None), Some(secs(1)));
        assert_eq!(s.ask(429, &h(&[("retry-after-ms", "2000")]), None), Some(secs(2)));
        assert_eq!(s.ask(429, &h(&[("retry-after-ms", "2001")]), None), Some(secs(3)));
        assert_eq!(s.ask(429, &h(&[("retry-after-ms", "soon")]), None), None);
    }

    #[test]
    fn the_longest_ask_wins() {
        let hdr =
            h(&[("retry-after-ms", "4500"), ("ratelimit", "\"b\";r=0;t=2"), ("x-ratelimit-reset", "1007")]);
        assert_eq!(Signals::ALL.ask(429, &hdr, Some(1000)), Some(secs(7)));
        assert_eq!(
            Signals { x_ratelimit_reset: false, ..Signals::ALL }.ask(429, &hdr, Some(1000)),
            Some(secs(5))
        );
    }
}
