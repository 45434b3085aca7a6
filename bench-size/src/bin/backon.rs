//! backon's exponential backoff with jitter, settings the compiler cannot see. Its jitter
//! generator (fastrand's wyrand) is inside this figure.
#![no_std]
#![no_main]

use core::hint::black_box;
use core::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

#[unsafe(no_mangle)]
pub extern "C" fn _start() -> ! {
    wary_bench_size::run(|i| {
        let builder = black_box(
            ExponentialBuilder::new()
                .with_min_delay(Duration::from_millis(100))
                .with_max_delay(Duration::from_millis(10_000))
                .with_max_times(10)
                .with_jitter()
                .with_jitter_seed(u64::from(i[0])),
        );
        let mut backoff = builder.build();
        let mut total = 0u64;
        for _ in 0..i[1] {
            if let Some(d) = backoff.next() {
                total = total.wrapping_add(d.as_millis() as u64);
            }
        }
        total
    })
}
