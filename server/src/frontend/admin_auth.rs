//! [`AdminToken`]: the optional bearer token of the admin listener, and the
//! middleware that checks it.
//!
//! The token comes from `--admin-token-file` (one non-empty line) or from
//! [`ADMIN_TOKEN_ENV`], never from the command line, by the same rules as
//! the event secret (`secret::load_values`: trimmed, empty = unset, a file
//! and the variable both set = error, at least [`MIN_SECRET_LEN`](crate::secret::MIN_SECRET_LEN) bytes).
//! With a token, every admin request needs `Authorization: Bearer <token>`
//! (compared in constant time); without one it gets 401 with
//! `WWW-Authenticate: Bearer`.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use crate::secret::{check_len, load_values, SecretSource};

/// The environment variable holding the admin token (without a file).
pub const ADMIN_TOKEN_ENV: &str = "LOADGATE_ADMIN_TOKEN";

/// The admin token's sources: `--admin-token-file` or [`ADMIN_TOKEN_ENV`].
const ADMIN_TOKEN_SOURCE: SecretSource<'static> =
    SecretSource { what: "admin token", file_flag: "--admin-token-file", vars: &[ADMIN_TOKEN_ENV] };

/// The admin listener's bearer token, kept as its SHA-256: a presented
/// token is hashed and the two digests compared in constant time, so the
/// time taken says nothing of the token's length either (slices of unequal
/// lengths compare at once). No `PartialEq` ([`AdminToken::accepts`]).
#[derive(Clone)]
pub struct AdminToken([u8; 32]);

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

impl AdminToken {
    /// From `--admin-token-file PATH` or, without a file, from
    /// [`ADMIN_TOKEN_ENV`]. `None` when neither is set.
    ///
    /// # Errors
    ///
    /// Both a file and the variable set, an unreadable file, a file with
    /// no token or more than one non-empty line, or a token shorter than
    /// [`MIN_SECRET_LEN`](crate::secret::MIN_SECRET_LEN) bytes.
    pub fn load(file: Option<&Path>) -> anyhow::Result<Option<AdminToken>> {
        Self::load_with(file, |name| std::env::var_os(name).map(|v| v.into_encoded_bytes()))
    }

    /// [`AdminToken::load`] with the environment given as a lookup (tests).
    fn load_with(file: Option<&Path>, env: impl Fn(&str) -> Option<Vec<u8>>) -> anyhow::Result<Option<AdminToken>> {
        let Some(values) = load_values(&ADMIN_TOKEN_SOURCE, file, env)? else { return Ok(None) };
        AdminToken::new(values.first().map_or(&[][..], Vec::as_slice)).map(Some)
    }

    /// A token from its bytes.
    ///
    /// # Errors
    ///
    /// Shorter than [`MIN_SECRET_LEN`](crate::secret::MIN_SECRET_LEN) bytes.
    pub fn new(token: &[u8]) -> anyhow::Result<AdminToken> {
        check_len("admin token", token)?;
        Ok(AdminToken(Sha256::digest(token).into()))
    }

    /// Whether an `Authorization` header value carries this token
    /// (`Bearer <token>`, scheme case-insensitive); constant time in the token.
    pub fn accepts(&self, authorization: Option<&HeaderValue>) -> bool {
        let Some(value) = authorization.map(HeaderValue::as_bytes) else {
            return false;
        };
        let Some((scheme, presented)) = split_scheme(value) else {
            return false;
        };
        let presented: [u8; 32] = Sha256::digest(presented).into();
        scheme.eq_ignore_ascii_case(b"bearer") && bool::from(presented.ct_eq(&self.0))
    }
}

/// `scheme SP credentials` of an `Authorization` value.
fn split_scheme(value: &[u8]) -> Option<(&[u8], &[u8])> {
    let at = value.iter().position(|&b| b == b' ')?;
    let credentials = value[at + 1..].trim_ascii();
    Some((&value[..at], credentials))
}

/// Middleware: lets a request through only with the bearer token.
pub async fn require_token(State(token): State<Arc<AdminToken>>, request: Request, next: Next) -> Response {
    if token.accepts(request.headers().get(header::AUTHORIZATION)) {
        return next.run(request).await;
    }
    // The admin API's error shape (`{"error": "<message>"}`), as its other errors.
    let body = serde_json::json!({"error": "the admin API needs `Authorization: Bearer <token>`"});
    (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_token_is_checked() {
        let token = AdminToken::new(b"0123456789abcdef").unwrap();
        let header = |s: &str| HeaderValue::from_str(s).unwrap();
        assert!(token.accepts(Some(&header("Bearer 0123456789abcdef"))));
        assert!(token.accepts(Some(&header("bearer  0123456789abcdef"))));
        assert!(!token.accepts(Some(&header("Bearer 0123456789abcdeX"))));
        assert!(!token.accepts(Some(&header("Bearer 0123456789abcdef0"))));
        assert!(!token.accepts(Some(&header("Basic 0123456789abcdef"))));
        assert!(!token.accepts(Some(&header("0123456789abcdef"))));
        assert!(!token.accepts(None));
    }

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<Vec<u8>> + 'a {
        move |name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_bytes().to_vec())
    }

    #[test]
    fn loads_by_the_event_secret_rules() {
        const TOKEN: &str = "0123456789abcdef-token";
        let accepts =
            |token: &AdminToken| token.accepts(Some(&HeaderValue::from_str(&format!("Bearer {TOKEN}")).unwrap()));
        assert!(AdminToken::load_with(None, env(&[])).unwrap().is_none());
        // Whitespace-only = unset, like an empty event secret variable.
        assert!(AdminToken::load_with(None, env(&[(ADMIN_TOKEN_ENV, " \n\t")])).unwrap().is_none());
        let padded = format!("  {TOKEN}\n");
        assert!(accepts(&AdminToken::load_with(None, env(&[(ADMIN_TOKEN_ENV, &padded)])).unwrap().unwrap()));
        let short = AdminToken::load_with(None, env(&[(ADMIN_TOKEN_ENV, " short ")])).unwrap_err();
        assert!(short.to_string().contains("at least 16 bytes"), "{short}");
        let dir = std::env::temp_dir().join(format!("loadgate-admin-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str, text: &[u8]| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let one = file("one", format!("\r\n  {TOKEN} \r\n\n").as_bytes());
        assert!(accepts(&AdminToken::load_with(Some(&one), env(&[])).unwrap().unwrap()));
        // A token file holds one line (the event secret file: up to two).
        let two = file("two", format!("{TOKEN}\n{TOKEN}\n").as_bytes());
        assert!(AdminToken::load_with(Some(&two), env(&[])).is_err());
        assert!(AdminToken::load_with(Some(&file("blank", b" \n\n")), env(&[])).is_err());
        // Bytes, not text: a non-UTF-8 token is a token.
        let binary = file("binary", b"\xff\xfe0123456789abcdef\n");
        assert!(AdminToken::load_with(Some(&binary), env(&[])).unwrap().is_some());
        let both = AdminToken::load_with(Some(&one), env(&[(ADMIN_TOKEN_ENV, TOKEN)])).unwrap_err();
        assert!(both.to_string().contains("both"), "{both}");
        // A whitespace-only variable does not conflict with a file.
        assert!(AdminToken::load_with(Some(&one), env(&[(ADMIN_TOKEN_ENV, "  ")])).unwrap().is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn short_tokens_are_refused() {
        assert!(AdminToken::new(b"short").is_err());
        assert!(format!("{:?}", AdminToken::new(b"0123456789abcdef").unwrap()).contains("redacted"));
    }
}
