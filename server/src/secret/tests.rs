//! The secrets' loading, the request proof and the handshake MACs.

use super::*;

const A: &[u8] = b"0123456789abcdef-current";
const B: &[u8] = b"0123456789abcdef-previous";
const NOW: u64 = 1_700_000_000_000;
const EMPTY: BodyDigest = [
    0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14, 0x9a, 0xfb, 0xf4, 0xc8, 0x99, 0x6f, 0xb9, 0x24, 0x27, 0xae, 0x41,
    0xe4, 0x64, 0x9b, 0x93, 0x4c, 0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55,
];

fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<Vec<u8>> + 'a {
    move |name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_bytes().to_vec())
}

fn temp_file(name: &str, contents: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("loadgate-secret-{}-{name}", std::process::id()));
    std::fs::write(&path, contents).unwrap();
    path
}

const AT: ProofTarget = ProofTarget { worker: 42, incarnation: 4242 };
const WINDOW: u64 = 5_000;
const NONCE: u128 = 0x0123_4567_89ab_cdef_0011_2233_4455_6677;

fn proof(s: &Secrets, method: &str, path: &str, body: &BodyDigest) -> String {
    s.request_proof(method, path, body, AT, NONCE, NOW)
}

fn verify(s: &Secrets, value: &str, method: &str, path: &str, now: u64) -> Result<BodyDigest, ProofError> {
    s.verify_request_proof(value, method, path, AT, now, WINDOW).map(|v| v.body)
}

#[test]
fn request_proofs_verify_under_either_secret() {
    let old = Secrets::from_values(B, None).unwrap();
    let rotating = Secrets::from_values(A, Some(B)).unwrap();
    let new = Secrets::from_values(A, None).unwrap();
    let proof = proof(&old, "POST", "/v1/completions", &EMPTY);
    let empty_hex = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    let head = format!("v3.1700000000000.42.4242.0123456789abcdef0011223344556677.{empty_hex}.");
    assert!(proof.starts_with(&head), "{proof}");
    assert_eq!(proof.len(), head.len() + 64);
    assert_eq!(verify(&rotating, &proof, "POST", "/v1/completions", NOW), Ok(EMPTY));
    assert_eq!(verify(&new, &proof, "POST", "/v1/completions", NOW), Err(ProofError::BadMac));
    let vouched = rotating.verify_request_proof(&proof, "POST", "/v1/completions", AT, NOW, WINDOW).unwrap();
    assert_eq!((vouched.nonce, vouched.unix_ms), (NONCE, NOW));
}

#[test]
fn request_proofs_bind_method_path_time_worker_and_nonce() {
    let s = Secrets::from_values(A, None).unwrap();
    let proof = proof(&s, "POST", "/v1/completions", &EMPTY);
    assert_eq!(verify(&s, &proof, "GET", "/v1/completions", NOW), Err(ProofError::BadMac));
    assert_eq!(verify(&s, &proof, "POST", "/v1/chat/completions", NOW), Err(ProofError::BadMac));
    assert_eq!(verify(&s, &proof, "POST", "/v1/completions", NOW + WINDOW), Ok(EMPTY));
    assert_eq!(verify(&s, &proof, "POST", "/v1/completions", NOW - WINDOW), Ok(EMPTY));
    assert_eq!(verify(&s, &proof, "POST", "/v1/completions", NOW + WINDOW + 1), Err(ProofError::Expired));
    assert_eq!(verify(&s, &proof, "POST", "/v1/completions", NOW - WINDOW - 1), Err(ProofError::Expired));
    // A genuine proof for another worker, or this one's earlier life.
    for other in [ProofTarget { worker: 43, ..AT }, ProofTarget { incarnation: 4241, ..AT }] {
        let result = s.verify_request_proof(&proof, "POST", "/v1/completions", other, NOW, WINDOW);
        assert_eq!(result, Err(ProofError::OtherWorker), "{other:?}");
    }
    // Any field changed: the MAC covers the timestamp, the target, the nonce and the body.
    for (from, to) in [
        ("1700000000000", "1700000000001"),
        (".42.", ".43."),
        (".4242.", ".4243."),
        ("0123456789abcdef0011223344556677", "0123456789abcdef0011223344556678"),
    ] {
        let moved = proof.replacen(from, to, 1);
        assert_ne!(moved, proof);
        assert_eq!(verify(&s, &moved, "POST", "/v1/completions", NOW), Err(ProofError::BadMac), "{from} -> {to}");
    }
    let body = proof_for_body(&s);
    assert_eq!(verify(&s, &body, "POST", "/v1/completions", NOW), Ok(body_digest(b"{}")));
    let swapped = body.replacen(&to_hex(&body_digest(b"{}")), &to_hex(&EMPTY), 1);
    assert_eq!(verify(&s, &swapped, "POST", "/v1/completions", NOW), Err(ProofError::BadMac));
}

