//! The network stack under QEMU: the LAN9118 driver and embassy-net with a DHCP lease from
//! QEMU's user-mode network, brought up as the on-target network test does.

use embassy_executor::Spawner;
use embassy_net::{Config, Stack, StackResources};
use embassy_time::{Duration, with_timeout};
use mps2_an386::eth;
use static_cell::ConstStaticCell;

/// Frame buffers: 4 received and 4 outgoing Ethernet frames.
static ETH_STATE: ConstStaticCell<eth::State<4, 4>> = ConstStaticCell::new(eth::State::new());
/// DHCP's socket, one TCP socket per exchange, one spare.
static RESOURCES: ConstStaticCell<StackResources<3>> = ConstStaticCell::new(StackResources::new());

/// Why the network did not come up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, defmt::Format)]
#[non_exhaustive]
pub enum NetError {
    /// The LAN9118 did not come up.
    Chip(eth::EthError),
    /// A task could not be spawned (its pool is taken: [`bring_up`] ran twice).
    Spawn,
    /// No DHCP lease within the limit.
    NoLease,
}

#[embassy_executor::task]
async fn eth_task(runner: eth::Runner<'static>) -> ! {
    runner.run().await
}

#[embassy_executor::task]
async fn net_task(mut runner: embassy_net::Runner<'static, eth::Device<'static>>) -> ! {
    runner.run().await
}

/// Brings up the chip and the stack and waits up to `limit` for a DHCP lease. `seed`
/// randomises TCP sequence numbers and local ports.
///
/// # Panics
///
/// If called twice: the frame buffers and stack resources are taken once.
pub async fn bring_up(
    spawner: Spawner,
    chip: eth::Lan9118,
    seed: u64,
    limit: Duration,
) -> Result<Stack<'static>, NetError> {
    let (device, eth_runner) = eth::new(chip, ETH_STATE.take()).map_err(NetError::Chip)?;
    spawner.spawn(eth_task(eth_runner).map_err(|_| NetError::Spawn)?);
    let (stack, net_runner) =
        embassy_net::new(device, Config::dhcpv4(Default::default()), RESOURCES.take(), seed);
    spawner.spawn(net_task(net_runner).map_err(|_| NetError::Spawn)?);
    with_timeout(limit, stack.wait_config_up()).await.map_err(|_| NetError::NoLease)?;
    Ok(stack)
}
