//! Draws for jitter: a seeded generator per process (from OS entropy), so a fleet of gateways
//! never shares one jitter sequence; an explicit seed only for tests and replays.

use rand::SeedableRng;
use rand::rngs::StdRng;

/// A generator seeded from the operating system's entropy: one per process (or per task,
/// through [`split`]). Never a fixed seed in production: a fleet on one seed retries in step.
pub fn process_rng() -> StdRng {
    StdRng::from_os_rng()
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
    use rand_core::RngCore;

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
    }
}
