//! Gathering samples into data-parallel ranks.

use std::collections::BTreeMap;

use super::exposition::Sample;
use super::{excerpt, value, EngineError, EngineSnapshot, RankSample, MAX_RANKS};
use crate::RankLoad;

/// What the samples said about one rank, each the maximum over its series.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RankReadings {
    /// KV-cache fraction in `[0, 1]`, if reported.
    pub(super) fraction: Option<f64>,
    /// KV-cache blocks in all, when the engine says (vLLM's `num_gpu_blocks`).
    pub(super) total_blocks: Option<u32>,
    pub(super) running: u32,
    pub(super) waiting: u32,
}

/// Which reading a load family feeds.
#[derive(Clone, Copy, Debug)]
pub(super) enum Reading {
    Fraction,
    Running,
    Waiting,
}

/// The ranks seen so far, by rank number.
#[derive(Debug, Default)]
pub(super) struct Ranks {
    by_rank: BTreeMap<u32, RankReadings>,
}

impl Ranks {
    /// Adds a family's samples: each to the rank of its `rank_label` (no
    /// label: rank 0), checked and converted as `reading`.
    pub(super) fn add(
        &mut self,
        metric: &'static str,
        samples: &[Sample],
        rank_label: Option<&str>,
        reading: Reading,
    ) -> Result<(), EngineError> {
        for sample in samples {
            let checked = value::checked(metric, sample.value)?;
            let rank = rank_of(sample, rank_label)?.unwrap_or(0);
            let readings = self.rank(rank)?;
            match reading {
                Reading::Fraction => {
                    let fraction = value::fraction(checked);
                    readings.fraction = Some(readings.fraction.map_or(fraction, |f| f.max(fraction)));
                }
                Reading::Running => readings.running = readings.running.max(value::count(checked)),
                Reading::Waiting => readings.waiting = readings.waiting.max(value::count(checked)),
            }
        }
        Ok(())
    }

    /// The readings of `rank`, created empty on first sight; a rank number
    /// of [`MAX_RANKS`] or more is refused.
    fn rank(&mut self, rank: u32) -> Result<&mut RankReadings, EngineError> {
        if usize::try_from(rank).map_or(true, |rank| rank >= MAX_RANKS) {
            return Err(EngineError::TooManyRanks { limit: MAX_RANKS });
        }
        Ok(self.by_rank.entry(rank).or_default())
    }

    /// Every rank seen, ascending, for the caller to complete.
    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut RankReadings)> {
        self.by_rank.iter_mut().map(|(&rank, readings)| (rank, readings))
    }

    /// The snapshot: the ranks seen, ascending, without gaps; `None` when
    /// no load sample was seen at all.
    ///
    /// A rank number no series names is no rank of this engine: vLLM labels
    /// its ranks by their global number, so an engine behind an external
    /// balancer (`--data-parallel-rank 3`) shows rank 3 alone. Filled in as
    /// idle, such a rank would keep the worker free however loaded its real
    /// ranks are (a worker is busy only when every rank is). A rank's place
    /// says nothing else: the frontend routes to the worker, not to a rank.
    pub(super) fn snapshot(self) -> Option<EngineSnapshot> {
        if self.by_rank.is_empty() {
            return None;
        }
        let ranks = self.by_rank.into_values().map(RankReadings::sample).collect();
        Some(EngineSnapshot { ranks })
    }
}

impl RankReadings {
    fn sample(self) -> RankSample {
        let (active_decode_blocks, kv_total_blocks) =
            self.fraction.map_or((0, 0), |fraction| value::blocks(fraction, self.total_blocks));
        let load =
            RankLoad { active_decode_blocks, kv_total_blocks, waiting_requests: self.waiting, ..Default::default() };
        RankSample { load, running_requests: self.running }
    }
}

/// The rank number in `sample`'s `label`, `None` without that label (or
/// with it empty).
pub(super) fn rank_of(sample: &Sample, label: Option<&str>) -> Result<Option<u32>, EngineError> {
    let Some(text) = label.and_then(|label| sample.label(label)) else { return Ok(None) };
    match text.parse::<u32>() {
        Ok(rank) if text.bytes().all(|b| b.is_ascii_digit()) => Ok(Some(rank)),
        _ => Err(EngineError::Exposition(format!(
            "rank label {}={:?} is not a rank number",
            label.unwrap_or_default(),
            excerpt(text)
        ))),
    }
}
