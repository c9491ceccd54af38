//! [`Reporter`]: one worker's load reports, numbered by the monitor, for an
//! embedder that feeds the monitor in process (no `seq` kept by hand).

use std::fmt;

use crate::load::{LoadReport, Publisher, RankLoad, WorkerId};
use crate::monitor::entry::WorkerEntry;
use crate::monitor::error::ApplyError;
use crate::monitor::registry::WorkerRecord;
use crate::monitor::{Applied, WorkerMonitor};
use crate::sync::Arc;

/// Reports the load of one incarnation of one worker, numbering its reports
/// itself: each [`report_rank`](Self::report_rank) builds the
/// [`LoadReport`] with the next `seq` of that incarnation and applies it.
///
/// The numbers are the monitor's, per incarnation: every `Reporter` of the
/// same incarnation draws from one counter, so one can be made per report
/// or kept, cloned and shared alike. Do not mix its reports with reports
/// of the same worker you number yourself (their `seq`s would not compare).
/// A reporter stays with the registration it was made for: after a restart
/// (a new incarnation registered), or a deregistration and a registration
/// again, its reports are dropped ([`Applied::OtherIncarnation`]); make a
/// new one.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use loadgate::monitor::Applied;
/// use loadgate::{BusyThresholds, RankLoad, WorkerMonitor};
///
/// let monitor = Arc::new(WorkerMonitor::new(Default::default()).unwrap());
/// monitor.register(7, "llama", 1, 0).unwrap();
/// let busy = BusyThresholds { active_decode_blocks_threshold: Some(0.5), ..Default::default() };
/// monitor.set_thresholds("llama", busy).unwrap();
///
/// let worker = monitor.reporter(7).unwrap();
/// let load = |blocks| RankLoad { active_decode_blocks: blocks, kv_total_blocks: 100, ..Default::default() };
/// assert_eq!(worker.report(load(60)), Ok(Applied::Flipped));
/// assert!(monitor.is_busy(7));
/// // Another reporter of the same worker continues the numbering.
/// assert_eq!(monitor.reporter(7).unwrap().report(load(10)), Ok(Applied::Flipped));
/// assert!(!monitor.is_busy(7));
/// ```
#[derive(Clone)]
pub struct Reporter {
    monitor: Arc<WorkerMonitor>,
    /// The incarnation reported for, and its `seq` counter.
    entry: Arc<WorkerEntry>,
}

impl WorkerMonitor {
    /// A [`Reporter`] for `worker`'s current incarnation.
    ///
    /// # Errors
    ///
    /// [`ApplyError::UnknownWorker`] when `worker` is not registered.
    pub fn reporter(self: &Arc<Self>, worker: WorkerId) -> Result<Reporter, ApplyError> {
        let entry = self.registry.with_worker(worker, |rec: &WorkerRecord| rec.entry.clone());
        let entry = entry.ok_or(ApplyError::UnknownWorker(worker))?;
        Ok(Reporter { monitor: self.clone(), entry })
    }
}

impl Reporter {
    /// Reports rank 0's load (a worker without data parallelism).
    ///
    /// # Errors
    ///
    /// As [`WorkerMonitor::apply`]: the worker is no longer registered.
    pub fn report(&self, load: RankLoad) -> Result<Applied, ApplyError> {
        self.report_rank(0, load)
    }

    /// Reports one rank's load, as the worker's own
    /// ([`Publisher::Worker`]), numbered with the next `seq`.
    ///
    /// # Errors
    ///
    /// As [`WorkerMonitor::apply`]: the worker is no longer registered, or
    /// `rank` is not below its dp size.
    pub fn report_rank(&self, rank: u32, load: RankLoad) -> Result<Applied, ApplyError> {
        // For this registration only, named in the update itself: the same
        // id and incarnation registered again (after a deregistration) is
        // a new entry with its own numbering, which this reporter's would
        // run ahead of, however late the report lands.
        let report = LoadReport {
            worker: self.entry.id,
            incarnation: self.entry.incarnation,
            rank,
            publisher: Publisher::Worker,
            seq: self.entry.next_report_seq(),
            load,
        };
        self.monitor.apply_to_life(&report, self.entry.life)
    }

