//! The reason phrase of an overload's HTTP/1 status line.
//!
//! 529 (the default overload status) has no standard phrase, so hyper
//! would send `HTTP/1.1 529 <none>`; some clients and proxies log or show
//! only the status line. Every overload reply (the frontend's and a
//! worker's hard cap) sends `HTTP/1.1 529 Overloaded` instead, as does the
//! reject-path benchmark's bare handler (`examples/fixed_529.rs`).

use axum::response::Response;

/// The phrase: the body's error `type`.
pub const OVERLOADED: &[u8] = b"Overloaded";

/// Gives `response` the [`OVERLOADED`] phrase when its status has no
/// standard one (a status that has, 503 say, keeps its own).
pub fn overloaded(response: &mut Response) {
    if response.status().canonical_reason().is_none() {
        response.extensions_mut().insert(hyper::ext::ReasonPhrase::from_static(OVERLOADED));
    }
}
