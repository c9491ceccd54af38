//! llama.cpp's `/metrics` and `/slots`.

use serde::Deserialize;

use super::exposition;
use super::ranks::{Ranks, Reading};
use super::{check_size, EngineError, EngineSnapshot};

const PROCESSING: &str = "llamacpp:requests_processing";
const DEFERRED: &str = "llamacpp:requests_deferred";

/// One entry of `GET /slots`; the other fields are ignored.
#[derive(Debug, Deserialize)]
struct Slot {
    /// The slot's context in tokens.
    n_ctx: u64,
    is_processing: bool,
    /// Tokens of the slot's sequence (prompt and generated so far), while
    /// processing.
    n_prompt_tokens: Option<u64>,
}

/// The load of llama.cpp's `llama-server` (`--metrics`) from its
/// `GET /metrics` and `GET /slots`: one rank.
///
/// `llamacpp:requests_processing` gives the running requests and
/// `llamacpp:requests_deferred` the waiting ones. Its `/metrics` has no KV
/// gauge, so the KV cache comes from `/slots`: `kv_total_blocks = Σ n_ctx`
/// over the slots, `active_decode_blocks = Σ n_prompt_tokens` over those
/// `is_processing`, one token per block (both saturating at `u32::MAX`).
///
/// # Errors
///
/// [`EngineError::TooLarge`] (either body), [`EngineError::Exposition`],
/// [`EngineError::NoLoadMetrics`], [`EngineError::InvalidValue`] from
/// `metrics`, then [`EngineError::Slots`] from `slots`.
pub fn llamacpp(metrics: &str, slots: &str) -> Result<EngineSnapshot, EngineError> {
    check_size(metrics)?;
    check_size(slots)?;
    let families = exposition::read(metrics, &[PROCESSING, DEFERRED])?;
    let [processing, deferred] = &families[..] else { unreachable!("one entry per name") };
    let mut ranks = Ranks::default();
    ranks.add(PROCESSING, processing, None, Reading::Running)?;
    ranks.add(DEFERRED, deferred, None, Reading::Waiting)?;
    let mut snapshot = ranks.snapshot().ok_or(EngineError::NoLoadMetrics)?;
    let (active, total) = kv_blocks(slots)?;
    let load = &mut snapshot.ranks[0].load;
    load.active_decode_blocks = active;
    load.kv_total_blocks = total;
    Ok(snapshot)
}

/// `(Σ n_prompt_tokens of processing slots, Σ n_ctx)`, saturating; `(0, 0)`
/// (unknown) when a processing slot does not report its tokens (a build
/// that names the field otherwise): the KV use is then not known, but the
/// request counts of `/metrics` still are, so the scrape does not fail.
fn kv_blocks(slots: &str) -> Result<(u32, u32), EngineError> {
    let slots: Vec<Slot> = serde_json::from_str(slots).map_err(|e| EngineError::Slots(e.to_string()))?;
    let (mut active, mut total) = (0u32, 0u32);
    for slot in &slots {
        total = total.saturating_add(saturate(slot.n_ctx));
        if slot.is_processing {
            let Some(tokens) = slot.n_prompt_tokens else { return Ok((0, 0)) };
            active = active.saturating_add(saturate(tokens));
        }
    }
    Ok((active, total))
}

fn saturate(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}
