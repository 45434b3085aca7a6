//! Readings on flash: the durable outbox shared by the sensor and the uplink.
//!
//! [`Store`] wraps a [`wary_outbox::Outbox`] of [`Reading`]s on any `embedded-storage-async`
//! NOR flash, behind an async mutex, so a sensor task can push while the uplink walks the queue.
//! The lock is held for one flash operation at a time, never across a network exchange.
//!
//! A reading's id ([`RecordId`]: the boot counter and a sequence number, made when it was
//! pushed) is its idempotency key's boot and sequence, so a reading resent after a reset goes
//! out with the key it had before the reset, and the cloud deduplicates it.

use core::sync::atomic::{AtomicBool, Ordering};

use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use embassy_sync::mutex::Mutex;
use embassy_sync::signal::Signal;
use embassy_time::{Duration, Timer};
use embedded_storage_async::nor_flash::MultiwriteNorFlash;
use wary_outbox::{
    BackoffMark, Counters, DialWindow, Entry, Error, HoldMark, Outbox, PushError, Record, RecordId,
    Settlement,
};

/// One sensor reading as it waits on flash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, defmt::Format)]
pub struct Reading {
    /// Temperature in thousandths of a degree Celsius.
    pub milli_celsius: i32,
}

impl Entry for Reading {
    /// Tells a reading apart from any other record on flash.
    const TAG: u8 = 0x52;
    const MAX_SIZE: usize = 4;

    fn encode(&self, buf: &mut [u8]) -> usize {
        match buf.get_mut(..4) {
            Some(out) => {
                out.copy_from_slice(&self.milli_celsius.to_le_bytes());
                4
            }
            None => 0,
        }
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes: [u8; 4] = bytes.try_into().ok()?;
        Some(Reading { milli_celsius: i32::from_le_bytes(bytes) })
    }
}

/// The JSON body sent for a reading: its id and value (no other fields, no secrets).
pub fn payload(record: &Record<Reading>) -> heapless::String<64> {
    use core::fmt::Write as _;
    let mut s = heapless::String::new();
    // At most 52 bytes: always fits.
    let _ = write!(
        s,
        "{{\"boot\":{},\"seq\":{},\"mC\":{}}}",
        record.id.boot, record.id.seq, record.entry.milli_celsius
    );
    s
}

/// What a push does when the outbox's queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, defmt::Format)]
pub enum WhenFull {
    /// Refuse the new reading and count the refusal: the sensor keeps it and offers it again
    /// ([`offer`]). The default: nothing already on flash moves.
    #[default]
    RefuseNewest,
    /// Move the oldest readings to the dead letters (reason [`wary_outbox::REASON_SHED`],
    /// counted, logged) until the new one fits: for a device whose newest readings matter more.
    ShedOldest,
}

/// The outbox, shared: a sensor pushes, the uplink walks and settles.
pub struct Store<F: MultiwriteNorFlash> {
    outbox: Mutex<CriticalSectionRawMutex, Outbox<F, Reading>>,
    when_full: WhenFull,
    ready: Signal<CriticalSectionRawMutex, ()>,
    sensor_done: AtomicBool,
}

impl<F: MultiwriteNorFlash> Store<F> {
    /// Shares an opened outbox.
    pub fn new(outbox: Outbox<F, Reading>) -> Self {
        Store {
            outbox: Mutex::new(outbox),
            when_full: WhenFull::RefuseNewest,
            ready: Signal::new(),
            sensor_done: AtomicBool::new(false),
        }
    }

    /// What a push does when the queue is full ([`WhenFull::RefuseNewest`] unless set).
    #[must_use]
    pub fn when_full(mut self, when_full: WhenFull) -> Self {
        self.when_full = when_full;
        self
    }

    /// Pushes a reading; on success it is on flash (and survives a reset) with the id returned.
    ///
    /// # Errors
    ///
    /// [`PushError::Full`] (counted as a refusal; under [`WhenFull::ShedOldest`] only when
    /// nothing is left to shed) or [`PushError::Failed`] (a flash error, counted): the reading
    /// is handed back, never dropped.
    pub async fn push(&self, reading: Reading) -> Result<RecordId, PushError<Reading>> {
        let pushed = match self.when_full {
            WhenFull::RefuseNewest => self.outbox.lock().await.push(reading).await,
            WhenFull::ShedOldest => match self.outbox.lock().await.push_shedding(reading).await {
                Ok((id, 0)) => Ok(id),
                Ok((id, shed)) => {
                    defmt::warn!("outbox full: {=u32} oldest readings moved to the dead letters", shed);
                    Ok(id)
                }
                Err(e) => Err(e),
            },
        };
        if pushed.is_ok() {
            self.ready.signal(());
        }
        pushed
    }

    /// The oldest pending reading newer than `after`.
    ///
    /// # Errors
    ///
    /// A flash error or a corrupted queue ([`Error`]).
    pub async fn next_after(&self, after: Option<RecordId>) -> Result<Option<Record<Reading>>, Error> {
        self.outbox.lock().await.next_after(after).await
    }

    /// Takes a reading out of the queue for good; `Ok(false)` if it was not pending.
    ///
    /// # Errors
    ///
    /// A flash error: the reading stays pending and is sent again with the same key.
    pub async fn settle(&self, id: RecordId, how: Settlement) -> Result<bool, Error> {
        self.outbox.lock().await.settle(id, how).await
    }

