//! Shared by the integration tests: a typical reading, the flash geometry, small helpers.

#![allow(dead_code)]

use embassy_futures::block_on;
use wary_outbox::sim::SimFlash;
use wary_outbox::{Config, Entry, OpenReport, Outbox, Record};

/// A typical reading: 14 bytes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    pub sensor: u16,
    pub milli_celsius: i32,
    pub millivolts: u16,
    pub uptime_s: u32,
    pub flags: u16,
}

impl Reading {
    pub fn nth(n: u32) -> Reading {
        Reading {
            sensor: 7,
            milli_celsius: 21_000 + i32::try_from(n % 1000).unwrap(),
            millivolts: 3300,
            uptime_s: n.wrapping_mul(30),
            // All-ones bytes at the end of the entry: a cut just before them must still be seen.
            flags: 0xFFFF,
        }
    }
}

impl Entry for Reading {
    const TAG: u8 = 0x21;
    const MAX_SIZE: usize = 14;

    fn encode(&self, buf: &mut [u8]) -> usize {
        let mut out = [0u8; 14];
        out[0..2].copy_from_slice(&self.sensor.to_le_bytes());
        out[2..6].copy_from_slice(&self.milli_celsius.to_le_bytes());
        out[6..8].copy_from_slice(&self.millivolts.to_le_bytes());
        out[8..12].copy_from_slice(&self.uptime_s.to_le_bytes());
        out[12..14].copy_from_slice(&self.flags.to_le_bytes());
        buf[..14].copy_from_slice(&out);
        14
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let b: &[u8; 14] = bytes.try_into().ok()?;
        Some(Reading {
            sensor: u16::from_le_bytes([b[0], b[1]]),
            milli_celsius: i32::from_le_bytes([b[2], b[3], b[4], b[5]]),
            millivolts: u16::from_le_bytes([b[6], b[7]]),
            uptime_s: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            flags: u16::from_le_bytes([b[12], b[13]]),
        })
    }
}

/// Small pages so that a short sequence fills, wraps and erases them.
pub const PAGE: u32 = 256;
pub type Flash<'m> = SimFlash<'m, 4, 256>;
/// Two pages of boot counter, four of queue, two of dead letters.
pub const CONFIG: Config =
    Config { boot_range: 0..2 * PAGE, queue_range: 2 * PAGE..6 * PAGE, dead_range: 6 * PAGE..8 * PAGE };
pub const SIZE: usize = 8 * PAGE as usize;

pub fn blank() -> Vec<u8> {
    vec![0xFF; SIZE]
}

pub type Box<'f, 'm> = Outbox<&'f mut Flash<'m>, Reading>;

/// Opens the outbox, panicking on an error.
pub fn open<'f, 'm>(flash: &'f mut Flash<'m>) -> (Box<'f, 'm>, OpenReport) {
    match block_on(Outbox::open(flash, CONFIG)) {
        Ok(opened) => opened,
        Err(e) => panic!("open failed: {:?}", e.error),
    }
}

/// Every pending record, oldest first.
pub fn pending(outbox: &mut Box<'_, '_>) -> Vec<Record<Reading>> {
    block_on(async {
        let mut all = vec![];
        let mut it = outbox.pending().await.unwrap();
        while let Some(record) = it.next().await.unwrap() {
            all.push(record);
        }
        all
    })
}
