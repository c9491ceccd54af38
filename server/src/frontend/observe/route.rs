//! [`Route`]: which route of the inference listener a request came to (the
//! `endpoint` label), and the label values of how it ended.

use axum::http::{Method, StatusCode};
use loadgate::rejection::overload_status_code;
use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};

/// The route a request came to; anything the listener does not serve
/// (404, 405) is [`Route::Other`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Route {
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/chat/completions`.
    ChatCompletions,
    /// `GET /v1/models`.
    Models,
    /// `GET /v1/models/{id}`.
    Model,
    /// `GET /live`.
    Live,
    /// `GET /health`.
    Health,
    /// `GET /metrics`.
    Metrics,
    /// Any other method or path.
    Other,
}

impl Route {
    /// The route of `method path`.
    pub(super) fn of(method: &Method, path: &str) -> Route {
        let post = method == Method::POST;
        let get = method == Method::GET || method == Method::HEAD;
        match path {
            "/v1/completions" if post => Route::Completions,
            "/v1/chat/completions" if post => Route::ChatCompletions,
            "/v1/models" if get => Route::Models,
            "/live" if get => Route::Live,
            "/health" if get => Route::Health,
            "/metrics" if get => Route::Metrics,
            _ if get && path.len() > "/v1/models/".len() && path.starts_with("/v1/models/") => Route::Model,
            _ => Route::Other,
        }
    }

    /// An LLM request (Dynamo's families count these only).
    #[inline]
    pub(super) fn is_inference(self) -> bool {
        matches!(self, Route::Completions | Route::ChatCompletions)
    }

    /// The `endpoint` label (Dynamo's values for the two LLM routes).
    pub(super) fn label(self) -> &'static str {
        match self {
            Route::Completions => "completions",
            Route::ChatCompletions => "chat_completions",
            Route::Models => "models",
            Route::Model => "model",
            Route::Live => "live",
            Route::Health => "health",
            Route::Metrics => "metrics",
            Route::Other => "other",
        }
    }
}

/// How a response ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum End {
    /// The body was sent to its end.
    Complete,
    /// The client went away first (its connection closed, the body or the
    /// response future was dropped).
    ClientGone,
    /// The body failed (e.g. the worker's stream broke).
    Failed,
}

/// Dynamo's `status` and `error_type` labels of `dynamo_frontend_requests_total`
/// for a request that ended as `end` with `code` (0: no response was made).
pub(super) fn dynamo_outcome(code: u16, end: End) -> (&'static str, &'static str) {
    match (end, code) {
        (End::ClientGone, _) => ("error", "cancelled"),
        (End::Failed, _) => ("error", "internal"),
        (End::Complete, 200..=299) => ("success", ""),
        (End::Complete, 404) => ("error", "not_found"),
        (End::Complete, 429 | 529) => ("error", "overload"),
        (End::Complete, 503) => ("error", "unavailable"),
        (End::Complete, 504) => ("error", "response_timeout"),
        (End::Complete, 501) => ("error", "not_implemented"),
        (End::Complete, 400..=499) => ("error", "validation"),
        (End::Complete, _) => ("error", "internal"),
    }
}

/// `code` as a [`StatusCode`]'s number, 0 for none.
#[inline]
pub(super) fn code_of(status: Option<StatusCode>) -> u16 {
    status.map_or(0, |s| s.as_u16())
}

/// The statuses that keep their own `code` label: those the frontend sends
/// itself and the common ones an upstream relays (the configured overload
/// status too, [`CodeLabel::of`]).
const LABELLED_CODES: [u16; 20] =
    [200, 201, 204, 400, 401, 403, 404, 405, 408, 409, 413, 415, 422, 429, 500, 501, 502, 503, 504, 529];

/// The `code` label of a response: its status when it is one of
/// [`LABELLED_CODES`] (or the overload status), else its class (`1xx` …
/// `9xx`), so that the statuses an upstream invents cannot add series
/// without bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum CodeLabel {
    /// A status of its own.
    Exact(u16),
    /// Any other status, by its first digit.
    Class(u16),
}

impl CodeLabel {
    /// The label of status `code`.
    pub(super) fn of(code: u16) -> Self {
        if LABELLED_CODES.contains(&code) || code == overload_status_code() {
            CodeLabel::Exact(code)
        } else {
            CodeLabel::Class(code / 100)
        }
    }
}

impl EncodeLabelValue for CodeLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
        use std::fmt::Write as _;
        match self {
            CodeLabel::Exact(code) => write!(encoder, "{code}"),
            CodeLabel::Class(class) => write!(encoder, "{class}xx"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_follow_method_and_path() {
        assert_eq!(Route::of(&Method::POST, "/v1/completions"), Route::Completions);
        assert_eq!(Route::of(&Method::GET, "/v1/completions"), Route::Other);
        assert_eq!(Route::of(&Method::POST, "/v1/chat/completions"), Route::ChatCompletions);
        assert_eq!(Route::of(&Method::GET, "/v1/models/a/b"), Route::Model);
        assert_eq!(Route::of(&Method::GET, "/v1/models/"), Route::Other);
        assert_eq!(Route::of(&Method::HEAD, "/health"), Route::Health);
        assert_eq!(Route::of(&Method::GET, "/nothing"), Route::Other);
        assert!(Route::Completions.is_inference() && !Route::Health.is_inference());
    }

    #[test]
    fn outcomes_use_dynamos_labels() {
        assert_eq!(dynamo_outcome(200, End::Complete), ("success", ""));
        assert_eq!(dynamo_outcome(200, End::ClientGone), ("error", "cancelled"));
        assert_eq!(dynamo_outcome(529, End::Complete), ("error", "overload"));
        assert_eq!(dynamo_outcome(413, End::Complete), ("error", "validation"));
        assert_eq!(dynamo_outcome(502, End::Complete), ("error", "internal"));
        assert_eq!(dynamo_outcome(0, End::ClientGone), ("error", "cancelled"));
    }

    #[test]
    fn unusual_statuses_are_labelled_by_their_class() {
        assert_eq!(CodeLabel::of(200), CodeLabel::Exact(200));
        assert_eq!(CodeLabel::of(529), CodeLabel::Exact(529));
        assert_eq!(CodeLabel::of(299), CodeLabel::Class(2));
        assert_eq!(CodeLabel::of(599), CodeLabel::Class(5));
        assert_eq!(CodeLabel::of(999), CodeLabel::Class(9));
        let labels: std::collections::HashSet<_> = (100..1000).map(CodeLabel::of).collect();
        assert!(labels.len() <= LABELLED_CODES.len() + 1 + 9, "{} labels for 900 statuses", labels.len());
    }
}
