//! The request proof, exactly as spec section 1 defines it (HMAC-SHA256;
//! the handshake MACs come from the library:
//! `loadgate::wire::{proof_mac, welcome_mac}`).

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::BytesMut;
use hmac::{Hmac, Mac};
use loadgate::wire::{self, Frame, Nonce};
use sha2::{Digest as _, Sha256};

use super::small_request;

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

/// The milliseconds since the Unix epoch now.
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The request proof header value for `METHOD PATH` with `body` at `unix_ms`:
/// `v2.<unix_ms>.<hex SHA-256(body)>.<hex HMAC(secret,
/// "loadgate-request-v2\n<ms>\n<METHOD> <PATH>\n<hex SHA-256(body)>")>`.
pub fn request_proof(secret: &[u8], method: &str, path: &str, body: &[u8], unix_ms: u64) -> String {
    let hex = |bytes: &[u8]| -> String { bytes.iter().map(|b| format!("{b:02x}")).collect() };
    let digest = hex(&Sha256::digest(body));
    let message = format!("loadgate-request-v2\n{unix_ms}\n{method} {path}\n{digest}");
    let mac = hmac(secret, &[message.as_bytes()]);
    format!("v2.{unix_ms}.{digest}.{}", hex(&mac))
}

/// The bytes [`complete`] sends for `model`.
pub fn small_body(model: &str) -> Vec<u8> {
    serde_json::to_vec(&small_request(model)).expect("a JSON value serialises")
}

/// A nonce for tests (need not be cryptographic here).
pub fn random_nonce() -> Nonce {
    std::array::from_fn(|_| fastrand::u8(..))
}

/// `frame`'s bytes on the wire.
pub fn encoded(frame: &Frame) -> Vec<u8> {
    let mut buf = BytesMut::new();
    wire::encode(frame, &mut buf).expect("a frame the suite builds encodes");
    buf.to_vec()
}
