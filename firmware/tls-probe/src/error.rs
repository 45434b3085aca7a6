//! Why one exchange gave no reply, named by how far it got.

use embedded_tls::TlsError;

/// How far an exchange got before it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, defmt::Format)]
pub enum Phase {
    /// Nothing was attempted: no network, or the request could not be encoded.
    Setup,
    /// Opening the TCP connection.
    Connect,
    /// The TLS handshake: no request byte has left the device.
    Handshake,
    /// Handing the request to the connection; not all of it was when the failure came.
    Send,
    /// The whole request was handed over; waiting for or reading the reply.
    Reply,
}

/// Why an exchange gave no reply.
///
/// What each means to the wary policy (the attempt's failure kind):
///
/// | variant | phase | may have landed | wary failure |
/// |---|---|---|---|
/// | `NoNetwork`, `BadRequest` | setup | no | not an attempt |
/// | `Refused`, `HandshakeBroken` | connect, handshake | no | `Refused` |
/// | `ConnectTimeout`, `HandshakeTimeout` | connect, handshake | no | `ConnectTimeout` |
/// | `Tls` | handshake | no | `Tls`: never retried |
/// | `SendFailed` | send | no | `Refused` (never sent whole) |
/// | `Reset`, `Closed`, `Truncated`, `Malformed`, `HeadersTooLarge` | reply | yes | `Reset` |
/// | `ResponseTimeout` | reply | yes | `ResponseTimeout` |
/// | `Record` | reply | yes | `Tls`: never retried, but the write may have landed |
///
/// A refused certificate is a [`ProbeError::Tls`] from the handshake: it fails the same way
/// every time, so retrying it only spends the budget, and no request byte was sent.
#[derive(Clone, Copy, Debug, defmt::Format)]
#[non_exhaustive]
pub enum ProbeError {
    /// Never sent: the link is down or there is no DHCP lease yet.
    NoNetwork,
    /// Never sent: the request cannot be encoded (a path, host or key that is not visible
    /// ASCII, or a head longer than its buffer).
    BadRequest,
    /// Never sent: the server refused the connection, or there is no route to it.
    Refused,
    /// Never sent: no TCP connection within the time limit.
    ConnectTimeout,
    /// Never sent: the handshake did not finish within the time limit.
    HandshakeTimeout,
    /// Never sent: the connection broke or was closed during the handshake, without a TLS
    /// alert (the network's failure, not the server's identity).
    HandshakeBroken,
    /// Never sent: the handshake failed on TLS's own terms: a certificate chain that does not
    /// lead to the pinned CA or names another server, a bad signature, an alert from the
    /// server, parameters the device does not speak.
    Tls(TlsError),
    /// Never landed: the connection failed before the whole request was handed to it.
    SendFailed,
    /// May have landed: the connection was reset or broke after the request went out.
    Reset,
    /// May have landed: the server closed the connection after the request with no reply.
    Closed,
    /// May have landed: no complete header block within the time limit.
    ResponseTimeout,
    /// May have landed: the reply was cut short in its status line or header block.
    Truncated,
    /// May have landed: the reply is not a readable HTTP/1.x response.
    Malformed,
    /// May have landed: the reply's header block is larger than its buffer.
    HeadersTooLarge,
    /// May have landed: a TLS record after the request could not be read: larger than the
    /// record buffer, failing authentication, or a message the device does not handle.
    Record(TlsError),
}

impl ProbeError {
    /// The phase the exchange had reached.
    pub const fn phase(self) -> Phase {
        match self {
            Self::NoNetwork | Self::BadRequest => Phase::Setup,
            Self::Refused | Self::ConnectTimeout => Phase::Connect,
            Self::HandshakeTimeout | Self::HandshakeBroken | Self::Tls(_) => Phase::Handshake,
            Self::SendFailed => Phase::Send,
            Self::Reset
            | Self::Closed
            | Self::ResponseTimeout
            | Self::Truncated
            | Self::Malformed
            | Self::HeadersTooLarge
            | Self::Record(_) => Phase::Reply,
        }
    }

    /// Whether the server may hold the whole request: only once the reply phase was reached.
    pub const fn may_have_landed(self) -> bool {
        matches!(self.phase(), Phase::Reply)
    }
}
