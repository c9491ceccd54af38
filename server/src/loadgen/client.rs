//! The HTTP client every kind of run sends with.

/// A client builder for the bench's requests: no Nagle delay, and no
/// redirect followed. A 3xx is the answer the bench counts (not ok); a
/// server that redirects does not send the load, and the tenant keys it
/// carries, somewhere else. The environment's proxy variables apply only
/// when `proxy_from_env` (`BenchConfig::proxy_from_env`).
pub(super) fn builder(proxy_from_env: bool) -> reqwest::ClientBuilder {
    let builder = reqwest::Client::builder().tcp_nodelay(true).redirect(reqwest::redirect::Policy::none());
    match proxy_from_env {
        true => builder,
        false => builder.no_proxy(),
    }
}
