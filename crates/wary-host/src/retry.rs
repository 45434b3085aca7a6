//! One line for plain async code on tokio:
//! `policy.retry(Operation::KeyedWrite, |attempt| async { … }).await`.
//!
//! [`RetryExt::retry`] runs the core's [`Runner`] with tokio's sleep, a [`MonotonicClock`], a
//! generator split from the process's own, and an idempotency key made once before the first
//! attempt ([`crate::draw::new_key`]); every attempt is told the key ([`Attempt::key`]) and the
//! time left before the deadline ([`Attempt::remaining`], see [`attempt_timeout`]). The attempt
//! returns its value, or the [`Failure`] that failed it (from [`crate::http::response_outcome`]
//! or [`crate::http::error_failure`]). A call that returns no value ends in the core's
//! [`Stopped`], whose text is the verdict and the attempts (`gave_up (deadline) after 3
//! attempts, the last a response_timeout`).
//!
//! The attempt runs as written: nothing here changes a client's settings. The deadline is not
//! enforced while an attempt is in flight unless the attempt asks for it with [`within`], a
//! timer set to the time left and raced against the attempt, which leaves the client's own
//! timeouts in force (an attempt ends at the earliest of them).
//!
//! For a fleet budget, a ledger or a cancel signal, start from [`tokio_runner`] and add them;
//! for every effect injected (firmware, replays), build the [`Runner`] by hand.
//!
//! ```no_run
//! use wary::{Duration, Failure, Operation, Policy, Preset, Stopped};
//! use wary_host::retry::RetryExt;
//!
//! # async fn send(_key: &str) -> Result<u16, Failure> { Ok(201) }
//! # async fn demo() -> Result<(), Stopped> {
//! let policy = Policy::builder(Preset::Default).deadline(Duration::from_secs(10)).build().expect("a valid policy");
//! let status = policy.retry(Operation::KeyedWrite, |a| async move { send(a.key.to_hex().as_str()).await }).await?;
//! # let _ = status; Ok(()) }
//! ```

use std::future::Future;

use rand::rngs::StdRng;
use wary::{Attempt, Failure, Operation, Policy, Runner, Stopped};

use crate::time::{MonotonicClock, TokioDelay};

/// The runner [`tokio_runner`] makes: tokio's sleep, a monotonic clock, a generator split from
/// the process's own.
pub type TokioRunner<'a> = Runner<'a, TokioDelay, MonotonicClock, StdRng>;

/// A runner for `policy` on tokio, every effect chosen: [`TokioDelay`], a [`MonotonicClock`]
/// and [`crate::draw::for_call`]. Add `.fleet(..)`, `.ledger(..)` or `.cancel(..)` as needed.
pub fn tokio_runner(policy: &Policy) -> TokioRunner<'_> {
    Runner::new(policy, TokioDelay, MonotonicClock::new(), crate::draw::for_call())
}

/// Runs one attempt under the call's deadline: `attempt` as it is, raced against a timer set to
/// the time left ([`Attempt::remaining`]); without a deadline, `attempt` alone. A timer that
/// fires first fails the attempt with [`Failure::ResponseTimeout`]: from outside the client
/// nothing says whether the request left, so it may have landed (an unkeyed write ends
/// `unknown`).
///
/// The client's own timeouts are untouched, so an attempt ends at the earliest of them and
/// the deadline; this is the way to bound an attempt that keeps a client's settings.
///
/// ```no_run
/// # use wary::{Failure, Operation, Policy, Preset, Stopped};
/// # use wary_host::retry::{RetryExt, within};
/// # async fn send() -> Result<u16, Failure> { Ok(200) }
/// # async fn demo(policy: Policy) -> Result<(), Stopped> {
/// let status = policy.retry(Operation::Idempotent, |a| within(&a, send())).await?;
/// # let _ = status; Ok(()) }
/// ```
pub fn within<T, Fut>(attempt: &Attempt, fut: Fut) -> impl Future<Output = Result<T, Failure>> + use<T, Fut>
where
    Fut: Future<Output = Result<T, Failure>>,
{
    // Read now, so the future does not borrow the attempt.
    let remaining = attempt.remaining;
    async move {
        match remaining {
            Some(left) => {
                let left = std::time::Duration::from(left).max(std::time::Duration::from_millis(1));
                tokio::time::timeout(left, fut).await.unwrap_or(Err(Failure::ResponseTimeout))
            }
            None => fut.await,
        }
    }
}

/// An attempt's timeout: `default`, capped to the time left before the call's deadline, so a
/// slow answer cannot hold the call past it.
///
/// Set as a request's timeout, it *replaces* the client's own timeout for that request (that
/// is how reqwest and most clients treat a per-request timeout): use it only where `default`
/// is the timeout you want each attempt to have. To keep the client's timeouts, leave the
/// request's alone and bound the attempt with [`within`].
pub fn attempt_timeout(attempt: &Attempt, default: std::time::Duration) -> std::time::Duration {
    match attempt.remaining {
        Some(left) => default.min(left.into()),
        None => default,
    }
}

/// The one-line entry point, on [`Policy`].
pub trait RetryExt {
    /// Runs one call of `op` on tokio: a fresh key, made once and handed to every attempt.
    fn retry<T, F, Fut>(&self, op: Operation, attempt: F) -> impl Future<Output = Result<T, Stopped>>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, Failure>>;
}

impl RetryExt for Policy {
    async fn retry<T, F, Fut>(&self, op: Operation, attempt: F) -> Result<T, Stopped>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        tokio_runner(self).call(op, crate::draw::new_key(), attempt).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use std::time::Duration as StdDuration;

