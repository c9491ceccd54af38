//! Where the event listener binds: without the event secret, loopback only.

/// The host the event listener binds: `requested` when the frontend has a
/// secret or `requested` is a loopback address; else 127.0.0.1, with a
/// warning (an unauthenticated event plane must not be reachable from
/// other machines). Without a secret it also warns, once (the frontend
/// calls it once, at start), that the event plane is unauthenticated: every
/// process that reaches loopback (every container of a pod shares it) can
/// register a worker and so receive prompts.
pub fn event_bind_host(requested: &str, has_secret: bool) -> &str {
    let loopback = requested == "localhost" || requested.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if !has_secret {
        tracing::warn!(
            "no event secret: the event plane is unauthenticated, and any local process can register a worker \
             and receive prompts (every container of a pod shares loopback); set LOADGATE_EVENT_SECRET or \
             --event-secret-file on the frontend and its workers"
        );
    }
    if has_secret || loopback {
        return requested;
    }
    tracing::warn!(
        requested,
        "no event secret (LOADGATE_EVENT_SECRET or --event-secret-file): the event listener binds 127.0.0.1, \
         not --event-host {requested}"
    );
    "127.0.0.1"
}
