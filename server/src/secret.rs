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

/// The value of `x-loadgate-refusal` on a worker's refusal of a request
/// proof: a frontend then tries another worker (and takes this one out of
/// routing) instead of answering its client 401.
pub const REFUSAL_PROOF: &str = "proof-refused";

/// The shortest secret accepted, in bytes.
pub const MIN_SECRET_LEN: usize = 16;

/// The environment variable holding the current secret.
pub const SECRET_ENV: &str = "LOADGATE_EVENT_SECRET";
/// The environment variable holding the previous secret (rotation).
pub const PREVIOUS_SECRET_ENV: &str = "LOADGATE_EVENT_SECRET_PREVIOUS";

const REQUEST_PROOF_VERSION: &str = "v3";
const REQUEST_CONTEXT: &str = "loadgate-request-v3";

/// The worker, and its life, a request proof is for: a proof for another
/// worker, or for this one before a restart, is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProofTarget {
    /// The worker id.
    pub worker: u64,
    /// Its incarnation (fixed at its start).
    pub incarnation: u64,
}

/// What a verified request proof vouches for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vouched {
    /// The body's SHA-256 (the caller checks the body against it).
    pub body: BodyDigest,
    /// The proof's nonce: a worker accepts each once.
    pub nonce: u128,
    /// When it was made (ms since the Unix epoch).
    pub unix_ms: u64,
}

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
    /// The header is not `v3.<unix_ms>.<worker>.<incarnation>.<32 hex>.<64
    /// hex>.<64 hex>` (lowercase hex, decimal numbers).
    Malformed,
    /// The timestamp is outside the window around now.
    Expired,
    /// The MAC verifies under none of the secrets.
    BadMac,
    /// A genuine proof, for another worker or another incarnation.
    OtherWorker,
}

