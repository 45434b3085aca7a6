//! Sizes of the state a call and a fleet carry, beside backon's.

use core::mem::size_of;

/// One row: what, bytes, and what it is compared with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Size {
    /// The type.
    pub what: &'static str,
    /// `size_of`, in bytes; `None` where the type does not exist yet.
    pub bytes: Option<usize>,
    /// What the row means.
    pub note: &'static str,
}

/// The runner's future for a typical call, measured with `size_of_val` (its type cannot be
/// named).
pub fn runner_future() -> Option<usize> {
    use wary::{CancelToken, Clock, Instant, Runner};

    struct NoDelay;
    impl embedded_hal_async::delay::DelayNs for NoDelay {
        async fn delay_ns(&mut self, _: u32) {}
    }
    struct Zero;
    impl Clock for Zero {
        fn now(&self) -> Instant {
            Instant::ZERO
        }
    }
    struct Rng(u64);
    impl rand_core::RngCore for Rng {
        fn next_u32(&mut self) -> u32 {
            self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (self.0 >> 32) as u32
        }
        fn next_u64(&mut self) -> u64 {
            u64::from(self.next_u32())
        }
        fn fill_bytes(&mut self, dst: &mut [u8]) {
            dst.fill(0);
        }
    }

    // A typical device call: a keyed write whose attempt is one ready future, with a cancel
    // token, the fleet budget and a 16-record ledger ring.
    let policy = wary::Policy::builder(wary::Preset::Default).build().ok()?;
    let fleet = wary::FleetBudget::new(10, 100).ok()?;
    let cancel = CancelToken::new();
    let mut ledger = wary::ledger::Ledger::<16>::new();
    let mut runner =
        Runner::new(&policy, NoDelay, Zero, Rng(1)).cancel(&cancel).fleet(&fleet).ledger(&mut ledger);
    let fut = runner.call(wary::Operation::KeyedWrite, wary::Key::from_parts(1, 1, 1), |_| {
        core::future::ready(Ok::<u32, wary::Failure>(1))
    });
    Some(size_of_val(&fut))
}

/// Every row, wary's first and backon's after.
pub fn all() -> Vec<Size> {
    vec![
        Size { what: "wary::CallState", bytes: Some(size_of::<wary::CallState>()), note: "per-call state" },
        Size {
            what: "wary::FleetBudget",
            bytes: Some(size_of::<wary::FleetBudget>()),
            note: "one per fleet",
        },
        Size { what: "wary::Policy", bytes: Some(size_of::<wary::Policy>()), note: "shared, const-able" },
        Size {
            what: "wary::Pace",
            bytes: Some(size_of::<wary::Pace>()),
            note: "per endpoint, settings included",
        },
        Size {
            what: "wary::Breaker",
            bytes: Some(size_of::<wary::Breaker>()),
            note: "per endpoint, settings included",
        },
        Size {
            what: "wary::Decision",
            bytes: Some(size_of::<wary::Decision>()),
            note: "returned per attempt",
        },
        Size {
            what: "wary runner future",
            bytes: runner_future(),
            note: "keyed write: cancel, fleet, ledger",
        },
        Size {
            what: "backon::ExponentialBackoff",
            bytes: Some(size_of::<backon::ExponentialBackoff>()),
            note: "baseline: per-call state",
        },
        Size {
            what: "backon::ExponentialBuilder",
            bytes: Some(size_of::<backon::ExponentialBuilder>()),
            note: "baseline: shared settings",
        },
    ]
}
