//! [`seal`] and [`open`]: a frame for a shared bus (the NATS event plane),
//! where no connection vouches for its sender. The frame travels with the
//! subject it is published on and the sender's clock, under an HMAC-SHA256
//! of the event secret: a client without the secret can neither forge nor
//! alter one, nor move one to another subject; the receiver checks the
//! clock against a window, the incarnation and the seq (replays).
//!
//! ```text
//! envelope = ENVELOPE_MAGIC (1) | sent_ms (8, big-endian) | frame (its wire encoding) | tag (32)
//! tag      = HMAC-SHA256(secret, "loadgate-envelope-v1" | subject length (2, BE) | subject
//!                                | ENVELOPE_MAGIC | sent_ms | frame)
//! ```
//!
//! The tag is checked (constant time) before the frame is decoded: nothing
//! unauthenticated is parsed beyond the length of the whole.

use bytes::{BufMut, BytesMut};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{decode, encode, Frame, WireError, MAX_FRAME, TAG_LEN};

/// The first byte of an envelope (version 1).
pub const ENVELOPE_MAGIC: u8 = 0xE1;

/// The longest envelope: a frame of [`MAX_FRAME`] bytes.
pub const MAX_ENVELOPE: usize = 1 + 8 + MAX_FRAME + TAG_LEN;

/// The longest subject an envelope is sealed for.
pub const MAX_SUBJECT: usize = 1024;

const CONTEXT: &[u8] = b"loadgate-envelope-v1";

/// What an opened envelope holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sealed {
    /// The sender's clock when it sealed it (ms since the Unix epoch).
    pub sent_ms: u64,
    /// The frame.
    pub frame: Frame,
}

/// Why an envelope was not opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// Shorter than an empty frame's envelope, or longer than [`MAX_ENVELOPE`].
    Length(usize),
    /// The first byte is not [`ENVELOPE_MAGIC`].
    Magic(u8),
    /// The subject is longer than [`MAX_SUBJECT`].
    Subject(usize),
    /// The tag is not this subject's and content's under any of the secrets.
    Tag,
    /// Authentic, yet not one whole frame (a sender's bug).
    Frame,
}

impl std::fmt::Display for EnvelopeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvelopeError::Length(n) => write!(f, "an envelope of {n} bytes"),
            EnvelopeError::Magic(b) => write!(f, "not an envelope (first byte {b:#04x})"),
            EnvelopeError::Subject(n) => write!(f, "a subject of {n} bytes"),
            EnvelopeError::Tag => f.write_str("the envelope's tag does not match (no event secret, or altered)"),
            EnvelopeError::Frame => f.write_str("the envelope holds no whole frame"),
        }
    }
}

impl std::error::Error for EnvelopeError {}

/// The HMAC of one secret with the context already in (the key's pads and
/// the context hashed once, not per envelope).
fn keyed_context(secret: &[u8]) -> Hmac<Sha256> {
    // HMAC accepts keys of any length, so this never fails.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts any key length");
    mac.update(CONTEXT);
    mac
}

fn tagged(mut mac: Hmac<Sha256>, subject: &str, body: &[u8]) -> Hmac<Sha256> {
    // At most MAX_SUBJECT: fits in two bytes.
    mac.update(&(subject.len() as u16).to_be_bytes());
    mac.update(subject.as_bytes());
    mac.update(body);
    mac
}

fn keyed(secret: &[u8], subject: &str, body: &[u8]) -> Hmac<Sha256> {
    tagged(keyed_context(secret), subject, body)
}

/// The secrets that open envelopes, each prepared once: what a receiver
/// keeps to open many ([`Openers::open`] is [`open`] without rehashing the
/// keys).
#[derive(Clone)]
pub struct Openers(Vec<Hmac<Sha256>>);

impl std::fmt::Debug for Openers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Openers({} secrets)", self.0.len())
    }
}

impl Openers {
    /// Prepares `secrets` (the current one first).
    pub fn new(secrets: &[&[u8]]) -> Self {
        Openers(secrets.iter().map(|s| keyed_context(s)).collect())
    }

    /// As [`open`] with these secrets.
    ///
    /// # Errors
    ///
    /// See [`EnvelopeError`].
    pub fn open(&self, subject: &str, src: &[u8]) -> Result<Sealed, EnvelopeError> {
        open_with(src, subject, |body, tag| {
            self.0.iter().any(|mac| tagged(mac.clone(), subject, body).verify_slice(tag).is_ok())
        })
    }
}

/// Appends `frame`, sealed for `subject` at `sent_ms` under `secret`, to
/// `dst`.
///
/// # Errors
///
/// The frame does not encode ([`WireError::Oversized`]), or the subject is
/// longer than [`MAX_SUBJECT`] (also `Oversized`); nothing is written then.
pub fn seal(secret: &[u8], subject: &str, sent_ms: u64, frame: &Frame, dst: &mut BytesMut) -> Result<(), WireError> {
    if subject.len() > MAX_SUBJECT {
        return Err(WireError::Oversized(subject.len()));
    }
    let mut body = BytesMut::with_capacity(9 + 64);
    body.put_u8(ENVELOPE_MAGIC);
    body.put_u64(sent_ms);
    encode(frame, &mut body)?;
    let tag = keyed(secret, subject, &body).finalize().into_bytes();
    dst.reserve(body.len() + TAG_LEN);
    dst.extend_from_slice(&body);
    dst.extend_from_slice(&tag);
    Ok(())
}

