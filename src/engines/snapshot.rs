//! What one scrape of an engine says: [`EngineSnapshot`].

use crate::RankLoad;

/// One data-parallel rank as the engine reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RankSample {
    /// The rank's load, ready for a [`LoadReport`](crate::LoadReport).
    pub load: RankLoad,
    /// Requests the engine is running (in its batch) on this rank.
    pub running_requests: u32,
}

/// One scrape: the ranks the engine reports, in ascending order of their
/// rank label, without gaps (a rank number no series names is no rank of
/// the engine, so `ranks[i]` is the `i`-th rank reported, not necessarily
/// rank `i`); never empty on Ok.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EngineSnapshot {
    /// The ranks, in ascending order of the engine's rank label.
    pub ranks: Vec<RankSample>,
}