impl fmt::Display for ProofError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Malformed => "malformed request proof",
            Self::Expired => "request proof timestamp outside the window (clock skew?)",
            Self::BadMac => "request proof does not verify under the event secret",
            Self::OtherWorker => "request proof for another worker or incarnation",
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

    /// Header value for a frontend-to-worker request to `target` whose body
    /// has the digest `body`: `v3.<unix_ms>.<worker>.<incarnation>.<nonce
    /// hex>.<body hex>.<mac hex>`, MAC = HMAC-SHA256(current,
    /// `"loadgate-request-v3\n<unix_ms>\n<worker>\n<incarnation>\n<nonce
    /// hex>\n<METHOD> <PATH>\n<body hex>"`), PATH without the query, hex
    /// lowercase, the nonce 16 bytes, unique per request.
    pub fn request_proof(
        &self,
        method: &str,
        path: &str,
        body: &BodyDigest,
        target: ProofTarget,
        nonce: u128,
        unix_ms: u64,
    ) -> String {
        let fields = ProofFields { unix_ms, target, nonce: format!("{nonce:032x}"), body: to_hex(body) };
        let tag = request_mac(&self.current, method, path, &fields).finalize().into_bytes();
        let ProofFields { target, nonce, body, .. } = fields;
        format!(
            "{REQUEST_PROOF_VERSION}.{unix_ms}.{}.{}.{nonce}.{body}.{}",
            target.worker,
            target.incarnation,
            to_hex(&tag)
        )
    }

    /// Accepts `value` (a [`REQUEST_PROOF_HEADER`]) for `METHOD PATH` at
    /// the worker `own` when its timestamp is within `window_ms` of `now_ms`,
    /// its MAC verifies under either secret (constant-time comparison) and
    /// it names `own`; returns what it vouches for: the body digest (which
    /// the caller checks against the body, as the worker does while it
    /// streams in) and the nonce (which the caller accepts once).
    ///
    /// # Errors
    ///
    /// [`ProofError`] saying which check failed.
    pub fn verify_request_proof(
        &self,
        value: &str,
        method: &str,
        path: &str,
        own: ProofTarget,
        now_ms: u64,
        window_ms: u64,
    ) -> Result<Vouched, ProofError> {
        let mut parts = value.split('.');
        let (
            Some(REQUEST_PROOF_VERSION),
            Some(ms),
            Some(worker),
            Some(incarnation),
            Some(nonce),
            Some(body_hex),
            Some(hex),
            None,
        ) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        )
        else {
            return Err(ProofError::Malformed);
        };
        let unix_ms = decimal(ms).ok_or(ProofError::Malformed)?;
        let target = ProofTarget {
            worker: decimal(worker).ok_or(ProofError::Malformed)?,
            incarnation: decimal(incarnation).ok_or(ProofError::Malformed)?,
        };
        let nonce_value = nonce_of(nonce).ok_or(ProofError::Malformed)?;
        let body = from_hex(body_hex).ok_or(ProofError::Malformed)?;
        let tag = from_hex(hex).ok_or(ProofError::Malformed)?;
        if now_ms.abs_diff(unix_ms) > window_ms {
            return Err(ProofError::Expired);
        }
        let fields = ProofFields { unix_ms, target, nonce: nonce.to_owned(), body: body_hex.to_owned() };
        if !self.verifying().any(|key| request_mac(key, method, path, &fields).verify_slice(&tag).is_ok()) {
            return Err(ProofError::BadMac);
        }
        if target != own {
            return Err(ProofError::OtherWorker);
        }
        Ok(Vouched { body, nonce: nonce_value, unix_ms })
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

    /// What seals NATS envelopes under the current secret, its keys
    /// prepared once ([`wire::envelope`]).
    pub fn sealer(&self) -> wire::envelope::Sealer {
        wire::envelope::Sealer::new(&self.current)
    }

    /// What opens envelopes under either secret, each key prepared once.
    pub fn openers(&self) -> wire::envelope::Openers {
        match &self.previous {
            Some(previous) => wire::envelope::Openers::new(&[&self.current, previous]),
            None => wire::envelope::Openers::new(&[&self.current]),
        }
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
            // Lines end with LF, CRLF or a lone CR (an old Mac editor's).
            text.split(|&b| b == b'\n' || b == b'\r').map(<[u8]>::trim_ascii).filter(|l| !l.is_empty()).map(<[u8]>::to_vec).collect();
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
    // HMAC pads a key of up to a block with NUL bytes: trailing NULs add
    // nothing to it (16 NULs are the empty key).
    let key = secret.len() - secret.iter().rev().take_while(|&&b| b == 0).count();
    if secret.len() <= HMAC_BLOCK && key < MIN_SECRET_LEN {
        bail!(
            "the {what} has {} bytes, but only {key} before its trailing NUL bytes, which a MAC key ignores; \
             at least {MIN_SECRET_LEN} bytes are required",
            secret.len()
        );
    }
    Ok(())
}

/// HMAC-SHA-256's block: a longer key is hashed, a shorter one padded
/// with NUL bytes.
const HMAC_BLOCK: usize = 64;

/// What a request MAC covers besides the method and path, as written.
struct ProofFields {
    unix_ms: u64,
    target: ProofTarget,
    /// 32 lowercase hex digits.
    nonce: String,
    /// 64 lowercase hex digits.
    body: String,
}

/// The request MAC, keyed and fed, ready to finalize or verify.
fn request_mac(key: &[u8], method: &str, path: &str, fields: &ProofFields) -> Hmac<Sha256> {
    // HMAC takes keys of any length.
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts any key length");
    let ProofFields { unix_ms, target, nonce, body } = fields;
    let message = format!(
        "{REQUEST_CONTEXT}\n{unix_ms}\n{}\n{}\n{nonce}\n{method} {path}\n{body}",
        target.worker, target.incarnation
    );
    mac.update(message.as_bytes());
    mac
}

/// A decimal number of at most 20 digits, nothing else.
fn decimal(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 20 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// A nonce: exactly 32 lowercase hex digits.
fn nonce_of(hex: &str) -> Option<u128> {
    if hex.len() != 32 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u128::from_str_radix(hex, 16).ok()
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
mod tests;
