//! The event-plane handshake: the decoder of Challenge, Proof and Welcome
//! frames equals a byte-by-byte reference of the documented layout (same
//! verdict, same bytes consumed, same fields), and the MACs accept exactly
//! what was computed for the same secret, nonces and direction.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::arbitrary::{self, Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use loadgate::wire::{
    decode, encode, proof_mac, verify_proof_mac, verify_welcome_mac, welcome_mac, Frame, Nonce, WireError, HEADER_LEN,
    MAGIC, NONCE_LEN, TAG_LEN,
};

#[derive(Arbitrary, Debug)]
enum Input {
    /// A header of a handshake kind (or a neighbour) and some payload bytes.
    Bytes { kind: u8, len: u8, payload: Vec<u8> },
    /// MACs under two secrets; `flip` names one bit of mac | nonces to flip.
    Macs { secret: Vec<u8>, other: Vec<u8>, frontend: Nonce, worker: Nonce, flip: u16 },
}

/// What the reference decoder says about `bytes`.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    NeedMore,
    Frame(Frame, usize),
    Refused(WireError),
}

/// The documented layout, read directly: kind 4 = 32-byte nonce, 5 = nonce
/// then mac, 6 = mac; 1..=3 are the load frames and 7..=8 the frontends'
/// (not modelled here).
fn reference(bytes: &[u8]) -> Option<Verdict> {
    let fixed = |kind: u8| match kind {
        4 => Some(NONCE_LEN),
        5 => Some(NONCE_LEN + TAG_LEN),
        6 => Some(TAG_LEN),
        _ => None,
    };
    if bytes.len() < 2 {
        return Some(Verdict::NeedMore);
    }
    let kind = bytes[1];
    let Some(want) = fixed(kind) else {
        let modelled_elsewhere = (1..=3).contains(&kind) || (7..=8).contains(&kind);
        return if modelled_elsewhere { None } else { Some(Verdict::Refused(WireError::UnknownKind(kind))) };
    };
    if bytes.len() < HEADER_LEN {
        return Some(Verdict::NeedMore);
    }
    let len = usize::from(bytes[2]) << 8 | usize::from(bytes[3]);
    if len != want {
        return Some(Verdict::Refused(WireError::BadLength { kind, len }));
    }
    let Some(payload) = bytes.get(HEADER_LEN..HEADER_LEN + len) else {
        return Some(Verdict::NeedMore);
    };
    let array = |at: usize| -> [u8; 32] { payload[at..at + 32].try_into().unwrap() };
    let frame = match kind {
        4 => Frame::Challenge { nonce: array(0) },
        5 => Frame::Proof { nonce: array(0), mac: array(NONCE_LEN) },
        _ => Frame::Welcome { mac: array(0) },
    };
    Some(Verdict::Frame(frame, HEADER_LEN + len))
}

/// HMAC pads keys up to 64 bytes with zeros, so keys that differ only in
/// trailing zeros are the same key. Longer keys are hashed: not modelled.
fn same_hmac_key(a: &[u8], b: &[u8]) -> Option<bool> {
    if a.len() > 64 || b.len() > 64 {
        return None;
    }
    let pad = |k: &[u8]| {
        let mut p = [0u8; 64];
        p[..k.len()].copy_from_slice(k);
        p
    };
    Some(pad(a) == pad(b))
}

fuzz_target!(|data: &[u8]| {
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else { return };
    match input {
        Input::Bytes { kind, len, payload } => {
            // Kinds 3..=7: the handshake kinds and their neighbours; lengths
            // around the valid ones.
            let kind = 3 + kind % 5;
            let mut bytes = vec![MAGIC, kind, 0, len];
            bytes.extend_from_slice(&payload);
            for cut in [1, 2, 3, bytes.len()] {
                let cut = cut.min(bytes.len());
                let Some(expected) = reference(&bytes[..cut]) else { continue };
                let mut buf = BytesMut::from(&bytes[..cut]);
                let got = match decode(&mut buf) {
                    Ok(None) => {
                        assert_eq!(buf.len(), cut, "Ok(None) consumed bytes");
                        Verdict::NeedMore
                    }
                    Ok(Some(frame)) => {
                        let used = cut - buf.len();
                        assert_eq!(&buf[..], &bytes[used..cut], "decode consumed from the middle");
                        let mut again = BytesMut::new();
                        encode(&frame, &mut again).unwrap();
                        assert_eq!(&again[..], &bytes[..used], "{frame:?} re-encodes differently");
                        Verdict::Frame(frame, used)
                    }
                    Err(e) => Verdict::Refused(e),
                };
                assert_eq!(got, expected, "bytes {:?}", &bytes[..cut]);
            }
        }
        Input::Macs { secret, other, frontend, worker, flip } => {
            let proof = proof_mac(&secret, &frontend, &worker);
            let welcome = welcome_mac(&secret, &frontend, &worker);
            assert!(verify_proof_mac(&secret, &frontend, &worker, &proof));
            assert!(verify_welcome_mac(&secret, &frontend, &worker, &welcome));
            // Directions never mix (a collision would break SHA-256).
            assert_ne!(proof, welcome);
            assert!(!verify_welcome_mac(&secret, &frontend, &worker, &proof));
            assert!(!verify_proof_mac(&secret, &frontend, &worker, &welcome));
            // One flipped bit anywhere in mac | frontend | worker: refused.
            let bit = usize::from(flip) % (8 * (TAG_LEN + 2 * NONCE_LEN));
            let (mut mac, mut f, mut w) = (proof, frontend, worker);
            let (byte, mask) = (bit / 8, 1u8 << (bit % 8));
            match byte {
                b if b < TAG_LEN => mac[b] ^= mask,
                b if b < TAG_LEN + NONCE_LEN => f[b - TAG_LEN] ^= mask,
                b => w[b - TAG_LEN - NONCE_LEN] ^= mask,
            }
            assert!(!verify_proof_mac(&secret, &f, &w, &mac), "a flipped bit {bit} verified");
            // Another secret verifies exactly when it is the same HMAC key.
            if let Some(same) = same_hmac_key(&secret, &other) {
                assert_eq!(verify_proof_mac(&other, &frontend, &worker, &proof), same);
                assert_eq!(verify_welcome_mac(&other, &frontend, &worker, &welcome), same);
            }
        }
    }
});
