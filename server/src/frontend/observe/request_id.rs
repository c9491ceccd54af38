//! [`RequestId`]: the id of one request on the inference listener, taken
//! from a well-formed incoming `x-request-id` or generated.

use axum::http::{HeaderMap, HeaderName, HeaderValue};

/// The request id header, read from the client, set on every response and
/// forwarded to the worker.
pub(crate) const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// The longest incoming id kept; a longer one is replaced.
pub(crate) const MAX_REQUEST_ID_LEN: usize = 128;

/// A request's id: visible ASCII (`!` to `~`), 1 to [`MAX_REQUEST_ID_LEN`]
/// bytes. The layer puts it into the request's extensions before the
/// handler runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RequestId(HeaderValue);

impl RequestId {
    /// The client's `x-request-id` when it is well formed (the first one, if
    /// several), else a fresh id.
    pub(crate) fn from_headers(headers: &HeaderMap) -> Self {
        match headers.get(&REQUEST_ID_HEADER) {
            Some(value) if well_formed(value.as_bytes()) => RequestId(value.clone()),
            _ => RequestId::generate(),
        }
    }

    /// A fresh id: 128 random bits in hex (32 characters). Unique, not
    /// secret: it names a request in logs, it guards nothing.
    pub(crate) fn generate() -> Self {
        let hex = format!("{:032x}", fastrand::u128(..));
        // Hex digits are always a valid header value.
        RequestId(HeaderValue::from_str(&hex).unwrap_or_else(|_| HeaderValue::from_static("0")))
    }

    /// The id.
    #[inline]
    pub(crate) fn as_str(&self) -> &str {
        // Visible ASCII by construction: `to_str` cannot fail.
        self.0.to_str().unwrap_or_default()
    }

    /// The id as a header value (to set on a response or a request to a
    /// worker).
    #[inline]
    pub(crate) fn header_value(&self) -> &HeaderValue {
        &self.0
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// 1 to [`MAX_REQUEST_ID_LEN`] bytes of visible ASCII: no space, no control
/// character, nothing a log line or a header could be split by.
fn well_formed(id: &[u8]) -> bool {
    (1..=MAX_REQUEST_ID_LEN).contains(&id.len()) && id.iter().all(|b| (b'!'..=b'~').contains(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(value: &[u8]) -> RequestId {
        let mut headers = HeaderMap::new();
        headers.insert(REQUEST_ID_HEADER, HeaderValue::from_bytes(value).unwrap());
        RequestId::from_headers(&headers)
    }

    #[test]
    fn a_well_formed_id_is_kept() {
        assert_eq!(from(b"abc-123_X.y:z").as_str(), "abc-123_X.y:z");
        let longest = "a".repeat(MAX_REQUEST_ID_LEN);
        assert_eq!(from(longest.as_bytes()).as_str(), longest);
    }

    #[test]
    fn a_missing_or_hostile_id_is_replaced() {
        let generated = RequestId::from_headers(&HeaderMap::new());
        assert_eq!(generated.as_str().len(), 32);
        assert!(generated.as_str().bytes().all(|b| b.is_ascii_hexdigit()));
        let too_long = "a".repeat(MAX_REQUEST_ID_LEN + 1);
        for hostile in [too_long.as_bytes(), b"", b"has space", b"tab\there", b"caf\xc3\xa9"] {
            let id = from(hostile);
            assert_ne!(id.as_str().as_bytes(), hostile);
            assert_eq!(id.as_str().len(), 32, "{hostile:?}");
        }
    }

    #[test]
    fn generated_ids_differ() {
        assert_ne!(RequestId::generate(), RequestId::generate());
    }
}
