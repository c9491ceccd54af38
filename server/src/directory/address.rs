//! [`WorkerAddress`]: where the proxy sends a worker's requests, made from
//! the address it registered, and which registered addresses are taken.

use std::sync::Arc;

/// A worker's HTTP endpoint as the proxy needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerAddress {
    /// Base URL without a trailing slash, e.g. `http://127.0.0.1:8001`.
    pub base_url: Arc<str>,
    /// The worker's data-parallel size (ranks the router tracks load on).
    pub dp_size: u32,
    /// A real inference engine (`--engine`), not a loadgate worker: it gets
    /// no request proof and reports no KV in the router's block unit.
    pub engine: bool,
    /// An engine whose non-streamed requests are sent streamed and answered
    /// whole (llama.cpp: `upstream/assemble.rs`).
    pub assembles: bool,
}

/// `http_addr` (`HOST:PORT` or a URL) as a base URL without a trailing slash.
pub(super) fn address(http_addr: &str, dp_size: u32, engine: bool) -> WorkerAddress {
    WorkerAddress { base_url: Arc::from(base_url(http_addr)), dp_size, engine, assembles: false }
}

fn base_url(http_addr: &str) -> String {
    let base = http_addr.trim_end_matches('/');
    if base.contains("://") {
        base.to_owned()
    } else {
        format!("http://{base}")
    }
}

/// Whether a worker's registered `http_addr` is one the proxy may send to:
/// `HOST:PORT`, or an http(s) URL with a host, perhaps a path, and no
/// credentials, query or fragment. The endpoint's path is appended to it,
/// so a query (`HOST:PORT/admin?`) would send completions, with the
/// frontend's proof, to another path than the worker's.
pub(crate) fn check_address(http_addr: &str) -> Result<(), String> {
    let url = reqwest::Url::parse(&base_url(http_addr)).map_err(|e| format!("address {http_addr:?}: {e}"))?;
    let fault = match () {
        () if !matches!(url.scheme(), "http" | "https") => "a scheme other than http or https",
        () if url.host().is_none() => "no host",
        () if !url.username().is_empty() || url.password().is_some() => "credentials",
        () if url.query().is_some() => "a query",
        () if url.fragment().is_some() => "a fragment",
        () => return Ok(()),
    };
    Err(format!("address {http_addr:?} has {fault}: HOST:PORT or an http(s) URL, perhaps with a path, is taken"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registered address that is not HOST:PORT or a plain http(s) URL is
    /// refused: with a query, the proxy's completions (and their proofs)
    /// went to another path of the host (`HOST:PORT/admin?/v1/completions`).
    /// Found by a review.
    #[test]
    fn only_plain_addresses_are_taken() {
        for ok in ["127.0.0.1:80", "http://127.0.0.1:81/", "https://gw.example:8443/vllm", "[::1]:9000", "w1:8000"] {
            assert_eq!(check_address(ok), Ok(()), "{ok}");
        }
        for bad in [
            "127.0.0.1:1/busy_threshold?",
            "http://127.0.0.1:1/x?a=1",
            "127.0.0.1:1#frag",
            "http://user:pw@127.0.0.1:1",
            "ftp://127.0.0.1:1",
            "file:///etc/passwd",
            "not an address",
            "",
        ] {
            assert!(check_address(bad).is_err(), "{bad}");
        }
    }
}
