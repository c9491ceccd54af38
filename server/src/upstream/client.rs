//! The HTTP client to upstreams: the frontend's to its workers and engines,
//! a sidecar's to its engine.

use std::time::Duration;

/// How long an idle connection is kept for reuse: under the 5 s after which
/// the engines' HTTP servers close an idle kept-alive connection (uvicorn's
/// default for vLLM and SGLang, cpp-httplib's for llama.cpp). A connection
/// kept longer may be reused just as the server closes it, and the request
/// sent on it fails ("connection closed before message completed").
pub const IDLE_REUSE: Duration = Duration::from_secs(3);

/// A client with `connect_timeout`, idle connections kept [`IDLE_REUSE`],
/// no redirects followed, and no proxy: an upstream that answers 3xx gets
/// that answer relayed, and the body (and the request proof) is never
/// re-sent to wherever it points. `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`
/// (and `NO_PROXY`) in the environment are ignored: a host's egress proxy
/// would otherwise receive every prompt, request proof and scrape, loopback
/// ones included, and answer in the upstream's place (docs/deployment.md,
/// "Proxy variables").
///
/// # Errors
///
/// The TLS backend or resolver cannot be set up.
pub fn client(connect_timeout: Duration) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .pool_idle_timeout(IDLE_REUSE)
        .tcp_nodelay(true)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()
}
