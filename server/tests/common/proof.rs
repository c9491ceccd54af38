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

/// The worker, and its life, a request proof is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub worker: u64,
    pub incarnation: u64,
}

/// The request proof header value for `METHOD PATH` with `body` to
/// `target` at `unix_ms`, with a fresh nonce:
/// `v3.<unix_ms>.<worker>.<incarnation>.<nonce hex>.<hex SHA-256(body)>.<hex
/// HMAC(secret, "loadgate-request-v3\n<ms>\n<worker>\n<incarnation>\n<nonce
/// hex>\n<METHOD> <PATH>\n<hex SHA-256(body)>")>`.
pub fn request_proof(secret: &[u8], method: &str, path: &str, body: &[u8], target: Target, unix_ms: u64) -> String {
    request_proof_with_nonce(secret, method, path, body, target, fastrand::u128(..), unix_ms)
}

/// As [`request_proof`], with the nonce given.
pub fn request_proof_with_nonce(
    secret: &[u8],
    method: &str,
    path: &str,
    body: &[u8],
    target: Target,
    nonce: u128,
    unix_ms: u64,
) -> String {
    let hex = |bytes: &[u8]| -> String { bytes.iter().map(|b| format!("{b:02x}")).collect() };
    let digest = hex(&Sha256::digest(body));
    let Target { worker, incarnation } = target;
    let message =
        format!("loadgate-request-v3\n{unix_ms}\n{worker}\n{incarnation}\n{nonce:032x}\n{method} {path}\n{digest}");
    let mac = hmac(secret, &[message.as_bytes()]);
    format!("v3.{unix_ms}.{worker}.{incarnation}.{nonce:032x}.{digest}.{}", hex(&mac))
}

/// The worker at `base` (`http://HOST:PORT`), from its `GET /info` (open,
/// no proof needed).
pub async fn target_of(client: &reqwest::Client, base: &str) -> Target {
    let info: serde_json::Value =
        client.get(format!("{base}/info")).send().await.expect("GET /info").json().await.expect("/info JSON");
    Target {
        worker: info["worker_id"].as_u64().expect("worker_id in /info"),
        incarnation: info["incarnation"].as_u64().expect("incarnation in /info"),
    }
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
