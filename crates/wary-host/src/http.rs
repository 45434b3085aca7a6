//! `http` responses and client errors as wary outcomes.
//!
//! A response becomes an outcome through the core's [`Outcome::from_response`] only: a 2xx is
//! [`Outcome::Ok`]; anything else a status with its Retry-After read under the policy's rules
//! (both forms; a date measured against the response's `Date` header, else the wall clock). A
//! Retry-After the rules refuse or cannot parse is ignored: the backoff applies, and nothing
//! panics. The [`Reading`] returned beside the outcome counts the values that could not be read
//! at all, for metrics. Client errors map to failures by what they say about whether the
//! request left: connect failures were never sent; anything after may have landed.

use std::error::Error;
use std::io;

use http::header::{DATE, RETRY_AFTER};
use http::{HeaderMap, StatusCode};
use wary::{Failure, Outcome, Policy, retry_after::Reading};

use crate::ratelimit::Signals;
use crate::time::WallClock;

/// The outcome of a response under `policy`'s Retry-After rules ([`Outcome::from_response`]),
/// and how its Retry-After values read. `now_unix` is the wall clock, used only for an
/// HTTP-date on a response without a `Date` header.
pub fn outcome(
    policy: &Policy,
    status: StatusCode,
    headers: &HeaderMap,
    now_unix: Option<u64>,
) -> (Outcome, Reading) {
    let values = headers.get_all(RETRY_AFTER).iter().map(|v| v.as_bytes());
    let date = headers.get(DATE).map(|v| v.as_bytes());
    Outcome::from_response(status.as_u16(), values, date, now_unix, policy.retry_after_rules())
}

/// [`outcome`] with the rate-limit [`Signals`] a policy opted into: the Retry-After it carries
/// is the longest of Retry-After and every signal's ask, so the wait is never sooner than any
/// header asked.
pub fn outcome_with(
    policy: &Policy,
    signals: &Signals,
    status: StatusCode,
    headers: &HeaderMap,
    now_unix: Option<u64>,
) -> (Outcome, Reading) {
    match outcome(policy, status, headers, now_unix) {
        (Outcome::Failure(Failure::Status { code, retry_after, unreadable }), reading) => {
            let ask = signals.ask(code, headers, now_unix);
            (
                Outcome::Failure(Failure::Status { code, retry_after: retry_after.max(ask), unreadable }),
                reading,
            )
        }
        other => other,
    }
}

/// [`outcome`] with the wall clock read here (for an HTTP-date Retry-After on a response
/// without a `Date` header).
pub fn outcome_now(policy: &Policy, status: StatusCode, headers: &HeaderMap) -> (Outcome, Reading) {
    outcome(policy, status, headers, WallClock.unix_secs())
}

/// The outcome of an [`http::Response`] in one call: [`outcome_now`] on its status and headers.
pub fn response_outcome<B>(policy: &Policy, response: &http::Response<B>) -> (Outcome, Reading) {
    outcome_now(policy, response.status(), response.headers())
}

/// The failure a client error stands for, from its source chain: hyper-util's connect errors,
/// hyper's errors, io errors and timeouts (tokio's and tower's). An error it cannot place is a
/// [`Failure::Reset`]: the request may have been sent, so an unkeyed write is never resent.
///
/// A TLS handshake or certificate failure happens inside the connector, so it arrives as a
/// connect error; it is [`Failure::Tls`] (failed at once, never retried), not a refusal.
/// It is recognised by type and kind (`InvalidData` inside a connect error), never by the error's text. A TLS
/// library whose errors are not `io::Error`s (native-tls) is not recognised: its connect
/// errors stay [`Failure::Refused`].
pub fn error_failure(err: &(dyn Error + 'static)) -> Failure {
    let mut connect = false;
    let mut cur: Option<&(dyn Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(h) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
            connect |= h.is_connect();
        } else if e.is::<tokio::time::error::Elapsed>() || e.is::<tower::timeout::error::Elapsed>() {
            return if connect { Failure::ConnectTimeout } else { Failure::ResponseTimeout };
        } else if let Some(io) = e.downcast_ref::<io::Error>() {
            if connect && is_tls_io(io) {
                return Failure::Tls;
            }
            return match io.kind() {
                io::ErrorKind::TimedOut if connect => Failure::ConnectTimeout,
                io::ErrorKind::TimedOut => Failure::ResponseTimeout,
                io::ErrorKind::ConnectionRefused => Failure::Refused,
                _ if connect => Failure::Refused,
                _ => Failure::Reset,
            };
        } else if let Some(h) = e.downcast_ref::<hyper::Error>() {
            if h.is_timeout() {
                return Failure::ResponseTimeout;
            }
            if h.source().is_none() {
                return if connect { Failure::Refused } else { Failure::Reset };
            }
        }
        cur = e.source();
    }
    if connect { Failure::Refused } else { Failure::Reset }
}

