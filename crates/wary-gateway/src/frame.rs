//! The downstream wire: length-prefixed frames (a big-endian `u32` length, then that many bytes
//! of JSON), bounded in size. Sensors send [`Reading`]s; the gateway answers each with an
//! [`Ack`] once its upstream verdict is known.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest frame body accepted, bytes.
pub const MAX_FRAME: u32 = 4096;

/// One reading from a sensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reading {
    /// Sensor id.
    pub sensor: u32,
    /// The sensor's boot count (with `seq`, makes the reading's idempotency key).
    #[serde(default)]
    pub boot: u32,
    /// Sequence number within the boot.
    pub seq: u64,
    /// The measured value.
    pub value: i64,
}

impl Reading {
    /// The reading's idempotency key: sensor, boot and sequence.
    pub fn key(&self) -> wary::Key {
        wary::Key::from_parts(self.sensor, self.boot, self.seq)
    }

    /// The label the legacy endpoint stores it under (`X-Reading-Id`).
    pub fn reading_id(&self) -> String {
        format!("{}-{}-{}", self.sensor, self.boot, self.seq)
    }
}

/// The gateway's answer to a reading, sent after its upstream verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// Sensor id.
    pub sensor: u32,
    /// Boot count.
    pub boot: u32,
    /// Sequence number.
    pub seq: u64,
    /// `ok`, `failed`, `unknown`, `gave_up` or `cancelled`.
    pub verdict: String,
    /// Why it gave up, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// True if the sensor must not send the reading again: `ok`; `failed` (resending cannot
    /// fix it); or `unknown`, which is also [`Ack::surfaced`]. Otherwise (`gave_up`,
    /// `cancelled`: the reading did not land) the sensor keeps it and sends it again later.
    pub done: bool,
    /// True for an `unknown` verdict: the write **may have landed**; the probe could not tell,
    /// so the gateway surfaced it to a person (see [`crate::Metrics::surfaced`]). The sensor
    /// must **never resend** it (a resend could apply it twice), and must not count it as
    /// delivered either. Always comes with `done: true`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub surfaced: bool,
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The length prefix is larger than [`MAX_FRAME`]; the body was not read.
    #[error("frame of {len} bytes exceeds the {max}-byte limit")]
    Oversized {
        /// The announced length.
        len: u32,
        /// The limit.
        max: u32,
    },
    /// The body is not a valid message.
    #[error("frame is not a valid message")]
    Garbage,
    /// The stream ended inside a frame.
    #[error("stream ended inside a frame")]
    Truncated,
    /// An I/O error (kind only: no raw text).
    #[error("i/o error: {0:?}")]
    Io(std::io::ErrorKind),
}

impl From<std::io::Error> for FrameError {
    fn from(e: std::io::Error) -> Self {
        match e.kind() {
            std::io::ErrorKind::UnexpectedEof => FrameError::Truncated,
            k => FrameError::Io(k),
        }
    }
}

/// Reads one message; `Ok(None)` at a clean end of stream.
pub async fn read_frame<R, T>(r: &mut R) -> Result<Option<T>, FrameError>
where
    R: AsyncRead + Unpin,
    T: for<'de> Deserialize<'de>,
{
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let n = r.read(len.get_mut(got..).unwrap_or_default()).await?;
        if n == 0 {
            return if got == 0 { Ok(None) } else { Err(FrameError::Truncated) };
        }
        got += n;
    }
    let len = u32::from_be_bytes(len);
    if len > MAX_FRAME {
        return Err(FrameError::Oversized { len, max: MAX_FRAME });
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body).await?;
    serde_json::from_slice(&body).map(Some).map_err(|_| FrameError::Garbage)
}

/// Writes one message as a frame and flushes.
pub async fn write_frame<W, T>(w: &mut W, msg: &T) -> Result<(), FrameError>
where
    W: AsyncWrite + Unpin,
    T: Serialize,
{
    let body = serde_json::to_vec(msg).map_err(|_| FrameError::Garbage)?;
    let len = u32::try_from(body.len()).ok().filter(|l| *l <= MAX_FRAME);
    let len = len.ok_or(FrameError::Oversized { len: u32::MAX, max: MAX_FRAME })?;
    w.write_all(&len.to_be_bytes()).await?;
    w.write_all(&body).await?;
    w.flush().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_bad_frames_are_typed() {
        let r = Reading { sensor: 3, boot: 1, seq: 9, value: -4 };
        let mut buf = Vec::new();
        write_frame(&mut buf, &r).await.unwrap();
        write_frame(&mut buf, &r).await.unwrap();
        let mut s = buf.as_slice();
        assert_eq!(read_frame::<_, Reading>(&mut s).await.unwrap(), Some(r));
        assert_eq!(read_frame::<_, Reading>(&mut s).await.unwrap(), Some(r));
        assert_eq!(read_frame::<_, Reading>(&mut s).await.unwrap(), None);

        let mut big = (MAX_FRAME + 1).to_be_bytes().to_vec();
        big.extend_from_slice(b"{}");
        let e = read_frame::<_, Reading>(&mut big.as_slice()).await.unwrap_err();
        assert!(matches!(e, FrameError::Oversized { len, .. } if len == MAX_FRAME + 1));

        let mut junk = 5u32.to_be_bytes().to_vec();
        junk.extend_from_slice(b"\xffoops");
        let e = read_frame::<_, Reading>(&mut junk.as_slice()).await.unwrap_err();
        assert!(matches!(e, FrameError::Garbage));

        let mut cut = 50u32.to_be_bytes().to_vec();
        cut.extend_from_slice(b"{\"sensor\":");
        let e = read_frame::<_, Reading>(&mut cut.as_slice()).await.unwrap_err();
        assert!(matches!(e, FrameError::Truncated));
        let e = read_frame::<_, Reading>(&mut &[0u8, 0][..]).await.unwrap_err();
        assert!(matches!(e, FrameError::Truncated));
    }
}
