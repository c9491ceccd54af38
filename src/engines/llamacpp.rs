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
    /// What the slot generates next; its first entry's `n_remain` is the
    /// tokens left before the request's output limit (-1: no limit).
    /// Read leniently: a shape other than llama-server's counts as unknown.
    #[serde(default)]
    next_token: Option<serde_json::Value>,
}

impl Slot {
    /// Processing, and at most `ahead` tokens from its output limit.
    fn ending(&self, ahead: u32) -> bool {
        if ahead == 0 || !self.is_processing {
            return false;
        }
        let remain = self.next_token.as_ref().and_then(|next| next.get(0)?.get("n_remain")?.as_i64());
        remain.is_some_and(|n| (0..=i64::from(ahead)).contains(&n))
    }
}

/// The load of llama.cpp's `llama-server` (`--metrics`) from its
/// `GET /metrics` and `GET /slots`: one rank.
///
/// `llamacpp:requests_processing` gives the running requests and
/// `llamacpp:requests_deferred` the waiting ones. Its `/metrics` has no KV
/// gauge, so the KV cache comes from `/slots`: `kv_total_blocks = Σ n_ctx`
/// over the slots and `active_decode_blocks = Σ n_ctx` over those
/// `is_processing`, one token per block (both saturating at `u32::MAX`).
///
/// A processing slot holds its whole context: llama.cpp gives each slot a
/// fixed context and starts a request only in a free slot, so what a new
/// request can use is the free slots' contexts, however few tokens the busy
/// ones hold. The KV share is then the share of slots in use, and
/// `--active-decode-blocks-threshold 0.85` (below 1, above `(n − 1) / n`
/// for `n` equal slots) makes a server busy exactly when no slot is free.
///
/// # Errors
///
/// [`EngineError::TooLarge`] (either body), [`EngineError::Exposition`],
/// [`EngineError::NoLoadMetrics`], [`EngineError::InvalidValue`] from
/// `metrics`, then [`EngineError::Slots`] from `slots`.
pub fn llamacpp(metrics: &str, slots: &str) -> Result<EngineSnapshot, EngineError> {
    llamacpp_ahead(metrics, slots, 0)
}

/// As [`llamacpp`], with each processing slot at most `ahead` tokens from
/// its request's output limit (`/slots`' `next_token[0].n_remain`, from 0
/// to `ahead`) counted free: its context leaves the active blocks and its
/// request the running ones. A request sent to the server meanwhile waits
/// in its queue for those last tokens and starts as the slot frees,
/// instead of the slot idling until a scrape shows it free (`ahead` 0:
/// exactly [`llamacpp`]). A slot with no limit (-1) or no `n_remain` is
/// never ending.
///
/// # Errors
///
/// As [`llamacpp`].
pub fn llamacpp_ahead(metrics: &str, slots: &str, ahead: u32) -> Result<EngineSnapshot, EngineError> {
    check_size(metrics)?;
    check_size(slots)?;
    let families = exposition::read(metrics, &[PROCESSING, DEFERRED])?;
    let [processing, deferred] = &families[..] else { unreachable!("one entry per name") };
    let mut ranks = Ranks::default();
    ranks.add(PROCESSING, processing, None, Reading::Running)?;
    ranks.add(DEFERRED, deferred, None, Reading::Waiting)?;
    let mut snapshot = ranks.snapshot().ok_or(EngineError::NoLoadMetrics)?;
    let (active, total, ending) = kv_blocks(slots, ahead)?;
    let rank = &mut snapshot.ranks[0];
    rank.load.active_decode_blocks = active;
    rank.load.kv_total_blocks = total;
    rank.running_requests = rank.running_requests.saturating_sub(ending);
    Ok(snapshot)
}

/// `(Σ n_ctx of processing slots not ending, Σ n_ctx, ending slots)`,
/// saturating (see [`llamacpp_ahead`]).
fn kv_blocks(slots: &str, ahead: u32) -> Result<(u32, u32, u32), EngineError> {
    let slots: Vec<Slot> = serde_json::from_str(slots).map_err(|e| EngineError::Slots(e.to_string()))?;
    let (mut active, mut total, mut ending) = (0u32, 0u32, 0u32);
    for slot in &slots {
        let context = saturate(slot.n_ctx);
        total = total.saturating_add(context);
        if slot.ending(ahead) {
            ending = ending.saturating_add(1);
        } else if slot.is_processing {
            active = active.saturating_add(context);
        }
    }
    Ok((active, total, ending))
}

fn saturate(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}
