//! [`Secrets`]: the shared secret of the event plane and of frontend-to-worker
//! requests, with an optional previous one for rotation.
//!
//! The secret comes from a file (`--event-secret-file`) or from the
//! environment (`LOADGATE_EVENT_SECRET`, `LOADGATE_EVENT_SECRET_PREVIOUS`),
//! never from the command line, and never crosses the wire: peers prove they
//! hold it with HMAC-SHA256 (the event-plane handshake, `loadgate::wire`, and
//! the [`REQUEST_PROOF_HEADER`] on HTTP requests). The current secret signs;
//! the current and the previous one both verify, so a deployment rotates by
//! giving every process `new` + `old`, then `new` alone.
//!
//! At the crate root because both ends use it: the event plane's handshake
//! (`events/`, worker and frontend side), the frontend signing requests and
//! the worker checking them, and the demo generating one.

use std::fmt;
use std::path::Path;

use anyhow::{bail, Context as _};
use hmac::{Hmac, Mac};
use loadgate::wire::{self, Nonce, TAG_LEN};
use sha2::{Digest as _, Sha256};

/// The request header carrying a frontend's proof of the secret to a worker.
pub const REQUEST_PROOF_HEADER: &str = "x-loadgate-proof";

/// The shortest secret accepted, in bytes.
pub const MIN_SECRET_LEN: usize = 16;

/// How far a request proof's timestamp may be from the verifier's clock.
pub const REQUEST_PROOF_WINDOW_MS: u64 = 30_000;

/// The environment variable holding the current secret.
pub const SECRET_ENV: &str = "LOADGATE_EVENT_SECRET";
/// The environment variable holding the previous secret (rotation).
pub const PREVIOUS_SECRET_ENV: &str = "LOADGATE_EVENT_SECRET_PREVIOUS";

const REQUEST_PROOF_VERSION: &str = "v2";
const REQUEST_CONTEXT: &str = "loadgate-request-v2";

/// SHA-256 of a request body, as a request proof vouches for it.
pub type BodyDigest = [u8; TAG_LEN];

/// The [`BodyDigest`] of `body`.
pub fn body_digest(body: &[u8]) -> BodyDigest {
    Sha256::digest(body).into()
}

/// One or two shared secrets: the first signs, both verify (rotation).
/// No `PartialEq` outside tests: comparing secrets is done in constant time
/// by the MAC checks, never with `==`.
#[derive(Clone)]
#[cfg_attr(test, derive(PartialEq, Eq))]
pub struct Secrets {
    current: Vec<u8>,
    previous: Option<Vec<u8>>,
}

/// Why a request proof was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProofError {
    /// The header is not `v2.<unix_ms>.<64 lowercase hex>.<64 lowercase hex>`.
    Malformed,
    /// The timestamp is more than [`REQUEST_PROOF_WINDOW_MS`] from now.
    Expired,
    /// The MAC verifies under none of the secrets.
    BadMac,
}

impl fmt::Display for ProofError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Malformed => "malformed request proof",
            Self::Expired => "request proof timestamp outside the 30 s window",
            Self::BadMac => "request proof does not verify under the event secret",
        })
    }
}

impl std::error::Error for ProofError {}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secrets(<redacted>)")
    }
}

impl Secrets {
    /// From `--event-secret-file PATH` (first non-empty line = current,
    /// optional second = previous, more lines = error) or, without a file,
    /// from [`SECRET_ENV`] (current) and [`PREVIOUS_SECRET_ENV`] (optional).
    /// Surrounding whitespace is trimmed; an empty variable counts as unset.
    /// `None` when nothing is set.
    ///
    /// # Errors
    ///
    /// An unreadable file, a file with more than two secrets or none, a file
    /// together with either variable, a previous secret without a current
    /// one, or a secret shorter than [`MIN_SECRET_LEN`] bytes.
    pub fn load(file: Option<&Path>) -> anyhow::Result<Option<Secrets>> {
        Self::load_with(file, |name| std::env::var_os(name).map(|v| v.into_encoded_bytes()))
    }

    /// [`Secrets::load`] with the environment given as a lookup (tests).
    fn load_with(file: Option<&Path>, env: impl Fn(&str) -> Option<Vec<u8>>) -> anyhow::Result<Option<Secrets>> {
        let Some(values) = load_values(&EVENT_SECRET_SOURCE, file, env)? else { return Ok(None) };
        let mut values = values.into_iter();
        let current = values.next().unwrap_or_default();
        let previous = values.next();
        Secrets::from_values(&current, previous.as_deref()).map(Some)
    }

