//! TLS 1.3 with the server's certificate chain checked against a pinned CA, and one `POST`
//! through it, timed phase by phase.
//!
//! The verifier, the provider and the record sizes are the uplink's own (`wary_uplink::tls`,
//! which says what is and is not verified), so the probe measures exactly what the uplink
//! ships; this module adds the per-phase timings and the probe's finer error names.
//!
//! ```ignore
//! let pinned = Pinned { ca: PINNED_CA_DER, server_name: "cloud.wary.test" };
//! let records = Records { read: &mut read_buf[..], write: &mut write_buf[..], max_fragment: None };
//! let (result, timing) = tls::post_tls(stack, server, &post, limit, buffers, records, &pinned, &mut rng).await;
//! ```

use core::net::SocketAddrV4;

use embassy_net::Stack;
use embassy_net::tcp::TcpSocket;
use embassy_time::{Duration, Instant, with_deadline};
use embedded_tls::{TlsConfig, TlsConnection, TlsContext, TlsError};
use rand_chacha::ChaCha20Rng;
// One verifier for the probe and the uplink: the probe measures what the uplink ships.
pub use wary_uplink::tls::{CERT_CHAIN, MAX_RECORD, Pinned, Provider, Records, Suite, Verifier};

use crate::ProbeError;
use crate::exchange::{self, Post, Reply, ReplyError, SocketBuffers, Timing};

impl ReplyError for TlsError {
    fn after_request(self, reply_bytes: usize) -> ProbeError {
        match self {
            TlsError::Io(_) => ProbeError::Reset,
            // The peer's close_notify, or its TCP close in the middle of a record.
            TlsError::ConnectionClosed | TlsError::IoError if reply_bytes == 0 => ProbeError::Closed,
            TlsError::ConnectionClosed | TlsError::IoError => ProbeError::Truncated,
            other => ProbeError::Record(other),
        }
    }
}

/// What a failed handshake means: the network's failure, or TLS's own.
fn handshake_failure(err: TlsError) -> ProbeError {
    match err {
        // The socket failed or the peer closed it without an alert.
        TlsError::Io(_) | TlsError::IoError => ProbeError::HandshakeBroken,
        other => ProbeError::Tls(other),
    }
}

/// Connects, runs the handshake against `pinned`, `POST`s once and reads the reply, within
/// `limit` overall. Random bytes for the handshake come from `rng`.
#[allow(clippy::too_many_arguments)]
pub async fn post_tls(
    stack: Stack<'_>,
    server: SocketAddrV4,
    post: &Post<'_>,
    limit: Duration,
    buffers: &mut SocketBuffers,
    records: Records<'_>,
    pinned: &Pinned<'_>,
    rng: &mut ChaCha20Rng,
) -> (Result<Reply, ProbeError>, Timing) {
    let deadline = Instant::now().checked_add(limit).unwrap_or(Instant::MAX);
    let mut timing = Timing::default();
    let (rx, tx, head) = buffers.parts();
    let head_len = match exchange::ready(stack, post, head).await {
        Ok(len) => len,
        Err(err) => return (Err(err), timing),
    };
    let mut socket = TcpSocket::new(stack, rx, tx);
    let started = Instant::now();
    if let Err(err) = exchange::connect(&mut socket, server, deadline).await {
        exchange::finish(&mut socket, false, deadline).await;
        return (Err(err), timing);
    }
    timing.connect_us = started.elapsed().as_micros();

    let mut config = TlsConfig::new().with_server_name(pinned.server_name);
    if let Some(max) = records.max_fragment {
        config = config.with_max_fragment_length(max);
    }
    let mut tls: TlsConnection<'_, _, Suite> = TlsConnection::new(&mut socket, records.read, records.write);
    let mut provider = Provider::new(rng, pinned.ca);
    let handshake_at = Instant::now();
    let opened = with_deadline(deadline, tls.open(TlsContext::new(&config, &mut provider))).await;
    timing.handshake_us = handshake_at.elapsed().as_micros();
    let result = match opened {
        Err(_) => Err(ProbeError::HandshakeTimeout),
        Ok(Err(err)) => Err(handshake_failure(err)),
        // Finished without a verified certificate and signature: nobody was authenticated.
        Ok(Ok(())) if !provider.authenticated() => Err(ProbeError::Tls(TlsError::InvalidCertificate)),
        Ok(Ok(())) => {
            let sent_at = Instant::now();
            let reply = exchange::request(&mut tls, head_len, post.body, head, deadline).await;
            timing.request_us = sent_at.elapsed().as_micros();
            reply
        }
    };
    if result.is_ok() {
        // close_notify, so the server sees a clean end rather than a truncation.
        let _ = with_deadline(deadline, tls.close()).await;
    }
    exchange::finish(&mut socket, result.is_ok(), deadline).await;
    (result, timing)
}
