//! [`Measuring`]: where a worker's waiting line stood when a measurement of
//! the worker's load began, for a reporter that measures the engine itself
//! (a scrape) and applies the result later.

use crate::load::{LoadReport, WorkerId};
use crate::monitor::error::ApplyError;
use crate::monitor::{Applied, WorkerMonitor};
use crate::waiting::Measured;

/// Taken before a worker's load is measured
/// ([`WorkerMonitor::measuring`]), handed back with the measured report
/// ([`WorkerMonitor::apply_measured`]).
///
/// While requests wait, the waiting line gives a worker it dispatched to no
/// other waiter until a report of the worker shows that dispatch. A report
/// applied with [`apply`](WorkerMonitor::apply) counts as measured when
/// applied; a scrape sent before a dispatch and answered after it does not
/// show it, and would let the line give the worker a second waiter although
/// the first took its last free slot. With `Measuring` taken before the
/// scrape is sent, such a report frees the worker only from the dispatches
/// made before. (A request dispatched just before the scrape may still be on
/// its way to the engine, or not yet running there, when the scrape is
/// answered: a threshold on the router's tracked prefill,
/// `active_prefill_tokens_threshold`, keeps the worker busy until its first
/// token.) A measurement the worker's model was replaced after frees nothing
/// in the new model's line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Measuring(Measured);

impl Measuring {
    /// The line and its dispatch count it stands for.
    pub(crate) fn measured(self) -> Measured {
        self.0
    }
}

impl WorkerMonitor {
    /// Where the waiting line of `worker`'s model stands now: take it just
    /// before measuring the worker's load, and apply that measurement with
    /// [`apply_measured`](Self::apply_measured). `None` for an unknown
    /// worker.
    pub fn measuring(&self, worker: WorkerId) -> Option<Measuring> {
        self.registry.with_worker(worker, |rec| Measuring(rec.model.line.measured()))
    }

    /// [`apply`](Self::apply) for a report measured since `measuring`: the
    /// same load stored and published, but the waiting line counts the
    /// report as showing only the dispatches it had made when `measuring`
    /// was taken.
    ///
    /// # Errors
    ///
    /// As [`apply`](Self::apply).
    pub fn apply_measured(&self, report: &LoadReport, measuring: Measuring) -> Result<Applied, ApplyError> {
        self.apply_update(report, Some(measuring))
    }
}
