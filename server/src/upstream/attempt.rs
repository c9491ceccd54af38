//! [`attempt`]: one request sent to one upstream, and what came of it.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use futures_util::{FutureExt as _, StreamExt as _};
use loadgate::rejection::{REFUSAL_AT_CAPACITY, REFUSAL_HEADER};
use loadgate::retry_hint::{MAX_RETRY_AFTER, MIN_RETRY_AFTER};
use tokio::time::Instant;

use super::assemble::{is_event_stream, read_whole, whole_response, ReadError};
use super::failure::{warn_failure, Failure, Peer, REFUSAL_NOT_REACHED};
use super::payload::{NoBody, Payload, Prepared, RELEASE_GRACE};
use super::relay::{relay, UpstreamBody};
use super::watcher::Watcher;
use crate::api_error::RETRY_AFTER_MS;
use crate::engines::error_chain as chain;
use crate::secret::REFUSAL_PROOF;

/// Largest error body read from an upstream to relay.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// The bounds on every wait for an upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Timeouts {
    /// Opening a connection.
    pub(crate) connect: Duration,
    /// From sending a request to its first body bytes.
    pub(crate) first_byte: Duration,
    /// Between two chunks of a response.
    pub(crate) between_chunks: Duration,
}

/// What came of one attempt.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Relay this to the client: a success (streamed or assembled whole) or
    /// the upstream's own error.
    Answer(Response),
    /// The upstream refused at its hard cap (`x-loadgate-refusal`): nothing
    /// was run; another upstream may take it.
    AtCapacity,
    /// The upstream refused the request proof (`x-loadgate-refusal:
    /// proof-refused`): nothing was run; another upstream may take it.
    ProofRefused,
    /// No usable answer and the upstream did not take the request (it could
    /// not be reached, or broke before answering): another may take it.
    Failed(Failure),
    /// The upstream took the request but its answer failed before anything
    /// reached the client (no first byte in time; an assembled answer that
    /// broke or stalled): running it again elsewhere would run it twice.
    Cut(Failure),
}