/// Opens an envelope received on `subject`, sealed under one of `secrets`
/// (the current one and, during a rotation, the previous).
///
/// # Errors
///
/// See [`EnvelopeError`]; nothing is decoded from an envelope whose tag does
/// not match.
pub fn open(secrets: &[&[u8]], subject: &str, src: &[u8]) -> Result<Sealed, EnvelopeError> {
    open_with(src, subject, |body, tag| {
        secrets.iter().any(|secret| keyed(secret, subject, body).verify_slice(tag).is_ok())
    })
}

/// [`open`] with `verified(body, tag)` deciding the tag.
fn open_with(src: &[u8], subject: &str, verified: impl Fn(&[u8], &[u8]) -> bool) -> Result<Sealed, EnvelopeError> {
    if src.len() < 1 + 8 + TAG_LEN + 1 || src.len() > MAX_ENVELOPE {
        return Err(EnvelopeError::Length(src.len()));
    }
    if src[0] != ENVELOPE_MAGIC {
        return Err(EnvelopeError::Magic(src[0]));
    }
    if subject.len() > MAX_SUBJECT {
        return Err(EnvelopeError::Subject(subject.len()));
    }
    let (body, tag) = src.split_at(src.len() - TAG_LEN);
    if !verified(body, tag) {
        return Err(EnvelopeError::Tag);
    }
    let sent_ms = u64::from_be_bytes(body[1..9].try_into().expect("8 bytes"));
    let mut frame = BytesMut::from(&body[9..]);
    match decode(&mut frame) {
        Ok(Some(frame_value)) if frame.is_empty() => Ok(Sealed { sent_ms, frame: frame_value }),
        _ => Err(EnvelopeError::Frame),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RankLoad;

    const SECRET: &[u8] = b"an event secret of 32 bytes or so";

    fn load() -> Frame {
        let load = RankLoad { active_decode_blocks: 3, kv_total_blocks: 10, ..Default::default() };
        Frame::Load { worker: 7, incarnation: 9, rank: 0, seq: 42, load }
    }

    fn sealed(subject: &str) -> Vec<u8> {
        let mut buf = BytesMut::new();
        seal(SECRET, subject, 1_700_000_000_000, &load(), &mut buf).unwrap();
        buf.to_vec()
    }

    #[test]
    fn a_sealed_frame_opens_on_its_subject_under_its_secret() {
        let bytes = sealed("lg.ev.m.7");
        let opened = open(&[b"old secret", SECRET], "lg.ev.m.7", &bytes).unwrap();
        assert_eq!(opened, Sealed { sent_ms: 1_700_000_000_000, frame: load() });
    }

    #[test]
    fn another_subject_secret_or_any_flipped_bit_is_refused() {
        let bytes = sealed("lg.ev.m.7");
        assert_eq!(open(&[SECRET], "lg.ev.m.8", &bytes), Err(EnvelopeError::Tag));
        assert_eq!(open(&[b"not the secret"], "lg.ev.m.7", &bytes), Err(EnvelopeError::Tag));
        for i in 1..bytes.len() {
            for bit in 0..8 {
                let mut bent = bytes.clone();
                bent[i] ^= 1 << bit;
                assert_eq!(open(&[SECRET], "lg.ev.m.7", &bent), Err(EnvelopeError::Tag), "byte {i} bit {bit}");
            }
        }
        let mut bent = bytes.clone();
        bent[0] ^= 1;
        assert!(matches!(open(&[SECRET], "lg.ev.m.7", &bent), Err(EnvelopeError::Magic(_))));
        assert!(matches!(open(&[SECRET], "lg.ev.m.7", &bytes[..20]), Err(EnvelopeError::Length(20))));
    }

    #[test]
    fn prepared_openers_agree_with_open() {
        let bytes = sealed("lg.ev.m.7");
        let openers = Openers::new(&[b"old secret", SECRET]);
        assert_eq!(openers.open("lg.ev.m.7", &bytes), open(&[SECRET], "lg.ev.m.7", &bytes));
        assert_eq!(openers.open("lg.ev.m.8", &bytes), Err(EnvelopeError::Tag));
        assert_eq!(Openers::new(&[b"old secret"]).open("lg.ev.m.7", &bytes), Err(EnvelopeError::Tag));
    }

    #[test]
    fn an_authentic_envelope_with_trailing_bytes_is_refused() {
        let mut body = BytesMut::new();
        body.put_u8(ENVELOPE_MAGIC);
        body.put_u64(1);
        encode(&load(), &mut body).unwrap();
        body.put_u8(0);
        let tag = keyed(SECRET, "s", &body).finalize().into_bytes();
        body.extend_from_slice(&tag);
        assert_eq!(open(&[SECRET], "s", &body), Err(EnvelopeError::Frame));
    }
}
