//! The simulator's answers to the OpenAI routes: a request admitted through
//! the worker's hard cap runs on the [`Simulator`], streamed as SSE or
//! answered whole. The engine slot is held by the response body, so it is
//! released when the response has ended: stream finished, error, client
//! gone, or the client's connection cut for write progress.

use std::convert::Infallible;
use std::pin::Pin;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse as _, Response};
use futures_util::{Stream, StreamExt as _};
use loadgate::{PermitStream, Rejection};

use super::simulator::{SimError, Simulator, TokenStream};
use crate::openai::request::read_generation;
use crate::openai::{filler_token, sse_event, Api, InvalidRequest, ResponseId, Usage, INVALID_REQUEST_ERROR, SSE_DONE};
use crate::worker::gate::{Gate, Held};
use crate::worker::reply::{error_response, invalid};

/// A response whose body `inner` holds `held` until it ends, fails or is
/// dropped.
fn held_body<S, E>(inner: S, held: Held) -> Response
where
    S: Stream<Item = Result<Bytes, E>> + Unpin + Send + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync>> + 'static,
{
    Body::from_stream(PermitStream::new(inner, held)).into_response()
}

/// Bodies above this are parsed on tokio's blocking pool, so a large prompt
/// does not stall the runtime thread that serves other requests.
const INLINE_PARSE_LIMIT: usize = 1024 * 1024;

pub(crate) async fn generate(gate: &Gate, simulator: &Simulator, api: Api, body: Bytes) -> Response {
    let parsed = if body.len() <= INLINE_PARSE_LIMIT {
        read_generation(api, &body)
    } else {
        tokio::task::spawn_blocking(move || read_generation(api, &body))
            .await
            .unwrap_or_else(|e| Err(InvalidRequest::body(format!("could not parse the request: {e}"))))
    };
    let request = match parsed {
        Ok(r) => r,
        Err(error) => return invalid(&error),
    };
    // A request that could never fit is refused before it takes a place in
    // the cap (queued, or a 529 that invites retries of it).
    if let Err(e) = simulator.fits(request.prompt_tokens, request.max_tokens) {
        return error_response(StatusCode::BAD_REQUEST, INVALID_REQUEST_ERROR, None, &e.to_string());
    }
    let held = match gate.admit().await {
        Ok(held) => held,
        Err(refusal) => return refusal,
    };
    let tokens = match simulator.submit(request.prompt_tokens, request.max_tokens) {
        Ok(t) => t,
        Err(e @ SimError::ContextTooLong { .. }) => {
            return error_response(StatusCode::BAD_REQUEST, INVALID_REQUEST_ERROR, None, &e.to_string())
        }
        Err(e @ SimError::Stopped) => {
            let unavailable = Rejection::Unavailable.error_type();
            return error_response(StatusCode::SERVICE_UNAVAILABLE, unavailable, None, &e.to_string());
        }
    };
    let id = ResponseId::new(api, &request.model).with_usage_chunk(request.include_usage);
    let prompt_tokens = request.prompt_tokens;
    if request.stream {
        let events = sse_stream(id, prompt_tokens, tokens);
        let mut response = held_body(events, held);
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        response
    } else {
        let (text, generated) = collect(tokens).await;
        let usage = Usage { prompt_tokens, completion_tokens: generated };
        let full = Bytes::from(id.full(&text, usage));
        let mut response = held_body(futures_util::stream::iter([Ok::<_, Infallible>(full)]), held);
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }
}

/// Waits for every token of a non-streaming request.
async fn collect(mut tokens: TokenStream) -> (String, u32) {
    let mut text = String::new();
    let mut n = 0;
    while let Some(index) = tokens.recv().await {
        text.push_str(filler_token(index));
        n += 1;
    }
    (text, n)
}

/// The SSE events of a streaming request: one per token, then the finish
/// chunk, then (with `include_usage`) a chunk of `"choices": []` and the
/// usage, then `[DONE]`, as OpenAI ends its streams. Without
/// `include_usage` no chunk carries usage. Dropping it cancels the request.
fn sse_stream(
    id: ResponseId,
    prompt_tokens: u32,
    tokens: TokenStream,
) -> Pin<Box<dyn Stream<Item = Result<Bytes, Infallible>> + Send>> {
    let state = (Some(tokens), 0u32);
    let events = futures_util::stream::unfold(state, move |(tokens, generated)| {
        let id = id.clone();
        async move {
            let mut tokens = tokens?;
            match tokens.recv().await {
                Some(index) => {
                    let event = sse_event(&id.chunk(filler_token(index), generated == 0));
                    Some((event, (Some(tokens), generated + 1)))
                }
                None => {
                    let mut last = sse_event(&id.finish_chunk());
                    if id.include_usage {
                        let usage = Usage { prompt_tokens, completion_tokens: generated };
                        last.push_str(&sse_event(&id.usage_chunk(usage)));
                    }
                    last.push_str(SSE_DONE);
                    Some((last, (None, generated)))
                }
            }
        }
    });
    Box::pin(events.map(|event| Ok(Bytes::from(event))))
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    /// The events of a stream of `tokens` tokens.
    async fn stream_events(include_usage: bool, tokens: u32) -> Vec<String> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        for index in 0..tokens {
            tx.send(index).unwrap();
        }
        drop(tx);
        let id = ResponseId::new(Api::ChatCompletions, "m").with_usage_chunk(include_usage);
        let body: Vec<Bytes> = sse_stream(id, 7, rx).map(|chunk| chunk.unwrap()).collect().await;
        let text = String::from_utf8(body.concat()).unwrap();
        text.split("\n\n").filter(|e| !e.is_empty()).map(str::to_owned).collect()
    }

    #[tokio::test]
    async fn a_stream_ends_with_its_usage_only_when_asked() {
        let events = stream_events(false, 3).await;
        assert_eq!(events.len(), 5, "3 tokens, the finish chunk, [DONE]: {events:?}");
        assert_eq!(events[4], "data: [DONE]");
        for event in &events[..4] {
            assert!(!event.contains("usage"), "{event}");
        }
        let events = stream_events(true, 3).await;
        assert_eq!(events.len(), 6, "3 tokens, the finish chunk, the usage chunk, [DONE]: {events:?}");
        let chunks: Vec<Value> =
            events[..5].iter().map(|e| serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap()).collect();
        for chunk in &chunks[..4] {
            assert_eq!(chunk["usage"], Value::Null);
            assert_eq!(chunk["choices"].as_array().map(Vec::len), Some(1));
        }
        assert_eq!(chunks[3]["choices"][0]["finish_reason"], "length");
        assert_eq!(chunks[4]["choices"], serde_json::json!([]));
        assert_eq!(
            chunks[4]["usage"],
            serde_json::json!({"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10})
        );
        assert_eq!(events[5], "data: [DONE]");
    }
}