/// Sends `request` (method, URL and headers set; no body) with `payload`'s
/// body to `peer`, an upstream that `assembles` or not, within `timeouts`.
/// `watcher` is held until the answer has been read (see [`Watcher`]).
pub(crate) async fn attempt<W: Watcher>(
    request: reqwest::RequestBuilder,
    payload: &Payload,
    assembles: bool,
    timeouts: Timeouts,
    peer: Peer,
    mut watcher: W,
) -> Outcome {
    let first_byte_by = Instant::now() + timeouts.first_byte;
    let prepared = match payload.prepare(assembles).await {
        Ok(prepared) => prepared,
        // Retried only before an upstream has it all; see `payload.rs`.
        Err(NoBody::Delivered) => return Outcome::Cut(Failure::Broken),
        Err(NoBody::OverBudget) => return Outcome::Failed(Failure::OverBudget),
    };
    let Prepared { body, assemble: whole, handed, revoke } = prepared;
    let mut request = request.body(body);
    if assembles {
        // llama.cpp closes a finished stream's connection without saying
        // so; a request sent next on that pooled connection would fail.
        request = request.header(header::CONNECTION, "close");
    }
    let send = tokio::time::timeout_at(first_byte_by, request.send());
    tokio::pin!(send);
    // Once the upstream has had the whole body for the grace without
    // failing, the payload lets go of it (the request is taken).
    // It keeps running until the first bytes arrive: an upstream that sends
    // its head at once (a stream's) and works on the request for longer than
    // the grace has taken it too.
    let let_go = async {
        handed.wait().await;
        tokio::time::sleep(RELEASE_GRACE).await;
        payload.release();
    }
    .fuse();
    tokio::pin!(let_go);
    let sent = tokio::select! {
        sent = &mut send => sent,
        () = &mut let_go => send.await,
    };
    let upstream = match sent {
        Ok(Ok(upstream)) => upstream,
        Ok(Err(error)) => {
            let failure = Failure::of_send(&error);
            warn_failure(peer, failure, "the request failed", &chain(&error));
            return broken(payload, failure);
        }
        Err(_) => return no_first_byte(peer, timeouts.first_byte),
    };
    // A refusal is recognised by the explicit signal alone, whatever the
    // status (an overload status of 200 included) and the body. The signal
    // is never relayed: the response's headers are built here. A refused
    // request needs no more of its body there: `revoke`, dropped on
    // return, takes back what was not sent yet (an upstream that refused
    // after the head alone and reads no more would hold it, with its
    // share of the body budget, for as long as it keeps the connection).
    match upstream.headers().get(REFUSAL_HEADER).map(HeaderValue::as_bytes) {
        Some(signal) if signal == REFUSAL_AT_CAPACITY.as_bytes() => return Outcome::AtCapacity,
        Some(signal) if signal == REFUSAL_PROOF.as_bytes() => return Outcome::ProofRefused,
        Some(signal) if signal == REFUSAL_NOT_REACHED.as_bytes() => {
            warn_failure(peer, Failure::Connect, "the request did not reach an engine", &"the worker's engine failed");
            return Outcome::Failed(Failure::Connect);
        }
        _ => {}
    }
    // The upstream answered: what it has not read of the body yet, it may
    // still read (dropped before, `revoke` takes the body back).
    revoke.disarm();
    if upstream.status().is_informational() {
        // A final answer of 1xx (a 101 Switching Protocols to a completion)
        // is no answer: never relayed as the client's final status. The
        // upstream may have run the request, so it is not run again.
        let detail = format_args!("status {}", upstream.status());
        warn_failure(peer, Failure::Broken, "an informational status as the final answer", &detail);
        return Outcome::Cut(Failure::Broken);
    }
    let status = StatusCode::from_u16(upstream.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let content_type = upstream.headers().get(header::CONTENT_TYPE).cloned();
    if !status.is_success() {
        return error_answer(upstream, status, content_type, timeouts, peer, watcher).await;
    }
    let cache_control = upstream.headers().get(header::CACHE_CONTROL).cloned();
    // The first bytes are awaited here, so that an upstream that sends its
    // head but no token can still be left for another.
    let mut stream: UpstreamBody = Box::pin(upstream.bytes_stream());
    let next = tokio::time::timeout_at(first_byte_by, stream.next());
    tokio::pin!(next);
    let next = loop {
        tokio::select! {
            next = &mut next => break next,
            () = &mut let_go => {}
        }
    };
    let first = match next {
        Ok(Some(Ok(chunk))) => Some(chunk),
        Ok(None) => None,
        Ok(Some(Err(error))) => {
            warn_failure(peer, Failure::Broken, "the response broke before its first byte", &chain(&error));
            return broken(payload, Failure::Broken);
        }
        Err(_) => return no_first_byte(peer, timeouts.first_byte),
    };
    if let Some(chunk) = &first {
        watcher.chunk(chunk);
    }
    watcher.answered();
    if let Some(route) = whole.filter(|_| is_event_stream(content_type.as_ref())) {
        // Held until the stream is read: the upstream works on it until then.
        let answer = read_whole(route, first, stream, timeouts.between_chunks, |c| watcher.chunk(c)).await;
        drop(watcher);
        return match answer {
            Ok(answer) => Outcome::Answer(whole_response(answer)),
            Err(error) => {
                let failure = match error {
                    ReadError::Stalled(_) => Failure::BetweenChunks,
                    _ => Failure::Broken,
                };
                warn_failure(peer, failure, "the streamed answer could not be assembled", &error);
                Outcome::Cut(failure)
            }
        };
    }
    let mut response = Response::new(relay(first, stream, timeouts.between_chunks, peer, watcher));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.extend(
        [(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, cache_control)]
            .into_iter()
            .filter_map(|(name, value)| value.map(|v| (name, v))),
    );
    Outcome::Answer(response)
}

/// An attempt that failed with `failure` before any answer: `Failed` (another
/// upstream may take the request) while the payload still holds the body,
/// `Cut` once it let go (the upstream had it for the release grace: taken).
fn broken(payload: &Payload, failure: Failure) -> Outcome {
    match payload.body() {
        Some(_) => Outcome::Failed(failure),
        None => Outcome::Cut(failure),
    }
}

/// The upstream's own error (a 4xx, a 5xx): its body read within bounds,
/// relayed with its `Content-Type` and retry hints.
async fn error_answer<W: Watcher>(
    upstream: reqwest::Response,
    status: StatusCode,
    content_type: Option<HeaderValue>,
    timeouts: Timeouts,
    peer: Peer,
    watcher: W,
) -> Outcome {
    let hints = relayed_hints(upstream.headers());
    let body = match tokio::time::timeout(timeouts.between_chunks, read_bounded(upstream)).await {
        Ok(Ok(body)) => body,
        Ok(Err(error)) => {
            warn_failure(peer, Failure::Broken, "reading an error body failed", &chain(&error));
            return Outcome::Failed(Failure::Broken);
        }
        Err(_) => return Outcome::Failed(Failure::BetweenChunks),
    };
    // Not `answered`: an error took the worker no generation, and its
    // duration would teach the retry hint that requests are short.
    drop(watcher);
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().extend(hints);
    if let Some(content_type) = content_type {
        response.headers_mut().insert(header::CONTENT_TYPE, content_type);
    }
    Outcome::Answer(response)
}

/// An upstream error's retry hints as relayed to the client: `Retry-After`
/// (whole seconds) and `retry-after-ms`, each held to the frontend's own
/// bounds, [`MIN_RETRY_AFTER`] to [`MAX_RETRY_AFTER`] (a worker or its engine
/// saying 0 would bring its clients back at once, all together; a year,
/// never). Anything else (an HTTP date, a fraction, a sign) is dropped.
fn relayed_hints(headers: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    let within = |ms: u128| {
        let (min, max) = (MIN_RETRY_AFTER.as_millis(), MAX_RETRY_AFTER.as_millis());
        ms.clamp(min, max)
    };
    let whole = |value: &HeaderValue| {
        let text = value.to_str().ok()?.trim();
        // Digits only: `u128` parsing would take a leading `+`.
        (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())).then_some(())?;
        Some(text.parse::<u128>().unwrap_or(u128::MAX))
    };
    let mut hints = Vec::new();
    if let Some(secs) = headers.get(header::RETRY_AFTER).and_then(whole) {
        let secs = within(secs.saturating_mul(1000)).div_ceil(1000);
        hints.push((header::RETRY_AFTER, HeaderValue::from(secs as u64)));
    }
    if let Some(ms) = headers.get(RETRY_AFTER_MS).and_then(whole) {
        hints.push((HeaderName::from_static(RETRY_AFTER_MS), HeaderValue::from(within(ms) as u64)));
    }
    hints
}

/// No head, or no first byte, within the first-byte timeout.
fn no_first_byte(peer: Peer, timeout: Duration) -> Outcome {
    warn_failure(peer, Failure::FirstByte, "no answer in time", &format_args!("nothing within {timeout:?}"));
    Outcome::Cut(Failure::FirstByte)
}

/// At most [`MAX_ERROR_BODY`] bytes of `upstream`'s body.
async fn read_bounded(mut upstream: reqwest::Response) -> reqwest::Result<Bytes> {
    let mut body = Vec::new();
    while let Some(chunk) = upstream.chunk().await? {
        let room = MAX_ERROR_BODY.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if room <= chunk.len() {
            break;
        }
    }
    Ok(Bytes::from(body))
}

#[cfg(test)]
mod tests;
