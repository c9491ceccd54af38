//! The HTTP client to upstreams: the frontend's to its workers and engines,
//! a sidecar's to its engine.

use std::time::Duration;

/// A client with `connect_timeout`, idle connections kept 30 s for reuse,
/// and no redirects followed: an upstream that answers 3xx gets that answer
/// relayed, and the body (and the request proof) is never re-sent to
/// wherever it points.
///
/// # Errors
///
/// The TLS backend or resolver cannot be set up.
pub fn client(connect_timeout: Duration) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .pool_idle_timeout(Duration::from_secs(30))
        .tcp_nodelay(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
}
