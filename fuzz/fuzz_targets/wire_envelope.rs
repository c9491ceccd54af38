//! The NATS event plane's envelope (`wire::envelope`) against a reference
//! built from the hmac and siphasher crates directly: arbitrary bytes on an
//! arbitrary subject never panic and open only when the reference check and
//! tag over them match under one of the secrets (then to the frame the reference
//! decodes); sealing is refused exactly when the subject is too long or the
//! frame does not encode; an envelope sealed for a frame opens to it on its subject, and
//! any one changed byte, another subject or another secret refuses it.
#![no_main]

use bytes::BytesMut;
use hmac::{Hmac, Mac};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use loadgate::wire::envelope::{
    open, seal, EnvelopeError, Sealed, CHECK_LEN, ENVELOPE_MAGIC, MAX_ENVELOPE, MAX_SUBJECT,
};
use loadgate::wire::{decode, Frame, WireError, TAG_LEN};
use loadgate::RankLoad;
use sha2::Sha256;
use siphasher::sip::SipHasher24;
use std::hash::Hasher;

#[derive(Arbitrary, Debug)]
enum Input {
    /// Bytes from the bus, with or without a correct check and tag appended.
    Bytes { subject: String, secret: Vec<u8>, body: Vec<u8>, tag_it: bool },
    /// A frame sealed, then maybe changed.
    Sealed {
        subject: String,
        secret: Vec<u8>,
        sent_ms: u64,
        frame: FrameInput,
        flip: Option<(u16, u8)>,
        other: Option<String>,
    },
}

#[derive(Arbitrary, Debug)]
enum FrameInput {
    Register { worker: u64, incarnation: u64, dp_size: u32, model: String, http_addr: String },
    Load { worker: u64, incarnation: u64, rank: u32, seq: u64, load: [u32; 5] },
    Deregister { worker: u64, incarnation: u64 },
}

impl FrameInput {
    fn frame(self) -> Frame {
        match self {
            FrameInput::Register { worker, incarnation, dp_size, model, http_addr } => {
                Frame::Register { worker, incarnation, dp_size, model, http_addr }
            }
            FrameInput::Load { worker, incarnation, rank, seq, load: [a, b, c, d, e] } => {
                let load = RankLoad {
                    active_decode_blocks: a,
                    kv_total_blocks: b,
                    active_prefill_tokens: c,
                    max_num_batched_tokens: d,
                    waiting_requests: e,
                };
                Frame::Load { worker, incarnation, rank, seq, load }
            }
            FrameInput::Deregister { worker, incarnation } => Frame::Deregister { worker, incarnation },
        }
    }
}

/// The reference tag over body and check.
fn tag(secret: &[u8], subject: &str, checked: &[u8]) -> [u8; TAG_LEN] {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
    mac.update(b"loadgate-envelope-v2");
    mac.update(&(subject.len() as u16).to_be_bytes());
    mac.update(subject.as_bytes());
    mac.update(checked);
    mac.finalize().into_bytes().into()
}

/// The reference check over the body.
fn check(secret: &[u8], subject: &str, body: &[u8]) -> [u8; CHECK_LEN] {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
    mac.update(b"loadgate-envelope-check-v2");
    let key: [u8; 16] = mac.finalize().into_bytes()[..16].try_into().unwrap();
    let mut message = (subject.len() as u16).to_be_bytes().to_vec();
    message.extend_from_slice(subject.as_bytes());
    message.extend_from_slice(body);
    let mut sip = SipHasher24::new_with_key(&key);
    sip.write(&message);
    sip.finish().to_le_bytes()
}

/// What the reference says `bytes` opens to under `secret` on `subject`.
fn reference(secret: &[u8], subject: &str, bytes: &[u8]) -> Option<Sealed> {
    let ok_len = bytes.len() > 1 + 8 + CHECK_LEN + TAG_LEN && bytes.len() <= MAX_ENVELOPE;
    if !ok_len || bytes[0] != ENVELOPE_MAGIC || subject.len() > MAX_SUBJECT {
        return None;
    }
    let (checked, got) = bytes.split_at(bytes.len() - TAG_LEN);
    let (body, sum) = checked.split_at(checked.len() - CHECK_LEN);
    if check(secret, subject, body) != sum || tag(secret, subject, checked) != got {
        return None;
    }
    let mut rest = BytesMut::from(&body[9..]);
    let frame = decode(&mut rest).ok().flatten().filter(|_| rest.is_empty())?;
    Some(Sealed { sent_ms: u64::from_be_bytes(body[1..9].try_into().unwrap()), frame })
}

fuzz_target!(|input: Input| match input {
    Input::Bytes { subject, secret, mut body, tag_it } => {
        if tag_it && subject.len() <= MAX_SUBJECT {
            let sum = check(&secret, &subject, &body);
            body.extend_from_slice(&sum);
            let t = tag(&secret, &subject, &body);
            body.extend_from_slice(&t);
        }
        let got = open(&[secret.as_slice()], &subject, &body);
        assert_eq!(got.clone().ok(), reference(&secret, &subject, &body), "{got:?}");
    }
    Input::Sealed { subject, secret, sent_ms, frame, flip, other } => {
        let frame = frame.frame();
        let mut buf = BytesMut::new();
        // Refused only for a reason the reference sees: a subject past the
        // limit, else a frame that does not encode.
        let encodes = loadgate::wire::encode(&frame, &mut BytesMut::new());
        let expected = match encodes {
            _ if subject.len() > MAX_SUBJECT => Err(WireError::SubjectTooLong(subject.len())),
            Err(e) => Err(e),
            Ok(()) => Ok(()),
        };
        let sealed = seal(&secret, &subject, sent_ms, &frame, &mut buf);
        assert_eq!(sealed, expected, "sealing a {}-byte subject", subject.len());
        if sealed.is_err() {
            assert!(buf.is_empty(), "nothing written on an error");
            return;
        }
        let bytes = buf.to_vec();
        assert_eq!(open(&[secret.as_slice()], &subject, &bytes), Ok(Sealed { sent_ms, frame: frame.clone() }));
        if let Some(other) = other.filter(|o| *o != subject) {
            assert!(open(&[secret.as_slice()], &other, &bytes).is_err(), "moved to {other:?}");
        }
        let mut wrong = secret.clone();
        wrong.push(1);
        assert_eq!(open(&[wrong.as_slice()], &subject, &bytes), Err(EnvelopeError::Tag));
        if let Some((at, bits)) = flip.filter(|(_, bits)| *bits != 0) {
            let mut bent = bytes.clone();
            let at = usize::from(at) % bent.len();
            bent[at] ^= bits;
            assert!(open(&[secret.as_slice()], &subject, &bent).is_err(), "byte {at} changed by {bits:#x}");
        }
    }
});
