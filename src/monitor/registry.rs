//! The registry: which workers and models exist, published whole through
//! arc-swap and replaced (cold path) on every registration.

use std::collections::HashMap;

use crate::load::WorkerId;
use crate::monitor::entry::WorkerEntry;
use crate::monitor::error::ApplyError;
use crate::monitor::publication::ModelState;
use crate::sync::Arc;

/// Every worker and every model, as of one registration.
#[derive(Clone, Default)]
pub(crate) struct Registry {
    pub(crate) workers: HashMap<WorkerId, WorkerRecord, RegistryHash>,
    pub(crate) models: HashMap<Arc<str>, Arc<ModelState>, RegistryHash>,
}

/// The registry's hash: every report looks up a worker id and every
/// [`WorkerRouter::route`](crate::WorkerRouter::route) a model name, so SipHash's cost
/// (tens of nanoseconds) shows on both hot paths. The keys are registered by
/// the operator's workers, not chosen by clients, so an unkeyed hash (rustc's
/// Fx hash) is safe.
pub(crate) type RegistryHash = rustc_hash::FxBuildHasher;

/// A registered worker and the model it serves.
#[derive(Clone)]
pub(crate) struct WorkerRecord {
    pub(crate) entry: Arc<WorkerEntry>,
    pub(crate) model: Arc<ModelState>,
}

impl Registry {
    /// The record of `worker`, if `rank` is one of its ranks.
    #[inline]
    pub(crate) fn lookup(&self, worker: WorkerId, rank: u32) -> Result<&WorkerRecord, ApplyError> {
        let rec = self.workers.get(&worker).ok_or(ApplyError::UnknownWorker(worker))?;
        if rank >= rec.entry.dp_size {
            return Err(ApplyError::RankOutOfRange { worker, rank, dp_size: rec.entry.dp_size });
        }
        Ok(rec)
    }
}
