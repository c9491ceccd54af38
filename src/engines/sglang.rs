//! SGLang's `/metrics`.

use super::exposition;
use super::ranks::{Ranks, Reading};
use super::{check_size, EngineError, EngineSnapshot};

const TOKEN_USAGE: &str = "sglang:token_usage";
const RUNNING: &str = "sglang:num_running_reqs";
const QUEUE: &str = "sglang:num_queue_reqs";
/// SGLang's data-parallel rank label (present with `--enable-dp-attention`
/// style deployments; absent, there is one rank).
const DP_RANK: &str = "dp_rank";

/// Per-rank load from SGLang's `GET /metrics` (`--enable-metrics`): one rank
/// per `dp_rank` label.
///
/// `sglang:token_usage` gives the KV fraction (SGLang reports no block
/// total: [`FRACTION_BLOCKS`](super::FRACTION_BLOCKS)),
/// `sglang:num_running_reqs` the running requests, `sglang:num_queue_reqs`
/// the waiting ones. Several series of one rank (one per `tp_rank`, say)
/// count as their maximum. See [the module](super) for the rules.
///
/// # Errors
///
/// [`EngineError::TooLarge`], [`EngineError::Exposition`],
/// [`EngineError::NoLoadMetrics`], [`EngineError::InvalidValue`],
/// [`EngineError::TooManyRanks`].
pub fn sglang(metrics: &str) -> Result<EngineSnapshot, EngineError> {
    check_size(metrics)?;
    let families = exposition::read(metrics, &[TOKEN_USAGE, RUNNING, QUEUE])?;
    let [usage, running, queue] = &families[..] else { unreachable!("one entry per name") };
    let mut ranks = Ranks::default();
    ranks.add(TOKEN_USAGE, usage, Some(DP_RANK), Reading::Fraction)?;
    ranks.add(RUNNING, running, Some(DP_RANK), Reading::Running)?;
    ranks.add(QUEUE, queue, Some(DP_RANK), Reading::Waiting)?;
    ranks.snapshot().ok_or(EngineError::NoLoadMetrics)
}
