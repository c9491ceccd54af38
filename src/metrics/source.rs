//! Where a gate's figures come from: [`AdmissionSource`], read on every
//! scrape.

use crate::sync::Arc;
use crate::Admission;

/// A worker's admission figures, for [`render_worker`](super::render_worker)
/// and from an [`AdmissionSource`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerAdmissionStats {
    /// Requests refused at the hard cap so far.
    pub rejected: u64,
    /// Requests holding an engine slot.
    pub running: u64,
    /// Requests in the overflow queue.
    pub queued: u64,
}

/// An admission gate's fixed sizes: `N` engine slots and `Q` waiting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// The engine request limit `N`.
    pub limit: u64,
    /// The overflow queue size `Q`.
    pub queue_limit: u64,
}

/// One gate's live figures, read by [`AdmissionMetrics`](super::AdmissionMetrics)
/// on every scrape.
///
/// Implemented for [`Admission`] (through its public counters, with its
/// limits), for `Arc`s of sources (so an `Arc<Admission<T>>` the worker keeps
/// serves as well), and for closures returning [`WorkerAdmissionStats`] (no
/// limits), for a gate of another kind.
///
/// # Examples
///
/// ```
/// use loadgate::metrics::{AdmissionSource, WorkerAdmissionStats};
///
/// let source = || WorkerAdmissionStats { running: 3, ..Default::default() };
/// assert_eq!(source.stats().running, 3);
/// assert_eq!(source.limits(), None);
/// ```
pub trait AdmissionSource: Send + Sync + 'static {
    /// The figures now. Called once per scrape, from the scraping thread:
    /// keep it to a few loads.
    fn stats(&self) -> WorkerAdmissionStats;

    /// The gate's `N` and `Q`, when it has them (`None`: those two families
    /// get no series for this gate).
    fn limits(&self) -> Option<AdmissionLimits> {
        None
    }
}

impl<F> AdmissionSource for F
where
    F: Fn() -> WorkerAdmissionStats + Send + Sync + 'static,
{
    fn stats(&self) -> WorkerAdmissionStats {
        self()
    }
}

impl<S: AdmissionSource + ?Sized> AdmissionSource for Arc<S> {
    fn stats(&self) -> WorkerAdmissionStats {
        (**self).stats()
    }

    fn limits(&self) -> Option<AdmissionLimits> {
        (**self).limits()
    }
}

impl<T: 'static> AdmissionSource for Admission<T>
where
    Self: Send + Sync,
{
    fn stats(&self) -> WorkerAdmissionStats {
        // Three separate reads: each figure is exact at its own moment, and
        // the moments are a few instructions apart (a scrape's precision).
        WorkerAdmissionStats { rejected: self.rejected(), running: self.running() as u64, queued: self.queued() as u64 }
    }

    fn limits(&self) -> Option<AdmissionLimits> {
        Some(AdmissionLimits { limit: self.limit() as u64, queue_limit: self.queue_limit() as u64 })
    }
}
