//! Proves the board support under QEMU: the time driver keeps guest time, and UART0 sends and
//! receives. Needs UART0 looped back (`-serial udp:127.0.0.1:P@127.0.0.1:P`).

#![no_std]
#![no_main]

use embassy_executor::Spawner;
use embassy_futures::join::join;
use embassy_time::{Duration, Instant, Timer, with_timeout};
use embedded_io_async::{Read, Write};
use wary_qemu::Tally;

/// Longer than the RX ring, so the full-ring path is exercised.
const MESSAGE_LEN: usize = 3 * mps2_an386::uart::RX_CAPACITY + 7;

#[embassy_executor::main]
async fn main(_spawner: Spawner) {
    let board = mps2_an386::init();
    let mut tally = Tally::new();

    // Guest ticks, not host time: a timer fires on the first tick at or after its deadline.
    let start = Instant::now();
    Timer::after_millis(100).await;
    let elapsed = start.elapsed().as_millis();
    defmt::info!("Timer::after_millis(100) took {=u64} ms of guest time", elapsed);
    tally.check("timer waits at least its duration", elapsed >= 100);
    tally.check("timer fires within a tick or two", elapsed <= 102);

    let (mut tx, mut rx) = board.uart0.split();
    let mut sent = [0u8; MESSAGE_LEN];
    for (i, byte) in sent.iter_mut().enumerate() {
        *byte = (i % 251) as u8;
    }
    let mut received = [0u8; MESSAGE_LEN];
    let echo = join(
        async {
            let _ = tx.write_all(&sent).await;
            let _ = tx.flush().await;
        },
        rx.read_exact(&mut received),
    );
    // Generous: guest time drifts from host time on a busy machine.
    let done = with_timeout(Duration::from_secs(10), echo).await;
    tally.check("uart0 echo completes", done.is_ok());
    tally.check("uart0 echo returns every byte in order", done.is_ok() && received == sent);

    tally.finish()
}
