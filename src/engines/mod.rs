//! Per-rank load from real inference engines' own endpoints (feature `engines`).
//!
//! Pure functions from the text an engine serves to an [`EngineSnapshot`]:
//! one [`RankSample`] (a [`RankLoad`](crate::RankLoad) plus the running
//! requests) per data-parallel rank. The polling lives with the caller
//! (the `loadgate` server scrapes every few tens of milliseconds).
//!
//! | engine | reads | ranks by |
//! |---|---|---|
//! | [`vllm`] | `/metrics`: `vllm:kv_cache_usage_perc` (older: `vllm:gpu_cache_usage_perc`), `vllm:num_requests_running`, `vllm:num_requests_waiting`, `num_gpu_blocks` of `vllm:cache_config_info` | the `engine` label |
//! | [`sglang`] | `/metrics`: `sglang:token_usage`, `sglang:num_running_reqs`, `sglang:num_queue_reqs` | the `dp_rank` label |
//! | [`llamacpp`] | `/metrics`: `llamacpp:requests_processing`, `llamacpp:requests_deferred`; `/slots`: `n_ctx`, `is_processing` | one rank |
//!
//! Besides load, llama.cpp needs its non-streamed requests sent streamed, so
//! that a client that leaves frees its slot: [`streamed_request`] and
//! [`StreamAssembler`] (see [`EngineKind::assembles`]).
//!
//! # The mapping
//!
//! - Ranks come in ascending numeric order of their label; a series without
//!   it (or with it empty, which Prometheus treats alike) is rank 0. Several
//!   series of one family for one rank (SGLang's per-`tp_rank` series, or
//!   other labels such as `model_name`) count as their maximum.
//! - A KV-cache fraction becomes blocks: over vLLM's `num_gpu_blocks` `B`
//!   when `vllm:cache_config_info` gives it for that rank (or, without an
//!   `engine` label, for all), `round(fraction * B)` of `B`; otherwise
//!   [`FRACTION_BLOCKS`] and the fraction in parts per billion, exactly the
//!   fixed point of the busy thresholds. No KV metric for a rank: both 0
//!   (unknown). llama.cpp has no KV gauge: its total is `Σ n_ctx` over the
//!   slots and its active blocks `Σ n_ctx` over the processing ones (a busy
//!   slot holds its whole context), one token per block.
//! - Counts round to the nearest integer and saturate at `u32::MAX`; a
//!   fraction is clamped to `[0, 1]`. A negative, NaN or infinite value is
//!   [`EngineError::InvalidValue`].
//! - `active_prefill_tokens` and `max_num_batched_tokens` stay 0: no engine
//!   here reports them (the router's own tracking supplies prefill).
//! - A document without any of the kind's load metrics is
//!   [`EngineError::NoLoadMetrics`]: the wrong kind or the wrong endpoint.
//!
//! # Parsing
//!
//! The Prometheus text format is parsed by the `prom_text_format_parser`
//! crate (whose metric names take colons, unlike `prometheus-parse`'s
//! `\w+`, which silently drops every `vllm:*` sample). Only the lines of
//! the families a mapper reads reach it: a whole vLLM document with its
//! histograms takes about 2 ms to parse, the selected lines about a
//! tenth of that, and a family the mapper never reads cannot make the load
//! unreadable.
//!
//! # Example
//!
//! ```
//! use loadgate::engines::{self, EngineKind, FRACTION_BLOCKS};
//!
//! let metrics = "\
//! # TYPE vllm:num_requests_running gauge
//! vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 7.0
//! vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 2.0
//! # TYPE vllm:num_requests_waiting gauge
//! vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0
//! vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 0.0
//! # TYPE vllm:kv_cache_usage_perc gauge
//! vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25
//! vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.5
//! ";
//! let snapshot = engines::snapshot(EngineKind::Vllm, metrics, None).unwrap();
//! assert_eq!(snapshot.ranks.len(), 2);
//! let rank0 = snapshot.ranks[0];
//! assert_eq!(rank0.running_requests, 7);
//! assert_eq!(rank0.load.waiting_requests, 3);
//! assert_eq!((rank0.load.active_decode_blocks, rank0.load.kv_total_blocks), (250_000_000, FRACTION_BLOCKS));
//! ```

mod assemble;
mod error;
mod exposition;
mod kind;
mod llamacpp;
mod ranks;
mod sglang;
mod snapshot;
mod value;
mod vllm;

pub use self::assemble::{
    streamed_request, AssembleError, Assembled, CompletionRoute, StreamAssembler, MAX_ASSEMBLED_BYTES, MAX_PARSED_BYTES,
};
pub use self::error::EngineError;
pub use self::kind::{EngineKind, UnknownEngineKind};
pub use self::llamacpp::{llamacpp, llamacpp_ahead};
pub use self::sglang::sglang;
pub use self::snapshot::{EngineSnapshot, RankSample};
pub use self::vllm::vllm;

/// The largest `/metrics` or `/slots` body a mapper reads, in bytes (8 MiB);
/// a larger one is [`EngineError::TooLarge`].
pub const MAX_DOCUMENT_BYTES: usize = 8 << 20;

/// The most data-parallel ranks one engine may report; more is
/// [`EngineError::TooManyRanks`].
pub const MAX_RANKS: usize = 256;

/// Blocks standing for a whole KV cache when the engine reports only a fraction: the
/// thresholds' fixed point (parts per billion), so `active / total > threshold` compares
/// the engine's fraction exactly as the threshold does.
pub const FRACTION_BLOCKS: u32 = 1_000_000_000;

/// Maps one scrape of an engine of `kind`.
///
/// `slots` (llama.cpp's `GET /slots` body) is required for
/// [`EngineKind::LlamaCpp`] ([`EngineKind::needs_slots`]) and ignored
/// otherwise.
///
/// # Errors
///
/// [`EngineError::MissingSlots`] for llama.cpp without `slots`; otherwise
/// what [`vllm`], [`sglang`] or [`llamacpp`] return.
pub fn snapshot(kind: EngineKind, metrics: &str, slots: Option<&str>) -> Result<EngineSnapshot, EngineError> {
    snapshot_ahead(kind, metrics, slots, 0)
}

/// As [`snapshot`], with a llama.cpp slot at most `ahead` tokens from its
/// output limit counted free ([`llamacpp_ahead`]); other kinds report no
/// slots and ignore `ahead`.
///
/// # Errors
///
/// As [`snapshot`].
pub fn snapshot_ahead(
    kind: EngineKind,
    metrics: &str,
    slots: Option<&str>,
    ahead: u32,
) -> Result<EngineSnapshot, EngineError> {
    match kind {
        EngineKind::Vllm => vllm(metrics),
        EngineKind::Sglang => sglang(metrics),
        EngineKind::LlamaCpp => llamacpp_ahead(metrics, slots.ok_or(EngineError::MissingSlots)?, ahead),
    }
}

/// Refuses a body over [`MAX_DOCUMENT_BYTES`].
fn check_size(document: &str) -> Result<(), EngineError> {
    if document.len() > MAX_DOCUMENT_BYTES {
        return Err(EngineError::TooLarge { bytes: document.len(), limit: MAX_DOCUMENT_BYTES });
    }
    Ok(())
}

/// At most `MAX` bytes of `text` (cut at a char boundary), for error
/// messages that quote what a peer sent.
fn excerpt(text: &str) -> String {
    cut(text, 64)
}

/// At most `max` bytes of `text` (cut at a char boundary), `…` after a cut.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}
