//! The HTTP client every kind of run sends with.

/// A client builder for the bench's requests: no Nagle delay, and no
/// redirect followed. A 3xx is the answer the bench counts (not ok); a
/// server that redirects does not send the load, and the tenant keys it
/// carries, somewhere else.
pub(super) fn builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().tcp_nodelay(true).redirect(reqwest::redirect::Policy::none())
}