/// Whether an io error inside a connect error is a TLS failure: kind `InvalidData`, itself or
/// in an io error it wraps. A TCP connect never reports that kind; `tokio-rustls` (under
/// `hyper-rustls`) reports every handshake and certificate error with it.
fn is_tls_io(io: &io::Error) -> bool {
    if io.kind() == io::ErrorKind::InvalidData {
        return true;
    }
    // An io error wrapping another (a connector re-wrapping its stream's error).
    io.get_ref().and_then(|inner| inner.downcast_ref::<io::Error>()).is_some_and(is_tls_io)
}

/// A client error type the [`crate::tower`] adapter can classify.
pub trait ErrorFailure {
    /// The failure this error stands for.
    fn failure(&self) -> Failure;
}

impl ErrorFailure for hyper_util::client::legacy::Error {
    fn failure(&self) -> Failure {
        error_failure(self)
    }
}

impl ErrorFailure for hyper::Error {
    fn failure(&self) -> Failure {
        error_failure(self)
    }
}

impl ErrorFailure for io::Error {
    fn failure(&self) -> Failure {
        error_failure(self)
    }
}

impl ErrorFailure for Box<dyn Error + Send + Sync> {
    fn failure(&self) -> Failure {
        error_failure(self.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;
    use wary::{Duration, Preset};

    use super::*;

    fn headers(pairs: &[(&'static str, &'static [u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_bytes(v).unwrap());
        }
        h
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// The Retry-After a non-2xx response carries under `p` (what the old `retry_after` read).
    fn retry_after(p: &Policy, h: &HeaderMap, now: Option<u64>) -> Option<Duration> {
        outcome(p, StatusCode::SERVICE_UNAVAILABLE, h, now).0.retry_after()
    }

    #[test]
    fn statuses_and_both_retry_after_forms() {
        let p = Policy::builder(Preset::Default).build().unwrap();
        assert_eq!(outcome(&p, StatusCode::CREATED, &HeaderMap::new(), None).0, Outcome::Ok);
        let h = headers(&[("retry-after", b"7")]);
        assert_eq!(
            outcome(&p, StatusCode::TOO_MANY_REQUESTS, &h, None).0,
            Outcome::status_after(429, secs(7))
        );
        // A date 30 s after the response's own Date header, whatever the wall clock says.
        let h = headers(&[
            ("date", b"Sun, 06 Nov 1994 08:49:37 GMT"),
            ("retry-after", b"Sun, 06 Nov 1994 08:50:07 GMT"),
        ]);
        assert_eq!(
            outcome(&p, StatusCode::SERVICE_UNAVAILABLE, &h, Some(4_000_000_000)).0.retry_after(),
            Some(secs(30))
        );
        // No Date header: measured against the wall clock (784111777 is the date above).
        let h = headers(&[("retry-after", b"Sun, 06 Nov 1994 08:50:07 GMT")]);
        assert_eq!(retry_after(&p, &h, Some(784_111_777)), Some(secs(30)));
        // Duplicates: the longest under the default rules, refused under strict.
        let h = headers(&[("retry-after", b"1"), ("retry-after", b"3600")]);
        assert_eq!(retry_after(&p, &h, None), Some(secs(3600)));
        let strict = Policy::builder(Preset::Strict).build().unwrap();
        assert_eq!(retry_after(&strict, &h, None), None);
    }

    #[test]
    fn signals_raise_retry_after_to_the_longest_ask() {
        let p = Policy::builder(Preset::Default).build().unwrap();
        let h = headers(&[("retry-after", b"2"), ("retry-after-ms", b"9500")]);
        let on = Signals { retry_after_ms: true, ..Signals::NONE };
        let (o, _) = outcome_with(&p, &on, StatusCode::TOO_MANY_REQUESTS, &h, None);
        assert_eq!(o, Outcome::status_after(429, secs(10)));
        // Off: Retry-After alone. A longer Retry-After is never lowered by a shorter signal.
        assert_eq!(
            outcome_with(&p, &Signals::NONE, StatusCode::TOO_MANY_REQUESTS, &h, None).0.retry_after(),
            Some(secs(2))
        );
        let h = headers(&[("retry-after", b"60"), ("retry-after-ms", b"100")]);
        assert_eq!(
            outcome_with(&p, &on, StatusCode::SERVICE_UNAVAILABLE, &h, None).0.retry_after(),
            Some(secs(60))
        );
        // A signal alone, with no Retry-After at all.
        let h = headers(&[("ratelimit", b"\"q\";r=0;t=5")]);
        let rl = Signals { ratelimit: true, ..Signals::NONE };
        assert_eq!(
            outcome_with(&p, &rl, StatusCode::TOO_MANY_REQUESTS, &h, None).0.retry_after(),
            Some(secs(5))
        );
        // A success stays a success whatever it carries.
        assert_eq!(outcome_with(&p, &Signals::ALL, StatusCode::OK, &h, None).0, Outcome::Ok);
        let resp = http::Response::builder().status(429).header("retry-after", "3").body(()).unwrap();
        assert_eq!(response_outcome(&p, &resp).0, Outcome::status_after(429, secs(3)));
    }

    #[test]
    fn garbage_is_ignored_never_a_panic_and_counted() {
        let p = Policy::builder(Preset::Default).build().unwrap();
        for bad in [
            &b"soon-ish, maybe -1"[..],
            b"",
            b"-5",
            b"\xff\xfe",
            b"99999999999999999999999999",
            b"Sun, 99 Nov",
        ] {
            let h = headers(&[("retry-after", bad), ("date", b"the day after yesterday")]);
            let (o, reading) = outcome(&p, StatusCode::SERVICE_UNAVAILABLE, &h, None);
            assert_eq!(o.code(), Some(503));
            // An overlong number saturates (and so gives up as too long); all else is ignored,
            // and counted as unreadable.
            let overlong = bad.starts_with(b"9");
            assert_eq!(o.retry_after(), overlong.then_some(Duration::MAX), "{bad:?}: {o:?}");
            assert_eq!(reading.unreadable, u32::from(!overlong), "{bad:?}: {reading:?}");
        }
        // A good value beside a garbled one: the good one is used, the garbled one counted.
        let h = headers(&[("retry-after", b"4"), ("retry-after", b"later")]);
        let (o, reading) = outcome(&p, StatusCode::SERVICE_UNAVAILABLE, &h, None);
        assert_eq!((o.retry_after(), reading.unreadable), (Some(secs(4)), 1));
    }

    /// A connector whose every connection fails with `err`'s kind and text (a TLS handshake
    /// failure, as `tokio-rustls` reports one, or a plain refusal), so the client error's chain
    /// is the real one: hyper-util's connect error around the connector's own.
    async fn connect_error(kind: io::ErrorKind) -> Failure {
        use bytes::Bytes;
        use http_body_util::Full;
        use hyper_util::client::legacy::Client;
        use hyper_util::rt::{TokioExecutor, TokioIo};
        let connector = tower::service_fn(move |_: http::Uri| {
            let e = io::Error::new(kind, "invalid peer certificate: UnknownIssuer");
            std::future::ready(Err::<TokioIo<tokio::net::TcpStream>, _>(e))
        });
        let client = Client::builder(TokioExecutor::new()).build::<_, Full<Bytes>>(connector);
        let req = http::Request::get("https://127.0.0.1:9/").body(Full::new(Bytes::new())).unwrap();
        let err = client.request(req).await.unwrap_err();
        assert!(err.is_connect());
        err.failure()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn tls_failures_in_the_connector_are_tls_not_refused() {
        assert_eq!(connect_error(io::ErrorKind::InvalidData).await, Failure::Tls);
        // The same message under another kind is not TLS: the text is never read.
        assert_eq!(connect_error(io::ErrorKind::ConnectionRefused).await, Failure::Refused);
        assert_eq!(connect_error(io::ErrorKind::TimedOut).await, Failure::ConnectTimeout);
    }

    #[derive(Debug)]
    struct Wrap(&'static str, Box<dyn Error + Send + Sync>);

    impl std::fmt::Display for Wrap {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for Wrap {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(self.1.as_ref())
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_synthetic_chain_with_a_nested_invalid_data_error_is_tls() {
        // connector error → io::Error(Other) wrapping io::Error(InvalidData): still TLS.
        use bytes::Bytes;
        use http_body_util::Full;
        use hyper_util::client::legacy::Client;
        use hyper_util::rt::{TokioExecutor, TokioIo};
        let connector = tower::service_fn(|_: http::Uri| {
            let inner = io::Error::new(io::ErrorKind::InvalidData, "handshake");
            let outer = io::Error::other(inner);
            std::future::ready(Err::<TokioIo<tokio::net::TcpStream>, _>(Wrap(
                "tls connector",
                Box::new(outer),
            )))
        });
        let client = Client::builder(TokioExecutor::new()).build::<_, Full<Bytes>>(connector);
        let req = http::Request::get("https://127.0.0.1:9/").body(Full::new(Bytes::new())).unwrap();
        let err = client.request(req).await.unwrap_err();
        assert_eq!(error_failure(&err), Failure::Tls);
        // Outside a connect error, bad data on an open connection is not TLS: maybe sent.
        let e = Wrap("read", Box::new(io::Error::new(io::ErrorKind::InvalidData, "x")));
        assert_eq!(error_failure(&e), Failure::Reset);
    }

    #[test]
    fn io_errors_map_by_whether_the_request_left() {
        let e = |k| io::Error::new(k, "x");
        assert_eq!(error_failure(&e(io::ErrorKind::ConnectionRefused)), Failure::Refused);
        assert_eq!(error_failure(&e(io::ErrorKind::ConnectionReset)), Failure::Reset);
        assert_eq!(error_failure(&e(io::ErrorKind::TimedOut)), Failure::ResponseTimeout);
        assert_eq!(error_failure(&e(io::ErrorKind::Other)), Failure::Reset);
        let boxed: Box<dyn Error + Send + Sync> = Box::new(tower::timeout::error::Elapsed::new());
        assert_eq!(boxed.failure(), Failure::ResponseTimeout);
    }
}