    /// From the secrets' bytes (tests, and [`Secrets::load`]).
    ///
    /// # Errors
    ///
    /// A secret shorter than [`MIN_SECRET_LEN`] bytes.
    pub fn from_values(current: &[u8], previous: Option<&[u8]>) -> anyhow::Result<Secrets> {
        check_len("current event secret", current)?;
        if let Some(previous) = previous {
            check_len("previous event secret", previous)?;
        }
        Ok(Secrets { current: current.to_vec(), previous: previous.map(<[u8]>::to_vec) })
    }

    /// The secrets that verify: the current one, then the previous one.
    fn verifying(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(self.current.as_slice()).chain(self.previous.as_deref())
    }

    /// Header value for a frontend-to-worker request whose body has the
    /// digest `body`: `v2.<unix_ms>.<body hex>.<mac hex>`, MAC =
    /// HMAC-SHA256(current, `"loadgate-request-v2\n<unix_ms>\n<METHOD>
    /// <PATH>\n<body hex>"`), PATH without the query, hex lowercase.
    pub fn request_proof(&self, method: &str, path: &str, body: &BodyDigest, unix_ms: u64) -> String {
        let body = to_hex(body);
        let tag = request_mac(&self.current, method, path, &body, unix_ms).finalize().into_bytes();
        format!("{REQUEST_PROOF_VERSION}.{unix_ms}.{body}.{}", to_hex(&tag))
    }

    /// Accepts `value` (a [`REQUEST_PROOF_HEADER`]) when its timestamp is
    /// within [`REQUEST_PROOF_WINDOW_MS`] of `now_ms` and its MAC verifies
    /// under either secret (constant-time comparison); returns the body
    /// digest it vouches for, which the caller checks against the body
    /// (the worker does as the body streams in).
    ///
    /// # Errors
    ///
    /// [`ProofError`] saying which check failed.
    pub fn verify_request_proof(
        &self,
        value: &str,
        method: &str,
        path: &str,
        now_ms: u64,
    ) -> Result<BodyDigest, ProofError> {
        let mut parts = value.split('.');
        let (Some(REQUEST_PROOF_VERSION), Some(ms), Some(body_hex), Some(hex), None) =
            (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(ProofError::Malformed);
        };
        if ms.is_empty() || ms.len() > 20 || !ms.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ProofError::Malformed);
        }
        let unix_ms: u64 = ms.parse().map_err(|_| ProofError::Malformed)?;
        let body = from_hex(body_hex).ok_or(ProofError::Malformed)?;
        let tag = from_hex(hex).ok_or(ProofError::Malformed)?;
        if now_ms.abs_diff(unix_ms) > REQUEST_PROOF_WINDOW_MS {
            return Err(ProofError::Expired);
        }
        if self.verifying().any(|key| request_mac(key, method, path, body_hex, unix_ms).verify_slice(&tag).is_ok()) {
            Ok(body)
        } else {
            Err(ProofError::BadMac)
        }
    }

    /// The worker's Proof of the event-plane handshake: its MAC under the
    /// current secret over both nonces.
    pub fn event_proof(&self, frontend_nonce: &Nonce, worker_nonce: &Nonce) -> [u8; TAG_LEN] {
        wire::proof_mac(&self.current, frontend_nonce, worker_nonce)
    }

    /// The frontend's check of a worker's Proof: when `mac` verifies under
    /// either secret, the Welcome MAC under the secret that matched.
    pub fn accept_event_proof(
        &self,
        frontend_nonce: &Nonce,
        worker_nonce: &Nonce,
        mac: &[u8; TAG_LEN],
    ) -> Option<[u8; TAG_LEN]> {
        self.verifying()
            .find(|key| wire::verify_proof_mac(key, frontend_nonce, worker_nonce, mac))
            .map(|key| wire::welcome_mac(key, frontend_nonce, worker_nonce))
    }

    /// The worker's check of a frontend's Welcome (either secret).
    pub fn verify_event_welcome(&self, frontend_nonce: &Nonce, worker_nonce: &Nonce, mac: &[u8; TAG_LEN]) -> bool {
        self.verifying().any(|key| wire::verify_welcome_mac(key, frontend_nonce, worker_nonce, mac))
    }
}

/// Where a secret is read from: a file named by a flag, or, without one,
/// environment variables (one per line the file may hold).
#[derive(Debug)]
pub(crate) struct SecretSource<'a> {
    /// What the secret is, for messages (`event secret`).
    pub(crate) what: &'a str,
    /// The flag naming the file (`--event-secret-file`).
    pub(crate) file_flag: &'a str,
    /// The variables, in the file's line order: the first is required when
    /// another is set. The file holds at most this many secrets.
    pub(crate) vars: &'a [&'a str],
}

