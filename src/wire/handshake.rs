//! The event-plane handshake's MACs: HMAC-SHA256 over both nonces, with a
//! context string per direction so a Proof can never pass as a Welcome.
//! Pure functions of the secret's bytes; comparisons are constant-time.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes in a handshake nonce.
pub const NONCE_LEN: usize = 32;

/// Bytes in a handshake MAC (HMAC-SHA256).
pub const TAG_LEN: usize = 32;

/// A handshake nonce: fresh random bytes per connection and side.
pub type Nonce = [u8; NONCE_LEN];

const PROOF_CONTEXT: &[u8] = b"loadgate-event-proof-v1";
const WELCOME_CONTEXT: &[u8] = b"loadgate-event-welcome-v1";

fn keyed(secret: &[u8], context: &[u8], first: &Nonce, second: &Nonce) -> Hmac<Sha256> {
    // HMAC accepts keys of any length, so this never fails.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts any key length");
    mac.update(context);
    mac.update(first);
    mac.update(second);
    mac
}

/// The worker's Proof MAC: HMAC-SHA256(secret, `"loadgate-event-proof-v1"`
/// || frontend_nonce || worker_nonce).
pub fn proof_mac(secret: &[u8], frontend_nonce: &Nonce, worker_nonce: &Nonce) -> [u8; TAG_LEN] {
    keyed(secret, PROOF_CONTEXT, frontend_nonce, worker_nonce).finalize().into_bytes().into()
}

/// Whether `mac` is [`proof_mac`] under `secret` (constant time).
pub fn verify_proof_mac(secret: &[u8], frontend_nonce: &Nonce, worker_nonce: &Nonce, mac: &[u8; TAG_LEN]) -> bool {
    keyed(secret, PROOF_CONTEXT, frontend_nonce, worker_nonce).verify_slice(mac).is_ok()
}

/// The frontend's Welcome MAC: HMAC-SHA256(secret,
/// `"loadgate-event-welcome-v1"` || worker_nonce || frontend_nonce).
pub fn welcome_mac(secret: &[u8], frontend_nonce: &Nonce, worker_nonce: &Nonce) -> [u8; TAG_LEN] {
    keyed(secret, WELCOME_CONTEXT, worker_nonce, frontend_nonce).finalize().into_bytes().into()
}

/// Whether `mac` is [`welcome_mac`] under `secret` (constant time).
pub fn verify_welcome_mac(secret: &[u8], frontend_nonce: &Nonce, worker_nonce: &Nonce, mac: &[u8; TAG_LEN]) -> bool {
    keyed(secret, WELCOME_CONTEXT, worker_nonce, frontend_nonce).verify_slice(mac).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef";

    #[test]
    fn macs_verify_only_with_their_secret_nonces_and_direction() {
        let (f, w) = ([1u8; NONCE_LEN], [2u8; NONCE_LEN]);
        let proof = proof_mac(SECRET, &f, &w);
        assert!(verify_proof_mac(SECRET, &f, &w, &proof));
        assert!(!verify_proof_mac(b"0123456789abcdeF", &f, &w, &proof));
        assert!(!verify_proof_mac(SECRET, &w, &f, &proof));
        assert!(!verify_proof_mac(SECRET, &[3u8; NONCE_LEN], &w, &proof));
        let welcome = welcome_mac(SECRET, &f, &w);
        assert_ne!(proof, welcome, "a proof never passes as a welcome");
        assert!(verify_welcome_mac(SECRET, &f, &w, &welcome));
        assert!(!verify_welcome_mac(SECRET, &f, &w, &proof));
        assert!(!verify_proof_mac(SECRET, &f, &w, &welcome));
    }

    #[test]
    fn proof_mac_is_hmac_sha256_of_the_documented_message() {
        // The message layout, spelled out: context || frontend || worker.
        let (f, w) = ([0xAAu8; NONCE_LEN], [0x55u8; NONCE_LEN]);
        let mut message = b"loadgate-event-proof-v1".to_vec();
        message.extend_from_slice(&f);
        message.extend_from_slice(&w);
        let mut mac = Hmac::<Sha256>::new_from_slice(SECRET).unwrap();
        mac.update(&message);
        let expected: [u8; TAG_LEN] = mac.finalize().into_bytes().into();
        assert_eq!(proof_mac(SECRET, &f, &w), expected);
        let mut message = b"loadgate-event-welcome-v1".to_vec();
        message.extend_from_slice(&w);
        message.extend_from_slice(&f);
        let mut mac = Hmac::<Sha256>::new_from_slice(SECRET).unwrap();
        mac.update(&message);
        let expected: [u8; TAG_LEN] = mac.finalize().into_bytes().into();
        assert_eq!(welcome_mac(SECRET, &f, &w), expected);
    }
}