    use wary::{Duration, GiveUp, Key, Preset, Verdict};

    use super::*;

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn one_key_for_every_attempt_and_the_runners_verdicts() {
        let ms = Duration::from_millis;
        let policy =
            Policy::builder(Preset::Default).base(ms(100)).cap(ms(400)).budget(ms(60_000)).build().unwrap();
        let keys = Mutex::new(Vec::<Key>::new());
        let t0 = tokio::time::Instant::now();
        let got = policy
            .retry(Operation::KeyedWrite, |a| {
                keys.lock().unwrap().push(a.key);
                let n = a.number;
                async move { if n < 3 { Err(Failure::status(503)) } else { Ok(n) } }
            })
            .await;
        assert_eq!(got, Ok(3));
        let keys = keys.into_inner().unwrap();
        assert_eq!(keys.len(), 3);
        assert!(keys.iter().all(|k| *k == keys[0]), "the key changed between attempts");
        // Two equal-jitter waits of at least 50 and 100 ms were slept on tokio's clock.
        assert!(t0.elapsed() >= StdDuration::from_millis(150), "{:?}", t0.elapsed());
        // An unkeyed write is never resent after an ambiguous failure.
        let mut sent = 0;
        let r: Result<(), _> = policy
            .retry(Operation::Write, |_| {
                sent += 1;
                async { Err(Failure::status(500)) }
            })
            .await;
        assert_eq!(r.unwrap_err().verdict, Verdict::Unknown);
        assert_eq!(sent, 1);
        // A second call gets a second key.
        let mut second = None;
        let _ = policy
            .retry(Operation::Idempotent, |a| {
                second = Some(a.key);
                async { Ok(()) }
            })
            .await;
        assert_ne!(second, Some(keys[0]));
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn the_deadline_caps_each_attempts_timeout() {
        let ms = Duration::from_millis;
        let policy =
            Policy::builder(Preset::Default).base(ms(100)).cap(ms(100)).deadline(ms(1_000)).build().unwrap();
        let mut timeouts = Vec::new();
        let r: Result<(), _> = policy
            .retry(Operation::Idempotent, |a| {
                timeouts.push(attempt_timeout(&a, StdDuration::from_secs(30)));
                async {
                    tokio::time::sleep(StdDuration::from_millis(300)).await;
                    Err(Failure::ResponseTimeout)
                }
            })
            .await;
        let err = r.unwrap_err();
        assert_eq!(err.verdict, Verdict::GaveUp(GiveUp::Deadline));
        // The core's text: the verdict, the attempts and the last failure's name.
        assert_eq!(
            err.to_string(),
            format!("gave_up (deadline) after {} attempts, the last a response_timeout", err.attempts)
        );
        assert_eq!(timeouts[0], StdDuration::from_secs(1));
        assert!(timeouts.windows(2).all(|w| w[1] < w[0]), "{timeouts:?}");
        assert!(timeouts.iter().all(|t| *t <= StdDuration::from_secs(1)));
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn within_ends_an_attempt_at_the_deadline_and_keeps_a_shorter_one() {
        let ms = Duration::from_millis;
        let policy = Policy::builder(Preset::Default)
            .base(ms(100))
            .cap(ms(100))
            .deadline(ms(1_000))
            .max_attempts(10)
            .build()
            .unwrap();
        // An attempt that never ends: the deadline's timer ends it, a response timeout.
        let mut n = 0;
        let t0 = tokio::time::Instant::now();
        let r: Result<(), _> = policy
            .retry(Operation::Idempotent, |a| {
                n += 1;
                within(&a, std::future::pending())
            })
            .await;
        let err = r.unwrap_err();
        assert_eq!(
            (n, err.verdict, err.last),
            (1, Verdict::GaveUp(GiveUp::Deadline), Some(Failure::ResponseTimeout))
        );
        assert_eq!(t0.elapsed(), StdDuration::from_secs(1));
        // An attempt with its own 300 ms timeout keeps it: attempts of 300 ms with waits
        // between, until the deadline ends the last one.
        let mut starts = Vec::new();
        let t0 = tokio::time::Instant::now();
        let r: Result<(), _> = policy
            .retry(Operation::Idempotent, |a| {
                starts.push(t0.elapsed());
                within(&a, async {
                    tokio::time::sleep(StdDuration::from_millis(300)).await;
                    Err(Failure::ResponseTimeout)
                })
            })
            .await;
        assert_eq!(r.unwrap_err().verdict, Verdict::GaveUp(GiveUp::Deadline));
        assert_eq!(starts.len(), 3, "{starts:?}");
        assert!(starts.windows(2).all(|w| w[1] - w[0] >= StdDuration::from_millis(350)), "{starts:?}");
        // Without a deadline the attempt runs as it is.
        let a = Attempt { number: 1, key: Key::from_parts(1, 1, 1), remaining: None };
        assert_eq!(within(&a, async { Ok::<_, Failure>(7) }).await, Ok(7));
    }

    #[test]
    fn timeouts_are_capped_by_the_time_left() {
        let a = Attempt {
            number: 1,
            key: Key::from_parts(1, 1, 1),
            remaining: Some(Duration::from_millis(2_500)),
        };
        assert_eq!(attempt_timeout(&a, StdDuration::from_secs(9)), StdDuration::from_millis(2_500));
        assert_eq!(attempt_timeout(&a, StdDuration::from_secs(1)), StdDuration::from_secs(1));
        let a = Attempt { remaining: None, ..a };
        assert_eq!(attempt_timeout(&a, StdDuration::from_secs(9)), StdDuration::from_secs(9));
    }
}
