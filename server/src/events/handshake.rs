//! The event-plane handshake, both sides (layout and MACs:
//! `loadgate::wire`). The frontend challenges every connection and applies
//! no frame before a valid Proof; the worker checks the frontend's Welcome
//! before it sends its Register. Both sides give up after
//! [`HANDSHAKE_TIMEOUT`].

use std::fmt;
use std::io::{self, Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use loadgate::wire::{self, Frame, Nonce, NONCE_LEN};

use crate::secret::Secrets;

/// How long each side waits for the other's next handshake frame.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// A fresh random nonce from the operating system's generator.
pub(super) fn fresh_nonce() -> io::Result<Nonce> {
    let mut nonce = [0u8; NONCE_LEN];
    getrandom::fill(&mut nonce).map_err(|e| io::Error::other(format!("no randomness for a nonce: {e}")))?;
    Ok(nonce)
}

/// Frontend side: the Challenge frame for `nonce`.
pub(super) fn challenge_frame(nonce: &Nonce) -> BytesMut {
    let mut buf = BytesMut::new();
    // A Challenge always fits in a frame.
    let _ = wire::encode(&Frame::Challenge { nonce: *nonce }, &mut buf);
    buf
}

/// Frontend side: checks the first frame of a challenged connection; the
/// encoded Welcome to send back when it is a Proof that verifies under
/// either secret, else why the connection is refused.
pub(super) fn answer_proof(secrets: &Secrets, challenge: &Nonce, frame: &Frame) -> Result<BytesMut, String> {
    let Frame::Proof { nonce, mac } = frame else {
        return Err(format!(
            "expected a Proof, got a {} frame (does the worker have the event secret?)",
            frame.kind_name()
        ));
    };
    let Some(welcome) = secrets.accept_event_proof(challenge, nonce, mac) else {
        return Err("the Proof does not verify under the event secret (wrong secret or a replay)".into());
    };
    let mut buf = BytesMut::new();
    // A Welcome always fits in a frame.
    let _ = wire::encode(&Frame::Welcome { mac: welcome }, &mut buf);
    Ok(buf)
}

/// Why a worker's handshake with a frontend failed.
#[derive(Debug)]
pub(super) enum HandshakeError {
    /// No Challenge within [`HANDSHAKE_TIMEOUT`]: the frontend likely has no
    /// secret (it waits for a Register).
    NoChallenge,
    /// No Welcome within [`HANDSHAKE_TIMEOUT`] after the Proof.
    NoWelcome,
    /// The frontend closed the connection (it refused the Proof).
    Closed,
    /// The Welcome does not verify: the frontend does not hold the secret.
    BadWelcome,
    /// Something else than the expected frame.
    Unexpected(&'static str),
    /// Undecodable bytes.
    Wire(wire::WireError),
    /// The socket failed.
    Io(io::Error),
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoChallenge => f.write_str("frontend sent no challenge (does it have the event secret?)"),
            Self::NoWelcome => f.write_str("frontend sent no welcome after the proof"),
            Self::Closed => f.write_str("frontend closed the connection during the handshake (wrong event secret?)"),
            Self::BadWelcome => {
                f.write_str("frontend's welcome does not verify under the event secret (it does not hold it)")
            }
            Self::Unexpected(kind) => write!(f, "frontend sent a {kind} frame during the handshake"),
            Self::Wire(e) => write!(f, "frontend sent undecodable bytes during the handshake: {e}"),
            Self::Io(e) => write!(f, "handshake failed: {e}"),
        }
    }
}

impl From<HandshakeError> for io::Error {
    fn from(e: HandshakeError) -> io::Error {
        match e {
            HandshakeError::Io(e) => e,
            other => io::Error::new(io::ErrorKind::PermissionDenied, other.to_string()),
        }
    }
}

/// Worker side, on a freshly connected blocking stream: waits for the
/// Challenge, sends the Proof, checks the Welcome. The stream's read timeout
/// is cleared on success.
pub(super) fn prove_to_frontend(stream: &mut TcpStream, secrets: &Secrets) -> Result<(), HandshakeError> {
    let mut buf = BytesMut::new();
    let challenge = match read_frame(stream, &mut buf, HandshakeError::NoChallenge)? {
        Frame::Challenge { nonce } => nonce,
        other => return Err(HandshakeError::Unexpected(other.kind_name())),
    };
    let nonce = fresh_nonce().map_err(HandshakeError::Io)?;
    let mut proof = BytesMut::new();
    // A Proof always fits in a frame.
    let _ = wire::encode(&Frame::Proof { nonce, mac: secrets.event_proof(&challenge, &nonce) }, &mut proof);
    stream.write_all(&proof).map_err(HandshakeError::Io)?;
    match read_frame(stream, &mut buf, HandshakeError::NoWelcome)? {
        Frame::Welcome { mac } if secrets.verify_event_welcome(&challenge, &nonce, &mac) => {}
        Frame::Welcome { .. } => return Err(HandshakeError::BadWelcome),
        other => return Err(HandshakeError::Unexpected(other.kind_name())),
    }
    stream.set_read_timeout(None).map_err(HandshakeError::Io)?;
    Ok(())
}

/// Reads until one frame decodes, for at most [`HANDSHAKE_TIMEOUT`];
/// `timeout` is the error when it does not come in time.
fn read_frame(stream: &mut TcpStream, buf: &mut BytesMut, timeout: HandshakeError) -> Result<Frame, HandshakeError> {
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    let mut chunk = [0u8; 256];
    loop {
        if let Some(frame) = wire::decode(buf).map_err(HandshakeError::Wire)? {
            return Ok(frame);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timeout);
        }
        stream.set_read_timeout(Some(left)).map_err(HandshakeError::Io)?;
        match stream.read(&mut chunk) {
            Ok(0) => return Err(HandshakeError::Closed),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return Err(timeout),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted) => {
                return Err(HandshakeError::Closed)
            }
            Err(e) => return Err(HandshakeError::Io(e)),
        }
    }
}