/// The event secret's sources: `--event-secret-file` or
/// [`SECRET_ENV`] + [`PREVIOUS_SECRET_ENV`].
const EVENT_SECRET_SOURCE: SecretSource<'static> =
    SecretSource { what: "event secret", file_flag: "--event-secret-file", vars: &[SECRET_ENV, PREVIOUS_SECRET_ENV] };

/// The values of a secret (in line order; `None` when nothing is set), by
/// the one set of rules every secret of loadgate follows: from `file` (its
/// non-empty lines, at most one per variable of `source`) or, without a
/// file, from `source.vars` (read through `env`). Every value is trimmed of
/// surrounding ASCII whitespace; a variable empty after trimming is unset.
/// Lengths are the caller's to check ([`check_len`]).
///
/// # Errors
///
/// A file together with any of the variables, an unreadable file, a file
/// with no secret or more lines than `source.vars`, or a later variable set
/// without the first. Messages never contain a secret.
pub(crate) fn load_values(
    source: &SecretSource<'_>,
    file: Option<&Path>,
    env: impl Fn(&str) -> Option<Vec<u8>>,
) -> anyhow::Result<Option<Vec<Vec<u8>>>> {
    let SecretSource { what, file_flag, vars } = source;
    let values: Vec<Option<Vec<u8>>> =
        vars.iter().map(|name| env(name).map(|v| v.trim_ascii().to_vec()).filter(|v| !v.is_empty())).collect();
    if let Some(path) = file {
        if values.iter().any(Option::is_some) {
            bail!("both {file_flag} and {} are set; use one", vars.join(" or "));
        }
        let text = std::fs::read(path).with_context(|| format!("cannot read {file_flag} {}", path.display()))?;
        let lines: Vec<Vec<u8>> =
            text.split(|&b| b == b'\n').map(<[u8]>::trim_ascii).filter(|l| !l.is_empty()).map(<[u8]>::to_vec).collect();
        if lines.is_empty() {
            bail!("{file_flag} {} holds no {what}", path.display());
        }
        if lines.len() > vars.len() {
            bail!(
                "{file_flag} {} holds {} non-empty lines; at most {} allowed",
                path.display(),
                lines.len(),
                vars.len()
            );
        }
        return Ok(Some(lines));
    }
    match values.iter().position(Option::is_some) {
        None => Ok(None),
        Some(0) => Ok(Some(values.into_iter().map_while(|v| v).collect())),
        Some(i) => bail!("{} is set without {}", vars[i], vars[0]),
    }
}

/// Refuses a secret shorter than [`MIN_SECRET_LEN`] bytes (`what` names it).
///
/// # Errors
///
/// Too short; the message gives the length, not the secret.
pub(crate) fn check_len(what: &str, secret: &[u8]) -> anyhow::Result<()> {
    if secret.len() < MIN_SECRET_LEN {
        bail!("the {what} has {} bytes; at least {MIN_SECRET_LEN} bytes are required", secret.len());
    }
    Ok(())
}

/// The request MAC, keyed and fed, ready to finalize or verify.
fn request_mac(key: &[u8], method: &str, path: &str, body_hex: &str, unix_ms: u64) -> Hmac<Sha256> {
    // HMAC takes keys of any length.
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts any key length");
    mac.update(format!("{REQUEST_CONTEXT}\n{unix_ms}\n{method} {path}\n{body_hex}").as_bytes());
    mac
}

/// Milliseconds since the Unix epoch (0 before it).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Lowercase hex of `bytes`.
pub(crate) fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xF)]));
    }
    out
}

