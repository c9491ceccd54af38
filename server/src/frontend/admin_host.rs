//! Without an admin token, the admin API answers only requests that name
//! its listener by address (`Host: 127.0.0.1:8002`, `[::1]`, `localhost`):
//! a web page can otherwise reach it by DNS rebinding. The page's own name,
//! re-resolved to the listener's address, lets a browser on the operator's
//! machine send `POST /busy_threshold` as a same-origin request (JSON
//! without a preflight) and read the answer; the browser then names the
//! page's host in `Host`. A name that is an address cannot be re-resolved.
//! With a token, the token is the check (a page cannot make a browser send
//! it).

use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// Middleware: refuses (403) a request whose `Host` (or HTTP/2 authority)
/// is a name other than `localhost`; one naming no host at all is let
/// through (no browser sends it).
pub async fn require_address_host(request: Request, next: Next) -> Response {
    let named = request
        .uri()
        .authority()
        .map(|a| a.host().to_owned())
        .or_else(|| request.headers().get(header::HOST).map(|h| host_of(h.as_bytes())));
    match named {
        Some(host) if !is_address(&host) => {
            let message = "without an admin token the admin API answers only requests naming it by address \
                (Host: 127.0.0.1, [::1], localhost): a name may be a DNS rebinding; set an admin token \
                (--admin-token-file or LOADGATE_ADMIN_TOKEN) to call it by name";
            (StatusCode::FORBIDDEN, Json(serde_json::json!({ "error": message }))).into_response()
        }
        _ => next.run(request).await,
    }
}

/// The host of a `Host` value: without its port, IPv6 brackets kept.
fn host_of(value: &[u8]) -> String {
    let value = String::from_utf8_lossy(value);
    let value = value.trim();
    let host = match value.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or(value, |(inside, _)| &value[..inside.len() + 2]),
        None => value.rsplit_once(':').map_or(value, |(host, _)| host),
    };
    host.to_owned()
}

/// Whether `host` is an IP address (IPv6 in brackets) or `localhost`.
fn is_address(host: &str) -> bool {
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    match bare {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            host.parse::<std::net::Ipv4Addr>().is_ok()
                || host.eq_ignore_ascii_case("localhost")
                || host.eq_ignore_ascii_case("localhost.")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_addresses_and_localhost_name_the_listener() {
        let named = |value: &str| is_address(&host_of(value.as_bytes()));
        for ok in ["127.0.0.1:8002", "127.0.0.1", "10.1.2.3:80", "[::1]:8002", "[::1]", "localhost:8002", "LOCALHOST"] {
            assert!(named(ok), "{ok}");
        }
        for refused in [
            "rebind.attacker.example:8002",
            "attacker.example",
            "127.0.0.1.nip.io:8002",
            "localhost.attacker.example",
            "[::1",
            "[not-v6]:80",
            "0x7f000001",
            "",
            "127.1",
        ] {
            assert!(!named(refused), "{refused}");
        }
    }
}
