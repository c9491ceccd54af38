//! vLLM's `/metrics`.

use super::exposition::{self, Sample};
use super::ranks::{rank_of, Ranks, Reading};
use super::{check_size, EngineError, EngineSnapshot};

const KV_CACHE_USAGE: &str = "vllm:kv_cache_usage_perc";
/// The name before vLLM 0.9 renamed it (a 0..1 fraction despite the name).
const GPU_CACHE_USAGE: &str = "vllm:gpu_cache_usage_perc";
const RUNNING: &str = "vllm:num_requests_running";
const WAITING: &str = "vllm:num_requests_waiting";
const CACHE_CONFIG: &str = "vllm:cache_config_info";
/// vLLM's data-parallel rank label.
const ENGINE: &str = "engine";

/// Per-rank load from vLLM's `GET /metrics`: one rank per `engine` label.
///
/// `vllm:kv_cache_usage_perc` (or, when absent, `vllm:gpu_cache_usage_perc`)
/// gives the KV fraction, over `num_gpu_blocks` of `vllm:cache_config_info`
/// when present; `vllm:num_requests_running` the running requests;
/// `vllm:num_requests_waiting` the waiting ones. The `model_name` label is
/// ignored (one model per process). See [the module](super) for the rules.
///
/// # Errors
///
/// [`EngineError::TooLarge`], [`EngineError::Exposition`],
/// [`EngineError::NoLoadMetrics`], [`EngineError::InvalidValue`],
/// [`EngineError::TooManyRanks`].
pub fn vllm(metrics: &str) -> Result<EngineSnapshot, EngineError> {
    check_size(metrics)?;
    let families = exposition::read(metrics, &[KV_CACHE_USAGE, GPU_CACHE_USAGE, RUNNING, WAITING, CACHE_CONFIG])?;
    let [kv, gpu, running, waiting, cache_config] = &families[..] else { unreachable!("one entry per name") };
    let (kv_name, kv) = if kv.is_empty() { (GPU_CACHE_USAGE, gpu) } else { (KV_CACHE_USAGE, kv) };
    let mut ranks = Ranks::default();
    ranks.add(kv_name, kv, Some(ENGINE), Reading::Fraction)?;
    ranks.add(RUNNING, running, Some(ENGINE), Reading::Running)?;
    ranks.add(WAITING, waiting, Some(ENGINE), Reading::Waiting)?;
    let blocks = GpuBlocks::read(cache_config)?;
    for (rank, readings) in ranks.iter_mut() {
        readings.total_blocks = blocks.of(rank);
    }
    ranks.snapshot().ok_or(EngineError::NoLoadMetrics)
}

/// `num_gpu_blocks` of `vllm:cache_config_info`.
#[derive(Debug, Default)]
struct GpuBlocks {
    /// The largest of the series without an `engine` label: for all ranks.
    all: Option<u32>,
    /// `(rank, blocks)` of the series with one.
    per_rank: Vec<(u32, u32)>,
}

impl GpuBlocks {
    /// Reads the series; a value that is no whole number in `1..=u32::MAX`
    /// (vLLM writes `None` before the cache is sized) is ignored.
    fn read(samples: &[Sample]) -> Result<GpuBlocks, EngineError> {
        let mut blocks = GpuBlocks::default();
        for sample in samples {
            let Some(count) = sample.label("num_gpu_blocks").and_then(whole_blocks) else { continue };
            match rank_of(sample, Some(ENGINE))? {
                Some(rank) => blocks.per_rank.push((rank, count)),
                None => blocks.all = blocks.all.max(Some(count)),
            }
        }
        Ok(blocks)
    }

    /// The blocks of `rank`: its own (the largest), else those for all.
    fn of(&self, rank: u32) -> Option<u32> {
        let own = self.per_rank.iter().filter(|&&(r, _)| r == rank).map(|&(_, count)| count).max();
        own.or(self.all)
    }
}

/// A decimal block count in `1..=u32::MAX`.
fn whole_blocks(text: &str) -> Option<u32> {
    let blocks: u32 = text.parse().ok()?;
    (blocks > 0 && text.bytes().all(|b| b.is_ascii_digit())).then_some(blocks)
}
