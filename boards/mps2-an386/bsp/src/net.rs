//! The network bring-up every binary on this board shares: the LAN9118 driver and
//! embassy-net with DHCP on QEMU's user-mode network (the guest is 10.0.2.15, the host
//! 10.0.2.2), each with its task.
//!
//! [`bring_up`] does it all and waits for a lease. A test that must see the stack before it
//! runs (no lease yet, nothing may be sent) uses the two halves: [`prepare`] spawns the chip's
//! task and builds the stack, [`start`] spawns the stack's task.
//!
//! ```ignore
//! let board = mps2_an386::init();
//! let stack = net::bring_up(spawner, board.eth, seed, Duration::from_secs(20)).await?;
//! ```

use embassy_executor::Spawner;
use embassy_net::{Config, Stack, StackResources};
use embassy_time::{Duration, with_timeout};
use static_cell::ConstStaticCell;

use crate::eth;

/// Frame buffers: 4 received and 4 outgoing Ethernet frames.
static ETH_STATE: ConstStaticCell<eth::State<4, 4>> = ConstStaticCell::new(eth::State::new());
/// DHCP's socket, one TCP socket per exchange, one spare.
static RESOURCES: ConstStaticCell<StackResources<3>> = ConstStaticCell::new(StackResources::new());

/// The stack's runner, to hand to [`start`].
pub type NetRunner = embassy_net::Runner<'static, eth::Device<'static>>;

/// Why the network did not come up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, defmt::Format)]
#[non_exhaustive]
pub enum NetError {
    /// The LAN9118 did not come up.
    Chip(eth::EthError),
    /// A task could not be spawned (its pool is taken: the bring-up ran twice).
    Spawn,
    /// No DHCP lease within the limit.
    NoLease,
}

#[embassy_executor::task]
async fn eth_task(runner: eth::Runner<'static>) -> ! {
    runner.run().await
}

#[embassy_executor::task]
async fn net_task(mut runner: NetRunner) -> ! {
    runner.run().await
}

/// Brings up the chip, spawns its task and builds the stack (DHCP); the stack does nothing
/// until its runner is [`start`]ed. `seed` randomises TCP sequence numbers and local ports.
///
/// # Panics
///
/// If called twice: the frame buffers and stack resources are taken once.
pub fn prepare(
    spawner: Spawner,
    chip: eth::Lan9118,
    seed: u64,
) -> Result<(Stack<'static>, NetRunner), NetError> {
    let (device, eth_runner) = eth::new(chip, ETH_STATE.take()).map_err(NetError::Chip)?;
    spawner.spawn(eth_task(eth_runner).map_err(|_| NetError::Spawn)?);
    Ok(embassy_net::new(device, Config::dhcpv4(Default::default()), RESOURCES.take(), seed))
}

/// Spawns the stack's task: from here on it runs DHCP and carries traffic.
pub fn start(spawner: Spawner, runner: NetRunner) -> Result<(), NetError> {
    spawner.spawn(net_task(runner).map_err(|_| NetError::Spawn)?);
    Ok(())
}

/// [`prepare`], [`start`], then waits up to `limit` for a DHCP lease.
///
/// # Panics
///
/// If called twice, as [`prepare`].
pub async fn bring_up(
    spawner: Spawner,
    chip: eth::Lan9118,
    seed: u64,
    limit: Duration,
) -> Result<Stack<'static>, NetError> {
    let (stack, runner) = prepare(spawner, chip, seed)?;
    start(spawner, runner)?;
    with_timeout(limit, stack.wait_config_up()).await.map_err(|_| NetError::NoLease)?;
    Ok(stack)
}