fn proof_for_body(s: &Secrets) -> String {
    proof(s, "POST", "/v1/completions", &body_digest(b"{}"))
}

#[test]
fn the_empty_digest_is_sha256_of_nothing() {
    assert_eq!(body_digest(b""), EMPTY);
}

#[test]
fn malformed_request_proofs_are_refused_without_panics() {
    let s = Secrets::from_values(A, None).unwrap();
    let good = proof(&s, "GET", "/v1/models", &EMPTY);
    let hex = good.rsplit('.').next().unwrap().to_owned();
    let body = to_hex(&EMPTY);
    let nonce = format!("{NONCE:032x}");
    let ok = |ms: &str, w: &str, i: &str, n: &str, b: &str, h: &str| format!("v3.{ms}.{w}.{i}.{n}.{b}.{h}");
    let now = NOW.to_string();
    let cases = [
        String::new(),
        "v3".into(),
        "v3......".into(),
        format!("v2.{now}.{body}.{hex}"),
        ok(&now, "42", "4242", &nonce, &body, &hex).replacen("v3", "v4", 1),
        format!("{}.x", ok(&now, "42", "4242", &nonce, &body, &hex)),
        ok(&format!("+{now}"), "42", "4242", &nonce, &body, &hex),
        ok("-1", "42", "4242", &nonce, &body, &hex),
        ok("99999999999999999999999", "42", "4242", &nonce, &body, &hex),
        ok(&now, "", "4242", &nonce, &body, &hex),
        ok(&now, "42", "-1", &nonce, &body, &hex),
        ok(&now, "42", "4242", &nonce[..31], &body, &hex),
        ok(&now, "42", "4242", &nonce.to_uppercase(), &body, &hex),
        ok(&now, "42", "4242", &format!("{}g", &nonce[..31]), &body, &hex),
        ok(&now, "42", "4242", &nonce, &body, &hex.to_uppercase()),
        ok(&now, "42", "4242", &nonce, &body.to_uppercase(), &hex),
        ok(&now, "42", "4242", &nonce, &body, &hex[..63]),
        ok(&now, "42", "4242", &nonce, &body[..63], &hex),
        ok(&now, "42", "4242", &nonce, &body, &format!("{hex}0")),
        ok(&now, "42", "4242", &nonce, &body, &format!("{}é", &hex[..62])),
    ];
    for case in cases {
        assert_eq!(verify(&s, &case, "GET", "/v1/models", NOW), Err(ProofError::Malformed), "{case:?}");
    }
    assert_eq!(verify(&s, &good, "GET", "/v1/models", NOW), Ok(EMPTY));
}

#[test]
fn short_secrets_are_refused() {
    assert!(Secrets::from_values(b"0123456789abcde", None).is_err());
    assert!(Secrets::from_values(A, Some(b"short")).is_err());
    assert!(Secrets::from_values(b"0123456789abcdef", None).is_ok());
    let err = Secrets::load_with(None, env(&[(SECRET_ENV, "  tooshort  ")])).unwrap_err();
    assert!(err.to_string().contains("at least 16"), "{err}");
}

#[test]
fn debug_redacts() {
    let s = Secrets::from_values(A, Some(B)).unwrap();
    assert_eq!(format!("{s:?}"), "Secrets(<redacted>)");
    assert_eq!(format!("{:?}", Some(s)), "Some(Secrets(<redacted>))");
}

#[test]
fn loads_from_the_environment() {
    assert_eq!(Secrets::load_with(None, env(&[])).unwrap(), None);
    assert_eq!(Secrets::load_with(None, env(&[(SECRET_ENV, " \n")])).unwrap(), None);
    let current = std::str::from_utf8(A).unwrap();
    let previous = std::str::from_utf8(B).unwrap();
    let loaded = Secrets::load_with(None, env(&[(SECRET_ENV, &format!(" {current}\n"))])).unwrap().unwrap();
    assert_eq!(loaded, Secrets::from_values(A, None).unwrap());
    let loaded =
        Secrets::load_with(None, env(&[(SECRET_ENV, current), (PREVIOUS_SECRET_ENV, previous)])).unwrap().unwrap();
    assert_eq!(loaded, Secrets::from_values(A, Some(B)).unwrap());
    assert!(Secrets::load_with(None, env(&[(PREVIOUS_SECRET_ENV, previous)])).is_err());
}

