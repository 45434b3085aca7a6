//! wary's conformance check on the Cortex-M4 (`wary-conformance`: the repository's conformance
//! cases, generated properties, the policy fingerprint and the fleet budget). The same check
//! runs on a Cortex-M0 and a Cortex-M33 from `firmware/conformance-cores`. Exit 0 only
//! if every check passed.

#![no_std]
#![no_main]

use embassy_executor::Spawner;
use wary_qemu::Tally;

#[embassy_executor::main]
async fn main(_spawner: Spawner) {
    let _board = mps2_an386::init();
    let mut tally = Tally::new();
    wary_conformance::run(&mut |name, ok| tally.check(name, ok));
    tally.finish()
}
