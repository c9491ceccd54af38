//! [`Failure`]: why an upstream gave no usable answer, [`FailureCounts`],
//! how often each happened (`loadgate_frontend_upstream_failures_total{kind}`
//! on the frontend), and the rate-limited warn line about one.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::StatusCode;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::throttle::LogThrottle;

/// Warn lines about failing upstreams: a broken upstream under load must
/// not flood the log.
static FAILURES: LogThrottle = LogThrottle::per_second(5);

/// Which upstream a log line is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Peer {
    /// A worker (or an `--engine` engine) of the frontend's directory.
    Worker(u64),
    /// The engine a sidecar fronts.
    Engine,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Worker(id) => write!(f, "worker {id}"),
            Peer::Engine => f.write_str("the engine"),
        }
    }
}

/// Logs (at most 5 lines a second) that `peer` failed with `failure`:
/// `what` happened, and why (`detail`).
pub(crate) fn warn_failure(peer: Peer, failure: Failure, what: &str, detail: &dyn fmt::Display) {
    if let Some(suppressed) = FAILURES.admit() {
        tracing::warn!(%peer, kind = failure.label(), suppressed, "{what}: {detail}");
    }
}

/// `x-loadgate-refusal` of a sidecar whose engine did not take the request
/// (it could not be reached, or broke before taking it): nothing ran,
/// another worker may take it.
pub(crate) const REFUSAL_NOT_REACHED: &str = "engine-not-reached";

/// Why an upstream gave no usable answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The connection was refused (or failed to open).
    Connect,
    /// The connection did not open within the connect timeout.
    ConnectTimeout,
    /// No first byte within the first-byte timeout.
    FirstByte,
    /// The connection broke: before the first byte (a worker killed with a
    /// request on a kept-alive connection, a reset), or a relayed stream
    /// mid-way.
    Broken,
    /// The worker left the directory between routing and dispatch.
    Gone,
    /// The frontend itself is out of file descriptors: not the upstream's
    /// fault (no quarantine, no migration; the client gets 503).
    OutOfDescriptors,
    /// A response already relayed got no chunk within the timeout.
    BetweenChunks,
    /// The worker refused the frontend's request proof (its clock is off,
    /// or it lacks the current secret): not the client's problem.
    Proof,
    /// The request's rewrite for an engine did not fit in the body budget:
    /// not the upstream's fault (no quarantine; the client gets 503).
    OverBudget,
}

impl Failure {
    const ALL: [Failure; 9] = [
        Failure::Connect,
        Failure::ConnectTimeout,
        Failure::FirstByte,
        Failure::Broken,
        Failure::Gone,
        Failure::OutOfDescriptors,
        Failure::BetweenChunks,
        Failure::Proof,
        Failure::OverBudget,
    ];

    /// How a failed `send` is classified.
    pub(crate) fn of_send(error: &reqwest::Error) -> Failure {
        if out_of_descriptors(error) {
            return Failure::OutOfDescriptors;
        }
        match (error.is_connect(), error.is_timeout()) {
            (true, true) => Failure::ConnectTimeout,
            (true, false) => Failure::Connect,
            _ => Failure::Broken,
        }
    }

    /// The `kind` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Failure::Connect => "connect",
            Failure::ConnectTimeout => "connect_timeout",
            Failure::FirstByte => "first_byte_timeout",
            Failure::Broken => "broken",
            Failure::Gone => "gone",
            Failure::OutOfDescriptors => "frontend_out_of_descriptors",
            Failure::BetweenChunks => "between_chunks_timeout",
            Failure::Proof => "proof",
            Failure::OverBudget => "frontend_over_budget",
        }
    }

    /// A timeout (the client gets 504 when no other upstream can take it).
    pub(crate) fn is_timeout(self) -> bool {
        matches!(self, Failure::ConnectTimeout | Failure::FirstByte | Failure::BetweenChunks)
    }

    /// The status a client gets when this ends its request: 504 for a
    /// timeout, else 502.
    pub(crate) fn status(self) -> StatusCode {
        if self.is_timeout() {
            StatusCode::GATEWAY_TIMEOUT
        } else {
            StatusCode::BAD_GATEWAY
        }
    }

    fn index(self) -> usize {
        Failure::ALL.iter().position(|f| *f == self).unwrap_or(0)
    }
}

/// The error comes from this process running out of file descriptors
/// (EMFILE, ENFILE somewhere in its chain of sources).
fn out_of_descriptors(error: &(dyn std::error::Error + 'static)) -> bool {
    const EMFILE: i32 = 24;
    const ENFILE: i32 = 23;
    let mut next = Some(error);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
            .is_some_and(|c| c == EMFILE || c == ENFILE)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// Counts of upstream failures by kind.
#[derive(Debug, Default)]
pub(crate) struct FailureCounts {
    failures: [AtomicU64; 9],
}

impl FailureCounts {
    /// Counts one `failure`.
    pub(crate) fn record(&self, failure: Failure) {
        // Relaxed: a counter.
        self.failures[failure.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// How many `failure`s so far.
    pub(crate) fn count(&self, failure: Failure) -> u64 {
        // Relaxed: a counter read on its own.
        self.failures[failure.index()].load(Ordering::Relaxed)
    }

    /// Registers the counts (their values now) into `registry` as `name`,
    /// one series per kind.
    pub(crate) fn register(&self, registry: &mut Registry, name: &str, help: &str) {
        let failures = Family::<[(&'static str, &'static str); 1], Counter>::default();
        for failure in Failure::ALL {
            failures.get_or_create(&[("kind", failure.label())]).inc_by(self.count(failure));
        }
        registry.register(name, help, failures);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_counted_and_rendered() {
        let counts = FailureCounts::default();
        counts.record(Failure::FirstByte);
        counts.record(Failure::FirstByte);
        counts.record(Failure::Connect);
        let mut registry = Registry::default();
        counts.register(&mut registry, "upstream_failures", "help");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("upstream_failures_total{kind=\"first_byte_timeout\"} 2"), "{text}");
        assert!(text.contains("upstream_failures_total{kind=\"connect\"} 1"), "{text}");
        assert!(text.contains("upstream_failures_total{kind=\"between_chunks_timeout\"} 0"));
        assert!(Failure::FirstByte.is_timeout() && !Failure::Connect.is_timeout());
    }
}