#[test]
fn loads_from_a_file() {
    let current = std::str::from_utf8(A).unwrap();
    let previous = std::str::from_utf8(B).unwrap();
    let one = temp_file("one", &format!("\n  {current}  \n\n"));
    assert_eq!(Secrets::load_with(Some(&one), env(&[])).unwrap(), Some(Secrets::from_values(A, None).unwrap()));
    let two = temp_file("two", &format!("{current}\r\n{previous}\r\n"));
    assert_eq!(Secrets::load_with(Some(&two), env(&[])).unwrap(), Some(Secrets::from_values(A, Some(B)).unwrap()));
    // A lone CR ends a line too (an old Mac editor's rotation file).
    let mac = temp_file("mac", &format!("{current}\r{previous}\r"));
    assert_eq!(Secrets::load_with(Some(&mac), env(&[])).unwrap(), Some(Secrets::from_values(A, Some(B)).unwrap()));
    let three = temp_file("three", &format!("{current}\n{previous}\n{current}\n"));
    assert!(Secrets::load_with(Some(&three), env(&[])).is_err());
    let empty = temp_file("empty", "\n \n");
    assert!(Secrets::load_with(Some(&empty), env(&[])).is_err());
    let short = temp_file("short", "abc\n");
    assert!(Secrets::load_with(Some(&short), env(&[])).is_err());
    let missing = std::env::temp_dir().join("loadgate-secret-does-not-exist");
    assert!(Secrets::load_with(Some(&missing), env(&[])).is_err());
    // A file and the variable at once: ambiguous, refused.
    let both = Secrets::load_with(Some(&one), env(&[(SECRET_ENV, current)])).unwrap_err();
    assert!(both.to_string().contains("both"), "{both}");
    // Errors never echo the secret.
    let err = Secrets::load_with(Some(&short), env(&[])).unwrap_err();
    assert!(!format!("{err:#}").contains("abc"), "{err:#}");
    for path in [one, two, mac, three, empty, short] {
        let _ = std::fs::remove_file(path);
    }
}

#[test]
fn event_handshake_macs_follow_rotation() {
    let (fnonce, wnonce) = ([1u8; 32], [2u8; 32]);
    let worker = Secrets::from_values(B, None).unwrap();
    let frontend = Secrets::from_values(A, Some(B)).unwrap();
    let proof = worker.event_proof(&fnonce, &wnonce);
    let welcome = frontend.accept_event_proof(&fnonce, &wnonce, &proof).expect("previous secret verifies");
    assert!(worker.verify_event_welcome(&fnonce, &wnonce, &welcome));
    // Another challenge (a replay): refused.
    assert_eq!(frontend.accept_event_proof(&[3u8; 32], &wnonce, &proof), None);
    let stranger = Secrets::from_values(b"another secret, 16+ bytes", None).unwrap();
    assert_eq!(stranger.accept_event_proof(&fnonce, &wnonce, &proof), None);
    assert!(!stranger.verify_event_welcome(&fnonce, &wnonce, &welcome));
}

/// Found by a review: the 16-byte minimum counted bytes, but HMAC pads a
/// key of up to 64 bytes with NUL bytes, so trailing NULs add nothing: a
/// secret of 16 NUL bytes (a zeroed buffer written out) was accepted and
/// was the empty key, with which anyone forges every proof. A secret is now
/// measured without its trailing NULs (up to 64 bytes; a longer key is
/// hashed, so they count there).
#[test]
fn nul_padded_secrets_are_no_longer_than_their_hmac_key() {
    let zeros = [0u8; MIN_SECRET_LEN];
    let accepted = Secrets::from_values(&zeros, None);
    if let Ok(secrets) = &accepted {
        // A forger who knows no secret: the empty key.
        let (f, w) = ([1u8; wire::NONCE_LEN], [2u8; wire::NONCE_LEN]);
        let forged = wire::proof_mac(b"", &f, &w);
        assert!(
            secrets.accept_event_proof(&f, &w, &forged).is_none(),
            "a Proof under the empty key passes the handshake of a frontend whose secret is 16 NUL bytes"
        );
    }
    // The file the operator wrote: 10 printable bytes and 6 NULs (the same
    // HMAC key as the 10-byte secret that is refused as too short).
    let mut padded = b"0123456789".to_vec();
    padded.resize(MIN_SECRET_LEN, 0);
    let path = std::env::temp_dir().join(format!("loadgate-secret-{}-nul-padded", std::process::id()));
    std::fs::write(&path, &padded).unwrap();
    let loaded = Secrets::load_with(Some(&path), env(&[]));
    let _ = std::fs::remove_file(&path);
    assert!(Secrets::from_values(b"0123456789", None).is_err(), "10 bytes are too short");
    assert!(loaded.is_err(), "10 bytes padded with NULs to 16 are the same HMAC key, yet accepted: {loaded:?}");
    let message = Secrets::from_values(&zeros, None).unwrap_err().to_string();
    assert!(message.contains("only 0 before its trailing NUL bytes"), "{message}");
    // NULs inside, or past the block, count.
    let mut inside = [0u8; MIN_SECRET_LEN];
    inside[MIN_SECRET_LEN - 1] = 1;
    assert!(Secrets::from_values(&inside, None).is_ok());
    assert!(Secrets::from_values(&[0u8; 65], None).is_ok(), "hashed: not the empty key");
}
