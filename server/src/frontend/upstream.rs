//! Bounds on every wait for a worker, and counts of each kind of failure:
//!
//! - connect (`--upstream-connect-timeout-ms`, 2 s): a refused or timed-out
//!   connection excludes the worker for the request (and quarantines it for
//!   a second) and the request migrates;
//! - first byte (`--upstream-first-byte-timeout-secs`, 120 s): the response
//!   head and its first body bytes (the first token of a stream; the whole
//!   answer of a non-streaming request) must come within it, else the client
//!   gets 504. The request does not migrate: the worker took it, and a long
//!   generation must not run again on every other worker (nor is a slow
//!   worker quarantined);
//! - between chunks (`--upstream-chunk-timeout-secs`, 60 s): a response
//!   already relayed is cut when its worker sends nothing for this long.
//!
//! `/metrics` shows each as `loadgate_frontend_upstream_failures_total{kind}`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::directory::WorkerDirectory;
use crate::frontend::args::Args;

/// The upstream timeouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpstreamTimeouts {
    /// Opening a connection to a worker.
    pub connect: Duration,
    /// From sending a request to its first body bytes.
    pub first_byte: Duration,
    /// Between two chunks of a response.
    pub between_chunks: Duration,
}

impl UpstreamTimeouts {
    /// The timeouts `args` name.
    pub fn from_args(args: &Args) -> Self {
        UpstreamTimeouts {
            connect: Duration::from_millis(args.upstream_connect_timeout_ms),
            first_byte: Duration::from_secs(args.upstream_first_byte_timeout_secs),
            between_chunks: Duration::from_secs(args.upstream_chunk_timeout_secs),
        }
    }
}

/// Why a worker gave no usable answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The connection was refused (or failed to open).
    Connect,
    /// The connection did not open within the connect timeout.
    ConnectTimeout,
    /// No first byte within the first-byte timeout.
    FirstByte,
    /// The connection broke before the first byte (a worker killed with a
    /// request on a kept-alive connection, a reset).
    Broken,
    /// The worker left the directory between routing and dispatch.
    Gone,
    /// The frontend itself is out of file descriptors: not the worker's
    /// fault (no quarantine, no migration; the client gets 503).
    OutOfDescriptors,
    /// A response already relayed got no chunk within the timeout.
    BetweenChunks,
}

impl Failure {
    const ALL: [Failure; 7] = [
        Failure::Connect,
        Failure::ConnectTimeout,
        Failure::FirstByte,
        Failure::Broken,
        Failure::Gone,
        Failure::OutOfDescriptors,
        Failure::BetweenChunks,
    ];

    /// The `kind` label.
    pub fn label(self) -> &'static str {
        match self {
            Failure::Connect => "connect",
            Failure::ConnectTimeout => "connect_timeout",
            Failure::FirstByte => "first_byte_timeout",
            Failure::Broken => "broken",
            Failure::Gone => "gone",
            Failure::OutOfDescriptors => "frontend_out_of_descriptors",
            Failure::BetweenChunks => "between_chunks_timeout",
        }
    }

    /// A timeout (the client gets 504 when no other worker can take it).
    pub fn is_timeout(self) -> bool {
        matches!(self, Failure::ConnectTimeout | Failure::FirstByte | Failure::BetweenChunks)
    }

    fn index(self) -> usize {
        Failure::ALL.iter().position(|f| *f == self).unwrap_or(0)
    }
}

/// Counts of upstream failures by kind.
#[derive(Debug, Default)]
pub struct UpstreamStats {
    failures: [AtomicU64; 7],
}

impl UpstreamStats {
    /// Counts one `failure`.
    pub fn record(&self, failure: Failure) {
        // Relaxed: a counter.
        self.failures[failure.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// How many `failure`s so far.
    pub fn count(&self, failure: Failure) -> u64 {
        // Relaxed: a counter read on its own.
        self.failures[failure.index()].load(Ordering::Relaxed)
    }

    /// Registers the failure counts and the directory's liveness counters
    /// and gauge (their values now) into `registry`, for `/metrics`.
    pub fn register(&self, registry: &mut Registry, directory: &WorkerDirectory) {
        let failures = Family::<[(&'static str, &'static str); 1], Counter>::default();
        for failure in Failure::ALL {
            failures.get_or_create(&[("kind", failure.label())]).inc_by(self.count(failure));
        }
        registry.register(
            "loadgate_frontend_upstream_failures",
            "Requests to workers that failed, by kind (connect, timeouts, broken)",
            failures,
        );
        let (silenced, quarantined) = directory.liveness_totals();
        for (name, help, value) in [
            (
                "loadgate_frontend_workers_silenced",
                "Times a worker left routing because its event connection went silent or closed",
                silenced,
            ),
            (
                "loadgate_frontend_workers_quarantined",
                "Times a worker left routing for a second after a connection to it failed",
                quarantined,
            ),
        ] {
            let counter = Counter::<u64>::default();
            counter.inc_by(value);
            registry.register(name, help, counter);
        }
        let out = i64::try_from(directory.out_of_routing().len()).unwrap_or(i64::MAX);
        registry.register(
            "loadgate_frontend_workers_out_of_routing",
            "Registered workers out of routing now (silent or quarantined)",
            ConstGauge::new(out),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_counted_and_rendered() {
        let stats = UpstreamStats::default();
        stats.record(Failure::FirstByte);
        stats.record(Failure::FirstByte);
        stats.record(Failure::Connect);
        let mut registry = Registry::default();
        stats.register(&mut registry, &WorkerDirectory::default());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("loadgate_frontend_upstream_failures_total{kind=\"first_byte_timeout\"} 2"), "{text}");
        assert!(text.contains("loadgate_frontend_upstream_failures_total{kind=\"connect\"} 1"), "{text}");
        assert!(text.contains("loadgate_frontend_upstream_failures_total{kind=\"between_chunks_timeout\"} 0"));
        assert!(text.contains("loadgate_frontend_workers_out_of_routing 0"));
        assert!(Failure::FirstByte.is_timeout() && !Failure::Connect.is_timeout());
    }
}
