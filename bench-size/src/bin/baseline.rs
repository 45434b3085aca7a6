//! The skeleton with trivial work: what every other binary is measured against.
#![no_std]
#![no_main]

#[unsafe(no_mangle)]
pub extern "C" fn _start() -> ! {
    wary_bench_size::run(|i| u64::from(i[0]) ^ u64::from(i[1]))
}
