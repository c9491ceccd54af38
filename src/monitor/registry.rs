//! The registry: which workers and models exist. Workers live in a
//! concurrent map (a registration inserts one, copying nothing); models in
//! a small map replaced whole (cold path: a model appears or is forgotten).

use std::collections::HashMap;

use crate::load::WorkerId;
use crate::monitor::entry::WorkerEntry;
use crate::monitor::error::ApplyError;
use crate::monitor::publication::ModelState;
use crate::monitor::Applied;
use crate::sync::{Arc, Map, Swap};

/// Every worker and every model.
///
/// scc's `HashIndex` frees a removed record once no reader can hold it and
/// a later write reaches its bucket: a deregistered worker's entry (its
/// slots) and model state may stay allocated until then, bounded by the
/// map's size.
pub(crate) struct Registry {
    pub(crate) workers: Map<WorkerId, WorkerRecord>,
    pub(crate) models: Swap<Models>,
}

/// Every known model by name.
pub(crate) type Models = HashMap<Arc<str>, Arc<ModelState>, RegistryHash>;

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

impl Default for Registry {
    fn default() -> Self {
        Registry { workers: Map::new(), models: Swap::from_pointee(Models::default()) }
    }
}

impl Registry {
    /// Calls `f` with the record of `worker`, if `rank` is one of its ranks;
    /// [`Applied::OtherIncarnation`] without looking at the rank if
    /// `other_life` says the record is not the one the caller names.
    #[inline]
    pub(crate) fn with_rank(
        &self,
        worker: WorkerId,
        rank: u32,
        other_life: impl FnOnce(&WorkerRecord) -> bool,
        f: impl FnOnce(&WorkerRecord) -> Applied,
    ) -> Result<Applied, ApplyError> {
        self.workers.with(&worker, |rec| {
            let rec = rec.ok_or(ApplyError::UnknownWorker(worker))?;
            if other_life(rec) {
                return Ok(Applied::OtherIncarnation);
            }
            if rank >= rec.entry.dp_size {
                return Err(ApplyError::RankOutOfRange { worker, rank, dp_size: rec.entry.dp_size });
            }
            Ok(f(rec))
        })
    }

    /// Calls `f` with the record of `worker`, if it is registered.
    #[inline]
    pub(crate) fn with_worker<R>(&self, worker: WorkerId, f: impl FnOnce(&WorkerRecord) -> R) -> Option<R> {
        self.workers.with(&worker, |rec| rec.map(f))
    }

    /// The state of `model`, if known.
    pub(crate) fn model(&self, model: &str) -> Option<Arc<ModelState>> {
        self.models.load().get(model).cloned()
    }

    /// Publishes the models with `edit` applied (cold path, under the
    /// registry lock).
    pub(crate) fn edit_models(&self, edit: impl FnOnce(&mut Models)) {
        let mut next = Models::clone(&self.models.load());
        edit(&mut next);
        self.models.store(Arc::new(next));
    }
}
