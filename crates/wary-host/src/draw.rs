//! Draws for jitter: a seeded generator per process (from OS entropy), so a fleet of gateways
//! never shares one jitter sequence; an explicit seed only for tests and replays.

use std::sync::{Mutex, OnceLock};

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use wary::Key;

/// A generator seeded from the operating system's entropy: one per process (or per task,
/// through [`split`]). Never a fixed seed in production: a fleet on one seed retries in step.
pub fn process_rng() -> StdRng {
    StdRng::from_os_rng()
}

/// The process's own generator, seeded from OS entropy on first use.
fn process_wide() -> &'static Mutex<StdRng> {
    static RNG: OnceLock<Mutex<StdRng>> = OnceLock::new();
    RNG.get_or_init(|| Mutex::new(process_rng()))
}

/// A generator for one call, split from the process's own generator (seeded once from OS
/// entropy): what the one-line entry points use, so no call needs an entropy read of its own.
pub fn for_call() -> StdRng {
    let mut parent = process_wide().lock().unwrap_or_else(|e| e.into_inner());
    split(&mut parent)
}

/// A fresh random idempotency key from the process's generator: made once per call, before
/// the first attempt, and sent on every attempt.
pub fn new_key() -> Key {
    let mut bytes = [0u8; 16];
    process_wide().lock().unwrap_or_else(|e| e.into_inner()).fill_bytes(&mut bytes);
    Key::from_bytes(bytes)
}

/// A generator from an explicit seed, for tests and reproducible replays.
pub fn seeded(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// An independent generator for one task, seeded from `parent`.
pub fn split(parent: &mut StdRng) -> StdRng {
    StdRng::from_rng(parent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_reproduce_and_processes_differ() {
        assert_eq!(seeded(7).next_u64(), seeded(7).next_u64());
        assert_ne!(seeded(7).next_u64(), seeded(8).next_u64());
        // Two OS-seeded generators agreeing on 128 bits would mean a fixed seed.
        let (mut a, mut b) = (process_rng(), process_rng());
        assert_ne!((a.next_u64(), a.next_u64()), (b.next_u64(), b.next_u64()));
        let mut p = seeded(1);
        let (mut c, mut d) = (split(&mut p), split(&mut p));
        assert_ne!(c.next_u64(), d.next_u64());
        // Calls get distinct generators and keys from the one process generator.
        assert_ne!(for_call().next_u64(), for_call().next_u64());
        assert_ne!(new_key(), new_key());
    }
}
