//! llama.cpp's `/metrics` and `/slots`.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
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
    /// `n_remain` of the first entry of `next_token` (what the slot
    /// generates next): the tokens left before the request's output limit
    /// (-1: no limit). Read leniently: a shape other than llama-server's
    /// counts as unknown ([`first_n_remain`]).
    #[serde(default, rename = "next_token", deserialize_with = "first_n_remain")]
    n_remain: Option<i64>,
}

impl Slot {
    /// Processing, and at most `ahead` tokens from its output limit.
    fn ending(&self, ahead: u32) -> bool {
        if ahead == 0 || !self.is_processing {
            return false;
        }
        self.n_remain.is_some_and(|n| (0..=i64::from(ahead)).contains(&n))
    }
}

/// `next_token[0].n_remain` when it is an integer that fits an `i64`, else
/// `None` (another shape). Nothing else of `next_token` is kept: the rest
/// is skipped unread, so a `/slots` padded with a long `next_token` costs
/// no memory past its text (a JSON tree of it took about 16 times that).
fn first_n_remain<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<i64>, D::Error> {
    NRemain(Depth::List).deserialize(deserializer)
}

/// Where [`NRemain`] reads: `next_token` itself, its first entry, or that
/// entry's `n_remain`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Depth {
    List,
    Entry,
    Value,
}

/// Reads `n_remain` at its [`Depth`] below `next_token`; any other value,
/// whatever its shape, is skipped as `None`.
#[derive(Clone, Copy)]
struct NRemain(Depth);

impl<'de> DeserializeSeed<'de> for NRemain {
    type Value = Option<i64>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<i64>, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NRemain {
    type Value = Option<i64>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<i64>, A::Error> {
        let first = match self.0 {
            Depth::List => seq.next_element_seed(NRemain(Depth::Entry))?.flatten(),
            _ => None,
        };
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(first)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<i64>, A::Error> {
        let mut remain = None;
        while let Some(key) = map.next_key::<String>()? {
            if self.0 == Depth::Entry && key == "n_remain" {
                // A repeated key: the last counts (as a JSON tree keeps it).
                remain = map.next_value_seed(NRemain(Depth::Value))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(remain)
    }

    fn visit_i64<E>(self, v: i64) -> Result<Option<i64>, E> {
        Ok((self.0 == Depth::Value).then_some(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Option<i64>, E> {
        Ok(i64::try_from(v).ok().filter(|_| self.0 == Depth::Value))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Option<i64>, E> {
        Ok(None)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Option<i64>, E> {
        Ok(None)
    }

    fn visit_str<E>(self, _: &str) -> Result<Option<i64>, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Option<i64>, E> {
        Ok(None)
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