    /// Moves a pending reading the server refused as it is to the dead letters, with the
    /// refusal's `reason` (a status, or a protocol code as one); `Ok(false)` if it was not
    /// pending. It stays on flash, counted, until a person reads it out.
    ///
    /// # Errors
    ///
    /// A flash error: the reading stays pending (or in both places until the next call or open).
    pub async fn dead_letter(&self, id: RecordId, reason: u16) -> Result<bool, Error> {
        self.outbox.lock().await.dead_letter(id, reason).await
    }

    /// Dead letters held on flash (as counted since open), and dropped over the device's life to
    /// make room.
    pub async fn dead_letters(&self) -> (u32, u32) {
        let outbox = self.outbox.lock().await;
        (outbox.dead_count(), outbox.dead_dropped())
    }

    /// The endpoint hold as flash keeps it: probes in a row refused, and the last reason.
    pub async fn hold(&self) -> Option<HoldMark> {
        self.outbox.lock().await.hold()
    }

    /// Remembers the endpoint hold on flash (nothing written if unchanged).
    ///
    /// # Errors
    ///
    /// A flash error: flash keeps the old mark.
    pub async fn set_hold(&self, hold: Option<HoldMark>) -> Result<(), Error> {
        self.outbox.lock().await.set_hold(hold).await
    }

    /// Readings pending.
    pub async fn len(&self) -> u32 {
        self.outbox.lock().await.len()
    }

    /// True when nothing is pending.
    pub async fn is_empty(&self) -> bool {
        self.len().await == 0
    }

    /// This boot's number, from the boot counter on flash.
    pub async fn boot(&self) -> u32 {
        self.outbox.lock().await.boot()
    }

    /// The outbox's counters (accepted, refused, settled, flash errors, damage found).
    pub async fn counters(&self) -> Counters {
        self.outbox.lock().await.counters()
    }

    /// How far the backoff of the oldest kept reading had gone, as flash holds it (at open:
    /// what the last boot left, if that reading is still pending).
    pub async fn backoff(&self) -> Option<BackoffMark> {
        self.outbox.lock().await.backoff()
    }

    /// Remembers on flash how far the backoff has gone (nothing written if unchanged).
    ///
    /// # Errors
    ///
    /// A flash error: flash keeps the old mark.
    pub async fn set_backoff(&self, mark: Option<BackoffMark>) -> Result<(), Error> {
        self.outbox.lock().await.set_backoff(mark).await
    }

    /// Marks this boot healthy on flash; true if it wrote (false: healthy already).
    ///
    /// # Errors
    ///
    /// A flash error: the boot still counts as unhealthy.
    pub async fn mark_healthy(&self) -> Result<bool, Error> {
        self.outbox.lock().await.mark_healthy().await
    }

    /// The modem's dial window as flash holds it.
    pub async fn dial_window(&self) -> DialWindow {
        self.outbox.lock().await.dial_window()
    }

    /// Remembers the modem's dial window on flash (nothing written if unchanged).
    ///
    /// # Errors
    ///
    /// A flash error: flash keeps the old window.
    pub async fn set_dial_window(&self, window: DialWindow) -> Result<(), Error> {
        self.outbox.lock().await.set_dial_window(window).await
    }

    /// Waits until a reading was pushed since the last wait.
    pub async fn wait(&self) {
        self.ready.wait().await;
    }

    /// Marks the sensor as finished: once nothing is pending the uplink may return.
    pub fn finish_sensing(&self) {
        self.sensor_done.store(true, Ordering::Release);
        self.ready.signal(());
    }

    /// Whether the sensor has finished.
    pub fn sensing_done(&self) -> bool {
        self.sensor_done.load(Ordering::Acquire)
    }
}

/// Pushes `reading` until the outbox takes it and returns its id. A full outbox or a flash
/// error hands the reading back (the outbox counts every refusal and flash error): it is offered
/// again after `retry`, so nothing is dropped. Each accepted reading is logged with its id
/// (`ACCEPTED`), never with its value.
pub async fn offer<F: MultiwriteNorFlash>(
    store: &Store<F>,
    mut reading: Reading,
    retry: Duration,
) -> RecordId {
    loop {
        match store.push(reading).await {
            Ok(id) => {
                defmt::info!("ACCEPTED boot={=u32:08x} seq={=u32}", id.boot, id.seq);
                return id;
            }
            Err(PushError::Full(back)) => {
                defmt::warn!("outbox full: reading refused, offered again later");
                reading = back;
            }
            Err(PushError::Failed(back, e)) => {
                defmt::error!("outbox push failed ({}): reading offered again later", e);
                reading = back;
            }
            // `PushError` may grow variants; each hands the reading back.
            Err(other) => {
                defmt::error!("outbox push refused: reading offered again later");
                reading = other.into_entry();
            }
        }
        Timer::after(retry).await;
    }
}

/// A sensor: `count` readings from `sample`, one every `period`, each [`offer`]ed until the
/// outbox takes it; then the sensor is marked finished.
pub async fn sense<F: MultiwriteNorFlash>(
    store: &Store<F>,
    count: u32,
    period: Duration,
    mut sample: impl FnMut() -> i32,
) {
    for _ in 0..count {
        offer(store, Reading { milli_celsius: sample() }, period).await;
        Timer::after(period).await;
    }
    store.finish_sensing();
}
