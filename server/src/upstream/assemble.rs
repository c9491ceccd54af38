//! Reading an engine's stream whole for a non-streamed request
//! ([`loadgate::engines::StreamAssembler`]: why and how), bounded by the
//! between-chunks timeout, the request rewritten off the runtime for a
//! large body, and the client's answer made of what was assembled.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use futures_util::{Stream, StreamExt as _};
use loadgate::engines::{streamed_request, AssembleError, Assembled, CompletionRoute, StreamAssembler};

/// Whether an engine's `Content-Type` is an event stream (an answer to
/// assemble; anything else is relayed as it is).
pub(crate) fn is_event_stream(content_type: Option<&HeaderValue>) -> bool {
    content_type.is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
}

/// The client's answer from an assembled stream: the whole answer (200),
/// or the engine's own error with its status, as JSON.
pub(crate) fn whole_response(answer: Assembled) -> Response {
    let (status, body) = match answer {
        Assembled::Answer(body) => (StatusCode::OK, body),
        Assembled::EngineError { status, body } => {
            (StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), body)
        }
    };
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Bodies above this are rewritten on tokio's blocking pool.
const INLINE_REWRITE_LIMIT: usize = 1024 * 1024;

/// [`streamed_request`], on tokio's blocking pool for a large body (the
/// parse would stall the runtime thread it runs on).
pub(crate) async fn streamed_body(body: &Bytes) -> Option<Vec<u8>> {
    if body.len() <= INLINE_REWRITE_LIMIT {
        return streamed_request(body);
    }
    let shared = body.clone();
    tokio::task::spawn_blocking(move || streamed_request(&shared)).await.ok().flatten()
}

/// Why an engine's stream gave no whole answer.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The engine's body broke.
    Broken(reqwest::Error),
    /// The engine sent nothing within the between-chunks timeout.
    Stalled(Duration),
    /// What it sent does not assemble.
    Assemble(AssembleError),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Broken(error) => write!(f, "the engine's stream broke: {error}"),
            ReadError::Stalled(after) => write!(f, "the engine sent nothing for {after:?}"),
            ReadError::Assemble(error) => error.fmt(f),
        }
    }
}

impl From<AssembleError> for ReadError {
    fn from(error: AssembleError) -> Self {
        ReadError::Assemble(error)
    }
}

/// Reads the engine's stream (its `first` chunk already read, the rest
/// from `body`) and assembles it; `on_chunk` sees each chunk read here
/// (`first` aside) as it comes. The engine must send a data event within
/// every `between_chunks` (its keep-alive comments do not count, so a hung
/// engine that still pings is cut). Dropping the future drops `body`,
/// which closes the engine connection.
pub(crate) async fn read_whole<S>(
    route: CompletionRoute,
    first: Option<Bytes>,
    mut body: S,
    between_chunks: Duration,
    mut on_chunk: impl FnMut(&[u8]),
) -> Result<Assembled, ReadError>
where
    S: Stream<Item = reqwest::Result<Bytes>> + Unpin,
{
    let mut assembler = StreamAssembler::new(route);
    if let Some(chunk) = first {
        assembler.push(&chunk)?;
    }
    let mut events = assembler.events();
    let mut progress_by = tokio::time::Instant::now() + between_chunks;
    while !assembler.ended() {
        match tokio::time::timeout_at(progress_by, body.next()).await {
            Ok(Some(Ok(chunk))) => {
                on_chunk(&chunk);
                assembler.push(&chunk)?;
                if assembler.events() != events {
                    events = assembler.events();
                    progress_by = tokio::time::Instant::now() + between_chunks;
                }
            }
            Ok(Some(Err(error))) => return Err(ReadError::Broken(error)),
            Ok(None) => break,
            Err(_) => return Err(ReadError::Stalled(between_chunks)),
        }
    }
    Ok(assembler.finish()?)
}