/// Exactly [`TAG_LEN`] bytes from lowercase hex.
fn from_hex(hex: &str) -> Option<[u8; TAG_LEN]> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let bytes = hex.as_bytes();
    if bytes.len() != 2 * TAG_LEN {
        return None;
    }
    let mut out = [0u8; TAG_LEN];
    for (o, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *o = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &[u8] = b"0123456789abcdef-current";
    const B: &[u8] = b"0123456789abcdef-previous";
    const NOW: u64 = 1_700_000_000_000;
    const EMPTY: BodyDigest = [
        0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14, 0x9a, 0xfb, 0xf4, 0xc8, 0x99, 0x6f, 0xb9, 0x24, 0x27, 0xae,
        0x41, 0xe4, 0x64, 0x9b, 0x93, 0x4c, 0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55,
    ];

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<Vec<u8>> + 'a {
        move |name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_bytes().to_vec())
    }

    fn temp_file(name: &str, contents: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("loadgate-secret-{}-{name}", std::process::id()));
        std::fs::write(&path, contents).unwrap();
        path
    }

    #[test]
    fn request_proofs_verify_under_either_secret() {
        let old = Secrets::from_values(B, None).unwrap();
        let rotating = Secrets::from_values(A, Some(B)).unwrap();
        let new = Secrets::from_values(A, None).unwrap();
        let proof = old.request_proof("POST", "/v1/completions", &EMPTY, NOW);
        let empty_hex = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert!(proof.starts_with(&format!("v2.1700000000000.{empty_hex}.")), "{proof}");
        assert_eq!(proof.len(), "v2.1700000000000.".len() + 64 + 1 + 64);
        assert_eq!(rotating.verify_request_proof(&proof, "POST", "/v1/completions", NOW), Ok(EMPTY));
        assert_eq!(new.verify_request_proof(&proof, "POST", "/v1/completions", NOW), Err(ProofError::BadMac));
        let signed = rotating.request_proof("GET", "/info", &EMPTY, NOW);
        assert_eq!(new.verify_request_proof(&signed, "GET", "/info", NOW), Ok(EMPTY));
    }

    #[test]
    fn request_proofs_bind_method_path_and_time() {
        let s = Secrets::from_values(A, None).unwrap();
        let proof = s.request_proof("POST", "/v1/completions", &EMPTY, NOW);
        assert_eq!(s.verify_request_proof(&proof, "GET", "/v1/completions", NOW), Err(ProofError::BadMac));
        assert_eq!(s.verify_request_proof(&proof, "POST", "/v1/chat/completions", NOW), Err(ProofError::BadMac));
        assert_eq!(s.verify_request_proof(&proof, "POST", "/v1/completions", NOW + 30_000), Ok(EMPTY));
        assert_eq!(s.verify_request_proof(&proof, "POST", "/v1/completions", NOW - 30_000), Ok(EMPTY));
        assert_eq!(s.verify_request_proof(&proof, "POST", "/v1/completions", NOW + 30_001), Err(ProofError::Expired));
        assert_eq!(s.verify_request_proof(&proof, "POST", "/v1/completions", NOW - 30_001), Err(ProofError::Expired));
        // A timestamp changed inside the window: the MAC covers it.
        let moved = proof.replacen("1700000000000", "1700000000001", 1);
        assert_eq!(s.verify_request_proof(&moved, "POST", "/v1/completions", NOW), Err(ProofError::BadMac));
        // Another body under the same MAC: the MAC covers the digest too.
        let body = s.request_proof("POST", "/v1/completions", &body_digest(b"{}"), NOW);
        assert_eq!(s.verify_request_proof(&body, "POST", "/v1/completions", NOW), Ok(body_digest(b"{}")));
        let swapped = body.replacen(&to_hex(&body_digest(b"{}")), &to_hex(&EMPTY), 1);
        assert_eq!(s.verify_request_proof(&swapped, "POST", "/v1/completions", NOW), Err(ProofError::BadMac));
    }

    #[test]
    fn the_empty_digest_is_sha256_of_nothing() {
        assert_eq!(body_digest(b""), EMPTY);
    }

    #[test]
    fn malformed_request_proofs_are_refused_without_panics() {
        let s = Secrets::from_values(A, None).unwrap();
        let good = s.request_proof("GET", "/info", &EMPTY, NOW);
        let hex = good.rsplit('.').next().unwrap().to_owned();
        let body = to_hex(&EMPTY);
        let cases = [
            String::new(),
            "v2".into(),
            "v2...".into(),
            format!("v1.{NOW}.{body}.{hex}"),
            format!("v2.{NOW}.{hex}"),
            format!("v2.{NOW}.{body}.{hex}.x"),
            format!("v2.+{NOW}.{body}.{hex}"),
            format!("v2.-1.{body}.{hex}"),
            format!("v2.99999999999999999999999.{body}.{hex}"),
            format!("v2.{NOW}.{body}.{}", hex.to_uppercase()),
            format!("v2.{NOW}.{}.{hex}", body.to_uppercase()),
            format!("v2.{NOW}.{body}.{}", &hex[..63]),
            format!("v2.{NOW}.{}.{hex}", &body[..63]),
            format!("v2.{NOW}.{body}.{hex}0"),
            format!("v2.{NOW}.{body}.{}é", &hex[..62]),
            format!("v2.{NOW}.{body}.{}zz", &hex[..62]),
        ];
        for case in cases {
            assert_eq!(s.verify_request_proof(&case, "GET", "/info", NOW), Err(ProofError::Malformed), "{case:?}");
        }
        assert_eq!(s.verify_request_proof(&good, "GET", "/info", NOW), Ok(EMPTY));
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
        for path in [one, two, three, empty, short] {
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
}
