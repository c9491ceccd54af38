//! The label values of the rejection counters.

use crate::thresholds::BusySignals;

/// The API endpoint a rejected request came to (the `endpoint` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/chat/completions`.
    ChatCompletions,
}

impl Endpoint {
    /// Every endpoint, in counter-index order.
    pub(super) const ALL: [Endpoint; 2] = [Endpoint::Completions, Endpoint::ChatCompletions];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Completions => "completions",
            Endpoint::ChatCompletions => "chat_completions",
        }
    }

    /// The endpoint's counter in a row.
    #[inline]
    pub(super) fn index(self) -> usize {
        self as usize
    }
}

/// Why a request was rejected (the `reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// Decode-block utilisation over its threshold.
    DecodeBlocks,
    /// Active prefill tokens over the absolute threshold.
    PrefillTokens,
    /// Active prefill tokens over the fraction of `max_num_batched_tokens`.
    PrefillTokensFrac,
    /// Requests waiting in the engine's queue over their threshold.
    WaitingRequests,
    /// Workers refused at their hard cap (after migration, if any).
    WorkerCapacity,
    /// Every free worker had already refused this request.
    Excluded,
    /// The request waited in the model's waiting line until its deadline.
    Deadline,
    /// The model's waiting line was full (by count or by queued tokens).
    QueueFull,
    /// A sheddable request gave its place in a full line to a critical one.
    ClassShed,
    /// The request's tenant already held its cap of the waiting line.
    TenantCap,
    /// A sheddable request found no worker free below the thresholds
    /// lowered by the sheddable headroom.
    SheddableHeadroom,
}

impl Reason {
    /// Every reason, in counter-index order.
    pub(super) const ALL: [Reason; 11] = [
        Reason::DecodeBlocks,
        Reason::PrefillTokens,
        Reason::PrefillTokensFrac,
        Reason::WaitingRequests,
        Reason::WorkerCapacity,
        Reason::Excluded,
        Reason::Deadline,
        Reason::QueueFull,
        Reason::ClassShed,
        Reason::TenantCap,
        Reason::SheddableHeadroom,
    ];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Reason::DecodeBlocks => "decode_blocks",
            Reason::PrefillTokens => "prefill_tokens",
            Reason::PrefillTokensFrac => "prefill_tokens_frac",
            Reason::WaitingRequests => "waiting_requests",
            Reason::WorkerCapacity => "worker_capacity",
            Reason::Excluded => "excluded",
            Reason::Deadline => "deadline",
            Reason::QueueFull => "queue_full",
            Reason::ClassShed => "class_shed",
            Reason::TenantCap => "tenant_cap",
            Reason::SheddableHeadroom => "sheddable_headroom",
        }
    }

    /// The reasons behind a set of busy signals (empty when none fired).
    pub fn from_signals(s: BusySignals) -> impl Iterator<Item = Reason> {
        [
            (s.decode, Reason::DecodeBlocks),
            (s.prefill, Reason::PrefillTokens),
            (s.prefill_frac, Reason::PrefillTokensFrac),
            (s.waiting, Reason::WaitingRequests),
        ]
        .into_iter()
        .filter_map(|(fired, r)| fired.then_some(r))
    }

    /// The reason's counter in a row.
    #[inline]
    pub(super) fn index(self) -> usize {
        self as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_indexes_follow_the_label_lists() {
        for (i, reason) in Reason::ALL.into_iter().enumerate() {
            assert_eq!(reason.index(), i, "{reason:?}");
        }
        for (i, endpoint) in Endpoint::ALL.into_iter().enumerate() {
            assert_eq!(endpoint.index(), i, "{endpoint:?}");
        }
        let mut labels: Vec<&str> = Reason::ALL.iter().map(|r| r.label()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), Reason::ALL.len());
    }
}
