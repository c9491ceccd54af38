//! A raw event-plane client that speaks the handshake of spec section 2
//! (or not).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use loadgate::wire::{self, Frame, Nonce};

use super::{encoded, legacy, random_nonce};

/// How long a client waits for the frontend's Challenge.
const CHALLENGE_WAIT: Duration = Duration::from_secs(3);
/// A legacy frontend sends no Challenge: how long to wait before going on.
const LEGACY_CHALLENGE_WAIT: Duration = Duration::from_millis(200);

/// One TCP connection to a frontend's event port, driven by hand.
pub struct EventConn {
    pub stream: TcpStream,
    /// Bytes read but not yet decoded.
    pending: BytesMut,
    /// The Challenge's nonce, once read.
    pub frontend_nonce: Option<Nonce>,
}

/// What a completed handshake sent: the Proof frame (for a replay).
#[derive(Clone, Debug)]
pub struct Handshake {
    pub proof_frame: Vec<u8>,
}

impl EventConn {
    /// Connects (bounded).
    pub fn connect(addr: SocketAddr) -> io::Result<EventConn> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_nodelay(true)?;
        EventConn::from_stream(stream)
    }

    /// Wraps an open connection (either side of the event plane).
    pub fn from_stream(stream: TcpStream) -> io::Result<EventConn> {
        stream.set_nonblocking(false)?;
        stream.set_write_timeout(Some(Duration::from_secs(2)))?;
        Ok(EventConn { stream, pending: BytesMut::new(), frontend_nonce: None })
    }

    /// Reads one frame (bounded); `Ok(None)` when none completed in time,
    /// an error when the peer closed or sent bytes that do not decode.
    pub fn read_frame(&mut self, within: Duration) -> io::Result<Option<Frame>> {
        let deadline = Instant::now() + within;
        let mut buf = [0u8; 4096];
        loop {
            match wire::decode(&mut self.pending) {
                Ok(Some(frame)) => return Ok(Some(frame)),
                Ok(None) => {}
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.stream.set_read_timeout(Some(left))?;
            match self.stream.read(&mut buf) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed by the peer")),
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads the frontend's Challenge (bounded); `None` when none came.
    pub fn read_challenge(&mut self, within: Duration) -> io::Result<Option<Nonce>> {
        let nonce = match self.read_frame(within)? {
            Some(Frame::Challenge { nonce }) => Some(nonce),
            Some(other) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} instead of a Challenge", other.kind_name()),
                ))
            }
            None => None,
        };
        self.frontend_nonce = nonce;
        Ok(nonce)
    }

    /// The whole worker side of the handshake with `secret`: reads the
    /// Challenge, sends a Proof, reads the Welcome and checks its MAC.
    /// Against a legacy frontend (no Challenge) it returns at once.
    pub fn handshake(&mut self, secret: &str) -> Result<Handshake, String> {
        let wait = if legacy() { LEGACY_CHALLENGE_WAIT } else { CHALLENGE_WAIT };
        let Some(frontend_nonce) = self.read_challenge(wait).map_err(|e| format!("reading the challenge: {e}"))? else {
            if legacy() {
                return Ok(Handshake { proof_frame: Vec::new() });
            }
            return Err(format!("no Challenge within {wait:?}"));
        };
        let nonce = random_nonce();
        let mac = wire::proof_mac(secret.as_bytes(), &frontend_nonce, &nonce);
        let proof_frame = encoded(&Frame::Proof { nonce, mac });
        self.send_raw(&proof_frame).map_err(|e| format!("sending the proof: {e}"))?;
        match self.read_frame(Duration::from_secs(3)).map_err(|e| format!("reading the welcome: {e}"))? {
            Some(Frame::Welcome { mac })
                if wire::verify_welcome_mac(secret.as_bytes(), &frontend_nonce, &nonce, &mac) =>
            {
                Ok(Handshake { proof_frame })
            }
            Some(Frame::Welcome { .. }) => Err("the Welcome's MAC does not verify".into()),
            Some(other) => Err(format!("{} instead of a Welcome", other.kind_name())),
            None => Err("no Welcome within 3 s".into()),
        }
    }

    /// Connects and completes the handshake with `secret` (panics if refused).
    pub fn authenticated(addr: SocketAddr, secret: &str) -> EventConn {
        let mut conn = EventConn::connect(addr).expect("connect to the event port");
        conn.handshake(secret).unwrap_or_else(|e| panic!("handshake with the right secret failed: {e}"));
        conn
    }

    /// Writes `frame`.
    pub fn send(&mut self, frame: &Frame) -> io::Result<()> {
        let mut buf = BytesMut::new();
        wire::encode(frame, &mut buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        self.send_raw(&buf)
    }

    /// Writes raw bytes.
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// True when the frontend closes this connection within `within`
    /// (EOF or reset); bytes it sends meanwhile are skipped.
    pub fn closed_within(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut buf = [0u8; 1024];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            if self.stream.set_read_timeout(Some(left)).is_err() {
                return true;
            }
            match self.stream.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return true,
            }
        }
    }
}

/// A Register frame.
pub fn register(worker: u64, incarnation: u64, dp_size: u32, model: &str, http_addr: &str) -> Frame {
    Frame::Register { worker, incarnation, dp_size, model: model.to_owned(), http_addr: http_addr.to_owned() }
}
