//! The raw connection under hyper, and how a faulted reply breaks it.
//!
//! hyper only ever writes well-formed responses, but a broken server or network sends half a
//! header block, bytes that are not HTTP, or a reset. So each accepted socket is shared: hyper
//! serves it through [`SharedIo`], and the request's handler keeps a handle to the same socket.
//! When a fault must break the connection, the handler writes its raw bytes and closes or resets
//! the socket itself while hyper is waiting on it, then hands hyper an error, so hyper writes
//! nothing and drops the connection.

use std::io;
use std::net::{Shutdown, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// How long a raw write may wait for a client that does not read.
const RAW_WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// A reply hyper must not write: the connection is broken on purpose instead.
#[derive(Debug)]
pub(crate) enum Broken {
    /// A graceful close (FIN) without a reply byte.
    Close,
    /// A reset (RST) without a reply byte.
    Reset,
    /// These bytes, then a graceful close; `label` names them in the stats.
    Raw {
        /// What goes on the wire.
        bytes: Bytes,
        /// Name under `requests_by_status`.
        label: &'static str,
    },
}

impl Broken {
    /// Name under `requests_by_status`.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Broken::Close => "dropped",
            Broken::Reset => "reset",
            Broken::Raw { label, .. } => label,
        }
    }

    /// Does to the socket what this fault says. hyper is waiting for the reply meanwhile, so
    /// nothing else writes to it.
    pub(crate) async fn apply(&self, stream: &TcpStream) {
        match self {
            Broken::Close => half_close(stream),
            Broken::Reset => {
                // With a zero linger the last close of the socket sends RST instead of FIN.
                // hyper drops its handle right after the error it is handed, which is that close.
                let _ = stream.set_zero_linger();
            }
            Broken::Raw { bytes, .. } => {
                let _ = tokio::time::timeout(RAW_WRITE_TIMEOUT, write_all(stream, bytes)).await;
                half_close(stream);
            }
        }
    }
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "reply broken on purpose ({})", self.label())
    }
}

impl std::error::Error for Broken {}

/// Sends FIN now, whatever hyper does with its handle afterwards.
fn half_close(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).shutdown(Shutdown::Write);
}

async fn write_all(stream: &TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        stream.writable().await?;
        match stream.try_write(bytes) {
            Ok(n) => bytes = bytes.get(n..).unwrap_or_default(),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A socket hyper serves while a handler holds the same socket.
///
/// tokio's `TcpStream` reads and writes through `&self` with readiness (`try_read`,
/// `try_write`), which is what lets two owners share it; this adapter gives hyper the
/// `AsyncRead`/`AsyncWrite` it expects on top of that.
pub(crate) struct SharedIo(pub(crate) Arc<TcpStream>);

impl AsyncRead for SharedIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            ready!(self.0.poll_read_ready(cx))?;
            match self.0.try_read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                // Readiness was stale; polling again registers the waker.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for SharedIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write(buf) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Writes go straight to the socket; there is nothing buffered here.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(match socket2::SockRef::from(&*self.0).shutdown(Shutdown::Write) {
            // The peer may be gone already; there is nothing left to close then.
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
            other => other,
        })
    }
}

/// Binds a listener on `addr` with `SO_REUSEADDR`, so that it can be reopened on the same port
/// while connections accepted before a refusal window are still open or in TIME-WAIT.
pub(crate) fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}