    /// The worker reported for.
    pub fn worker(&self) -> WorkerId {
        self.entry.id
    }

    /// The incarnation reported for.
    pub fn incarnation(&self) -> u64 {
        self.entry.incarnation
    }
}

impl fmt::Debug for Reporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reporter")
            .field("worker", &self.entry.id)
            .field("incarnation", &self.entry.incarnation)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::MonitorConfig;
    use crate::BusyThresholds;

    fn blocks(n: u32) -> RankLoad {
        RankLoad { active_decode_blocks: n, kv_total_blocks: 100, ..Default::default() }
    }

    fn monitor() -> Arc<WorkerMonitor> {
        let monitor = Arc::new(WorkerMonitor::new(MonitorConfig::default()).unwrap());
        let busy = BusyThresholds { active_decode_blocks_threshold: Some(0.5), ..Default::default() };
        monitor.add_model("m");
        monitor.set_thresholds("m", busy).unwrap();
        monitor
    }

    #[test]
    fn every_report_is_newer_than_the_last() {
        let monitor = monitor();
        monitor.register(1, "m", 1, 5).unwrap();
        let kept = monitor.reporter(1).unwrap();
        assert_eq!((kept.worker(), kept.incarnation()), (1, 5));
        for _ in 0..3 {
            // Alternating reporters draw from one counter: none is stale.
            assert_eq!(kept.report(blocks(60)), Ok(Applied::Flipped));
            assert!(monitor.is_busy(1));
            assert_eq!(monitor.reporter(1).unwrap().report(blocks(10)), Ok(Applied::Flipped));
            assert!(!monitor.is_busy(1));
        }
        assert_eq!(kept.clone().report(blocks(20)), Ok(Applied::Stored));
        monitor.register(2, "m", 2, 0).unwrap();
        let ranks = monitor.reporter(2).unwrap();
        assert_eq!(ranks.report_rank(1, blocks(60)), Ok(Applied::Stored));
        assert_eq!(ranks.report_rank(0, blocks(60)), Ok(Applied::Flipped), "every rank busy");
        assert_eq!(ranks.report_rank(2, blocks(0)), Err(ApplyError::RankOutOfRange { worker: 2, rank: 2, dp_size: 2 }));
    }

    #[test]
    fn a_reporter_moves_to_any_thread() {
        fn shared<T: Send + Sync + 'static>(_: &T) {}
        let monitor = monitor();
        monitor.register(1, "m", 1, 0).unwrap();
        let reporter = monitor.reporter(1).unwrap();
        shared(&reporter);
        std::thread::spawn(move || reporter.report(blocks(60))).join().unwrap().unwrap();
        assert!(monitor.is_busy(1));
    }

    #[test]
    fn a_reporter_keeps_its_incarnation() {
        let monitor = monitor();
        assert_eq!(monitor.reporter(1).unwrap_err(), ApplyError::UnknownWorker(1));
        monitor.register(1, "m", 1, 5).unwrap();
        let old = monitor.reporter(1).unwrap();
        assert_eq!(old.report(blocks(60)), Ok(Applied::Flipped));
        monitor.register(1, "m", 1, 6).unwrap(); // a restart
        assert_eq!(old.report(blocks(90)), Ok(Applied::OtherIncarnation));
        assert!(!monitor.is_busy(1), "the new incarnation starts free");
        let new = monitor.reporter(1).unwrap();
        assert_eq!(new.incarnation(), 6);
        assert_eq!(new.report(blocks(60)), Ok(Applied::Flipped), "its numbering starts afresh, from 1");
        monitor.deregister(1);
        assert_eq!(new.report(blocks(0)), Err(ApplyError::UnknownWorker(1)));
        // The same id and incarnation registered again: a new numbering,
        // which the old reporter would run ahead of; it is refused instead.
        monitor.register(1, "m", 1, 6).unwrap();
        for _ in 0..3 {
            assert_eq!(new.report(blocks(90)), Ok(Applied::OtherIncarnation));
        }
        assert_eq!(monitor.reporter(1).unwrap().report(blocks(60)), Ok(Applied::Flipped), "a new one reports");
    }
}
