//! The OpenAI routes: pick a worker, forward the request, relay the answer
//! (SSE chunks as they arrive), and migrate to another worker when one
//! refuses at its hard cap.

use std::borrow::Cow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use axum::Extension;
use futures_util::{Stream, StreamExt as _};
use tokio::time::Instant;

use loadgate::{
    metrics::{Endpoint, Reason},
    rejection::{REFUSAL_AT_CAPACITY, REFUSAL_HEADER},
    Migration, RouteError, WorkerId,
};

use crate::chunk_timeout::{self, Chunk, ChunkTimeout};
use crate::directory::WorkerAddress;
use crate::engines::assemble::{self, ReadError};
use crate::frontend::inflight::Held;
use crate::frontend::observe::{ModelLabel, RequestId, REQUEST_ID_HEADER};
use crate::frontend::reply;
use crate::frontend::request::read_head;
use crate::frontend::state::Frontend;
use crate::frontend::upstream::Failure;
use crate::openai::InvalidRequest;
use crate::secret::{body_digest, BodyDigest};
use crate::upstream_client;
use loadgate::engines::{Assembled, CompletionRoute};

/// Largest worker error body the frontend reads to relay.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// `POST /v1/completions`.
pub async fn completions(
    State(frontend): State<Arc<Frontend>>,
    id: Option<Extension<RequestId>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    receive(frontend, Endpoint::Completions, id.map(|Extension(id)| id), headers, body).await
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(frontend): State<Arc<Frontend>>,
    id: Option<Extension<RequestId>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    receive(frontend, Endpoint::ChatCompletions, id.map(|Extension(id)| id), headers, body).await
}

/// Reads the body within `--http-body-limit-mb` and `--http-body-budget-mb`
/// (the body's reservation lasts as long as the body), then proxies it.
/// The request id (set by the observe layer) goes on to the worker.
async fn receive(
    frontend: Arc<Frontend>,
    endpoint: Endpoint,
    id: Option<RequestId>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    // Shutting down: no new work (a kept-alive connection may still carry
    // one request during the drain); the client retries elsewhere.
    if frontend.draining() {
        return frontend.unavailable();
    }
    match frontend.bodies.read(&headers, body).await {
        Ok(body) => proxy(frontend, endpoint, id, body).await,
        Err(refusal) => refusal,
    }
}

fn path(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Completions => "/v1/completions",
        Endpoint::ChatCompletions => "/v1/chat/completions",
    }
}

/// Why workers were excluded from this request so far.
#[derive(Default)]
struct Exclusions {
    /// Some worker refused at its hard cap.
    at_capacity: bool,
    /// Workers that gave no usable answer to this request.
    unreachable: Vec<WorkerId>,
    /// The last such failure.
    last_failure: Option<Failure>,
}

impl Exclusions {
    /// The last failure, if it was a timeout.
    fn timed_out(&self) -> Option<Failure> {
        self.last_failure.filter(|f| f.is_timeout())
    }

    /// The router's exclusions: the workers that refused or failed this
    /// request, and those out of routing now (silent or quarantined).
    /// Borrowed, without allocating, in the common case.
    fn for_router<'a>(&self, migration: &'a Migration, out_of_routing: &[WorkerId]) -> Cow<'a, [WorkerId]> {
        if self.unreachable.is_empty() && out_of_routing.is_empty() {
            return Cow::Borrowed(migration.refusals());
        }
        let mut all = migration.refusals().to_vec();
        all.extend(self.unreachable.iter().chain(out_of_routing).filter(|w| !migration.refusals().contains(w)));
        Cow::Owned(all)
    }
}

/// Bodies above this are read (and hashed) on tokio's blocking pool: a scan
/// of a body of 150 MB takes long enough to stall the runtime thread it runs
/// on.
const INLINE_READ_LIMIT: usize = 1024 * 1024;

async fn proxy(frontend: Arc<Frontend>, endpoint: Endpoint, id: Option<RequestId>, body: Bytes) -> Response {
    let tracking = frontend.inflight.tracking();
    let head = if body.len() <= INLINE_READ_LIMIT {
        read_head(endpoint, &body, tracking)
    } else {
        let shared = body.clone();
        tokio::task::spawn_blocking(move || read_head(endpoint, &shared, tracking))
            .await
            .unwrap_or_else(|e| Err(InvalidRequest::body(format!("could not read the request: {e}"))))
    };
    let (model, prompt) = match head {
        Ok(head) => (head.model, head.prompt_tokens),
        Err(message) => return reply::bad_request(&message),
    };
    let request = Outgoing { endpoint, prompt, body: &body, id: id.as_ref(), streamed: Default::default() };
    let mut response = route_and_send(&frontend, &model, &request).await;
    response.extensions_mut().insert(ModelLabel(Arc::from(model.as_str())));
    response
}

/// Routes the request and sends it, migrating on refusals and failures,
/// until a worker answers or none is left.
/// What is sent to a worker, the same for every attempt.
struct Outgoing<'a> {
    endpoint: Endpoint,
    /// Prompt tokens (for the router's own tracking).
    prompt: u64,
    body: &'a Bytes,
    id: Option<&'a RequestId>,
    /// The body as a streamed request, for engines that assemble
    /// (`engines/assemble.rs`): rewritten at the first such attempt.
    streamed: tokio::sync::OnceCell<Option<Bytes>>,
}

impl Outgoing<'_> {
    /// The body to send `address`, and the route to assemble its answer on
    /// when it is sent streamed.
    async fn body_for(&self, address: &WorkerAddress) -> (Bytes, Option<CompletionRoute>) {
        if address.assembles {
            if let Some(streamed) = self.streamed.get_or_init(|| assemble::streamed_body(self.body)).await {
                let route = match self.endpoint {
                    Endpoint::Completions => CompletionRoute::Completions,
                    Endpoint::ChatCompletions => CompletionRoute::ChatCompletions,
                };
                return (streamed.clone(), Some(route));
            }
        }
        (self.body.clone(), None)
    }
}

async fn route_and_send(frontend: &Arc<Frontend>, model: &str, request: &Outgoing<'_>) -> Response {
    let endpoint = request.endpoint;
    // The request proof vouches for the body: hashed at the first dispatch
    // (a shed request is never hashed), once for every attempt.
    let mut digest = None;
    let mut migration = Migration::new(frontend.migration_limit);
    let mut excluded = Exclusions::default();
    loop {
        let out_of_routing = frontend.directory.out_of_routing();
        let exclude = excluded.for_router(&migration, &out_of_routing);
        let worker = match frontend.router.route(model, &exclude) {
            Ok(worker) => worker,
            Err(RouteError::Overloaded) => {
                return no_worker_left(frontend, endpoint, model, &migration, &excluded, &out_of_routing)
            }
            Err(error) => return route_error(frontend, model, error, &excluded),
        };
        drop(exclude);
        let digest = match digest {
            Some(digest) => digest,
            None => *digest.insert(signing_digest(frontend, request.body).await),
        };
        match dispatch(frontend, worker, request, &digest).await {
            Attempt::Answer(response) => return response,
            Attempt::AtCapacity => {
                tracing::debug!(worker, %model, "worker at capacity; migrating");
                excluded.at_capacity = true;
                if !migration.refused(worker) {
                    return frontend.reject_overloaded(model, endpoint, [Reason::WorkerCapacity]);
                }
            }
            Attempt::Failed(failure) => {
                frontend.upstream_stats.record(failure);
                match failure {
                    // The worker took the request: it is not run again elsewhere.
                    Failure::FirstByte => return failed_answer(failure),
                    Failure::OutOfDescriptors => return frontend.unavailable(),
                    _ => {}
                }
                frontend.directory.quarantine(worker);
                excluded.unreachable.push(worker);
                excluded.last_failure = Some(failure);
                if excluded.unreachable.len() > frontend.migration_limit.max(1) {
                    return failed_answer(failure);
                }
            }
        }
    }
}

/// The answer to a route error other than overloaded. A worker that timed
/// out on this request and has left since: the client learns of the timeout.
fn route_error(frontend: &Frontend, model: &str, error: RouteError, excluded: &Exclusions) -> Response {
    if let Some(failure) = excluded.timed_out() {
        return failed_answer(failure);
    }
    match error {
        // With no worker registered at all, the model may well exist: unavailable.
        RouteError::UnknownModel if !frontend.directory.is_empty() => reply::unknown_model(model),
        _ => frontend.unavailable(),
    }
}

/// The router found no eligible worker left for this request. Busy workers,
/// or workers that refused it at their cap, are alive: the overload status.
/// When every worker of the model failed or is out of routing: 504 if the
/// last failure was a timeout, else 503 Unavailable.
fn no_worker_left(
    frontend: &Frontend,
    endpoint: Endpoint,
    model: &str,
    migration: &Migration,
    excluded: &Exclusions,
    out_of_routing: &[WorkerId],
) -> Response {
    // The router found instances, so with nothing failed or out of routing
    // some are alive: the common shed path skips the lookup (and its copy
    // of the instance list).
    let alive = (excluded.unreachable.is_empty() && out_of_routing.is_empty()) || {
        let ids = frontend.monitor.busy_set(model).map(|(ids, _)| ids).unwrap_or_default();
        ids.iter().any(|id| !excluded.unreachable.contains(id) && !out_of_routing.contains(id))
    };
    if !alive {
        return excluded.timed_out().map_or_else(|| frontend.unavailable(), failed_answer);
    }
    // Every worker left free had refused this request already.
    let excluded_free = (!migration.refusals().is_empty()).then_some(Reason::Excluded);
    let capacity = excluded.at_capacity.then_some(Reason::WorkerCapacity);
    frontend.reject_overloaded(model, endpoint, excluded_free.into_iter().chain(capacity))
}

/// The answer after the last worker tried failed: 504 for a timeout, else 502.
fn failed_answer(failure: Failure) -> Response {
    if failure.is_timeout() {
        reply::gateway_timeout("the worker did not answer in time")
    } else {
        reply::bad_gateway("worker unreachable")
    }
}

/// The digest the request proof vouches for (unused without a secret), on
/// the blocking pool for big bodies.
async fn signing_digest(frontend: &Frontend, body: &Bytes) -> BodyDigest {
    if frontend.secrets.is_none() {
        return BodyDigest::default();
    }
    if body.len() <= INLINE_READ_LIMIT {
        return body_digest(body);
    }
    let shared = body.clone();
    match tokio::task::spawn_blocking(move || body_digest(&shared)).await {
        Ok(digest) => digest,
        // The blocking pool is shutting down; hashing here is still right.
        Err(_) => body_digest(body),
    }
}

/// The outcome of sending a request to one worker.
enum Attempt {
    /// Relay this to the client (a success stream or a worker's own error).
    Answer(Response),
    /// The worker refused at its hard cap: migratable.
    AtCapacity,
    /// No usable answer, nothing relayed yet: migratable.
    Failed(Failure),
}

/// How a failed `send` is classified.
fn send_failure(error: &reqwest::Error) -> Failure {
    if out_of_descriptors(error) {
        return Failure::OutOfDescriptors;
    }
    match (error.is_connect(), error.is_timeout()) {
        (true, true) => Failure::ConnectTimeout,
        (true, false) => Failure::Connect,
        _ => Failure::Broken,
    }
}

/// The error comes from the frontend running out of file descriptors
/// (EMFILE, ENFILE somewhere in its chain of sources).
fn out_of_descriptors(error: &(dyn std::error::Error + 'static)) -> bool {
    const EMFILE: i32 = 24;
    const ENFILE: i32 = 23;
    let mut next = Some(error);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
            .is_some_and(|c| c == EMFILE || c == ENFILE)
        {
            return true;
        }
        next = e.source();
    }
    false
}

async fn dispatch(frontend: &Arc<Frontend>, worker: WorkerId, outgoing: &Outgoing<'_>, digest: &BodyDigest) -> Attempt {
    let endpoint = outgoing.endpoint;
    let Some(address) = frontend.directory.get(worker) else {
        return Attempt::Failed(Failure::Gone);
    };
    let timeouts = frontend.upstream;
    let first_byte_by = Instant::now() + timeouts.first_byte;
    let mut held = frontend.inflight.hold(worker, &address, outgoing.prompt);
    let url = format!("{}{}", address.base_url, path(endpoint));
    let (body, whole) = outgoing.body_for(&address).await;
    let mut request = frontend.client.post(url).header(header::CONTENT_TYPE, "application/json").body(body);
    if let Some(id) = outgoing.id {
        // Not covered by the request proof (method, path, body): harmless.
        request = request.header(REQUEST_ID_HEADER, id.header_value().clone());
    }
    // An engine gets no request proof: it would not check it, and a proof
    // must not travel to a peer that is not a loadgate worker.
    if address.assembles {
        // llama.cpp, the one engine whose answers are assembled.
        request = upstream_client::on_own_connection(request);
    }
    if !address.engine {
        request = frontend.signed(request, "POST", path(endpoint), digest);
    }
    let sent = tokio::time::timeout_at(first_byte_by, request.send());
    let upstream = match sent.await {
        Ok(Ok(upstream)) => upstream,
        Ok(Err(error)) => {
            let failure = send_failure(&error);
            tracing::warn!(worker, %error, kind = failure.label(), "worker request failed; migrating");
            return Attempt::Failed(failure);
        }
        Err(_) => {
            tracing::warn!(worker, timeout = ?timeouts.first_byte, "no answer from the worker in time");
            return Attempt::Failed(Failure::FirstByte);
        }
    };
    // A refusal is recognised by the worker's explicit signal alone, whatever
    // its status (an overload status of 200 included) and its body. Workers
    // and `--engine` engines are the only peers the frontend sends to, so
    // the signal comes from a registered one; the frontend builds its own response headers, so it
    // never reaches the client.
    if upstream.headers().get(REFUSAL_HEADER).is_some_and(|v| v.as_bytes() == REFUSAL_AT_CAPACITY.as_bytes()) {
        return Attempt::AtCapacity;
    }
    let status = StatusCode::from_u16(upstream.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let content_type = upstream.headers().get(header::CONTENT_TYPE).cloned();
    // A worker's own retry hint on an error it answers (a 429, a 503).
    let retry_hints: Vec<_> = [header::RETRY_AFTER, header::HeaderName::from_static(reply::RETRY_AFTER_MS)]
        .into_iter()
        .filter_map(|name| upstream.headers().get(&name).cloned().map(|value| (name, value)))
        .collect();
    let mut response = if status.is_success() {
        // The first bytes are awaited here, so that a worker that sends its
        // head but no token can still be migrated away from.
        let mut stream: Upstream = Box::pin(upstream.bytes_stream());
        let first = match tokio::time::timeout_at(first_byte_by, stream.next()).await {
            Ok(Some(Ok(chunk))) => Some(chunk),
            Ok(None) => None,
            Ok(Some(Err(error))) => {
                tracing::warn!(worker, %error, "worker stream failed before its first byte; migrating");
                return Attempt::Failed(Failure::Broken);
            }
            Err(_) => {
                tracing::warn!(worker, timeout = ?timeouts.first_byte, "no first byte from the worker in time");
                return Attempt::Failed(Failure::FirstByte);
            }
        };
        if let Some(chunk) = &first {
            held.on_chunk(chunk);
        }
        held.answered();
        if let Some(route) = whole.filter(|_| assemble::is_event_stream(content_type.as_ref())) {
            let between_chunks = timeouts.between_chunks;
            let answer = assemble::read_whole(route, first, stream, between_chunks, |c| held.on_chunk(c)).await;
            drop(held);
            return Attempt::Answer(whole_answer(frontend, worker, answer));
        }
        let relay = Relay {
            first,
            upstream: ChunkTimeout::new(stream, timeouts.between_chunks),
            held: Some(held),
            frontend: frontend.clone(),
        };
        Response::new(Body::from_stream(relay))
    } else {
        let error_body = match tokio::time::timeout(timeouts.between_chunks, read_bounded(upstream)).await {
            Ok(Ok(body)) => body,
            Ok(Err(error)) => {
                tracing::warn!(worker, %error, "reading a worker's error body failed");
                return Attempt::Failed(Failure::Broken);
            }
            Err(_) => return Attempt::Failed(Failure::BetweenChunks),
        };
        held.answered();
        drop(held);
        let mut response = Response::new(Body::from(error_body));
        response.headers_mut().extend(retry_hints);
        response
    };
    *response.status_mut() = status;
    if let Some(content_type) = content_type {
        response.headers_mut().insert(header::CONTENT_TYPE, content_type);
    }
    Attempt::Answer(response)
}

/// The client's answer from an engine stream assembled whole: the answer,
/// the engine's own error, or (the engine took the request: not migrated)
/// 504 when it stalled, else 502.
fn whole_answer(frontend: &Frontend, worker: WorkerId, answer: Result<Assembled, ReadError>) -> Response {
    let (status, body) = match answer {
        Ok(Assembled::Answer(body)) => (StatusCode::OK, body),
        Ok(Assembled::EngineError { status, body }) => {
            (StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), body)
        }
        Err(error) => {
            tracing::warn!(worker, %error, "the engine's stream could not be assembled");
            if let ReadError::Stalled(_) = error {
                frontend.upstream_stats.record(Failure::BetweenChunks);
                return reply::gateway_timeout("the worker stopped sending");
            }
            frontend.upstream_stats.record(Failure::Broken);
            return reply::bad_gateway("the engine's answer could not be read");
        }
    };
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    response
}

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

type Upstream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// A worker's response body on its way to the client, its first chunk
/// already read. Holds the request's [`Held`] until the stream ends, fails,
/// is cut for silence, or is dropped (client gone).
struct Relay {
    first: Option<Bytes>,
    upstream: ChunkTimeout<Upstream>,
    held: Option<Held>,
    frontend: Arc<Frontend>,
}

impl Stream for Relay {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(first)));
        }
        if this.held.is_none() {
            return Poll::Ready(None);
        }
        Poll::Ready(match ready!(this.upstream.poll_chunk(cx)) {
            Chunk::Data(chunk) => {
                if let Some(held) = this.held.as_mut() {
                    held.on_chunk(&chunk);
                }
                Some(Ok(chunk))
            }
            Chunk::Failed(error) => {
                if let Some(held) = this.held.take() {
                    tracing::warn!(worker = held.worker(), %error, "worker stream failed");
                }
                Some(Err(std::io::Error::other(error)))
            }
            Chunk::Ended => {
                this.held = None;
                None
            }
            Chunk::Stalled => {
                this.frontend.upstream_stats.record(Failure::BetweenChunks);
                if let Some(held) = this.held.take() {
                    tracing::warn!(
                        worker = held.worker(),
                        timeout = ?this.upstream.between(),
                        "worker sent nothing within the between-chunks timeout; response cut"
                    );
                }
                Some(Err(chunk_timeout::stalled("worker")))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use axum::extract::Request;
    use axum::response::IntoResponse as _;
    use axum::routing::post;
    use clap::Parser as _;
    use tokio::io::AsyncWriteExt as _;
    use tower::ServiceExt as _;

    use super::*;
    use crate::directory::WorkerDirectory;
    use crate::frontend::Args;
    use crate::secret::{unix_ms, Secrets, REQUEST_PROOF_HEADER};
    use loadgate::rejection::WORKER_AT_CAPACITY;
    use loadgate::{MonitorConfig, WorkerMonitor};

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    const SECRET: &[u8] = b"a proxy test secret, 16+";

    /// What a fake worker saw: the body's length and whether its proof held.
    type Seen = Arc<Mutex<Vec<(usize, bool)>>>;

    /// How a fake worker answers.
    #[derive(Clone, Copy)]
    enum Answer {
        /// 200 with a completion.
        Serve,
        /// A hard-cap refusal with this status and the refusal header.
        Refuse(u16),
        /// An error whose body says "worker at capacity", without the header.
        PhraseOnly,
    }

    /// A fake worker on 127.0.0.1 answering as `answer` says.
    async fn fake_worker(answer: Answer, seen: Seen) -> (String, tokio::task::JoinHandle<()>) {
        let secrets = Secrets::from_values(SECRET, None).unwrap();
        let handler = move |request: Request| {
            let seen = seen.clone();
            let secrets = secrets.clone();
            async move {
                let proof =
                    request.headers().get(REQUEST_PROOF_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
                let vouched =
                    proof.and_then(|p| secrets.verify_request_proof(&p, "POST", "/v1/completions", unix_ms()).ok());
                let body = axum::body::to_bytes(request.into_body(), usize::MAX).await.unwrap();
                let valid = vouched == Some(body_digest(&body));
                seen.lock().unwrap().push((body.len(), valid));
                let message = format!(r#"{{"error":{{"message":"{WORKER_AT_CAPACITY}","code":529}}}}"#);
                match answer {
                    Answer::Serve => (StatusCode::OK, r#"{"choices":[]}"#).into_response(),
                    Answer::Refuse(status) => {
                        let status = StatusCode::from_u16(status).unwrap();
                        (status, [(REFUSAL_HEADER, REFUSAL_AT_CAPACITY)], message).into_response()
                    }
                    Answer::PhraseOnly => (StatusCode::INTERNAL_SERVER_ERROR, message).into_response(),
                }
            }
        };
        let app = axum::Router::new().route("/v1/completions", post(handler));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (addr.to_string(), server)
    }

    fn frontend(flags: &[&str], secrets: Option<Arc<Secrets>>) -> Arc<Frontend> {
        let cli = Cli::parse_from(std::iter::once("frontend").chain(flags.iter().copied()));
        let monitor = Arc::new(WorkerMonitor::new(MonitorConfig::default()).unwrap());
        let directory = Arc::new(WorkerDirectory::default());
        Arc::new(Frontend::new(&cli.args, monitor, directory, secrets).unwrap())
    }

    fn completion(body: Vec<u8>) -> Request {
        Request::post("/v1/completions")
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CONTENT_LENGTH, body.len())
            .body(Body::from(body))
            .unwrap()
    }

    fn json_body(prompt_bytes: usize) -> Vec<u8> {
        format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(prompt_bytes)).into_bytes()
    }

    #[tokio::test]
    async fn a_migrated_body_is_sent_whole_with_a_proof_and_released_after() {
        let secrets = Arc::new(Secrets::from_values(SECRET, None).unwrap());
        let frontend = frontend(&["--router-mode", "round-robin"], Some(secrets));
        let seen: Seen = Arc::default();
        let (refusing, _a) = fake_worker(Answer::Refuse(529), seen.clone()).await;
        let (serving, _b) = fake_worker(Answer::Serve, seen.clone()).await;
        frontend.monitor.register(1, "m", 1, 0).unwrap();
        frontend.monitor.register(2, "m", 1, 0).unwrap();
        frontend.directory.insert(1, &refusing, 1);
        frontend.directory.insert(2, &serving, 1);
        let body = json_body(3 << 20);
        let len = body.len();
        let app = crate::frontend::app(frontend.clone());
        let response = app.oneshot(completion(body)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        // Round robin sent it to the refusing worker first, then migrated.
        assert_eq!(*seen.lock().unwrap(), [(len, true), (len, true)]);
        let answer = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        assert_eq!(&answer[..], br#"{"choices":[]}"#);
        // The reservation went with the last copy of the body (the HTTP
        // client's may outlive the answer by a moment).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while frontend.bodies.used() != 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(frontend.bodies.used(), 0);
    }

    /// A refusal is the worker's header, not its status or its text: a
    /// refusal with status 200 migrates (and never reaches the client as a
    /// completion), an error that only says "worker at capacity" is relayed.
    #[tokio::test]
    async fn a_refusal_is_recognised_by_its_header_alone() {
        for (first, status, relayed) in [
            (Answer::Refuse(200), StatusCode::OK, &br#"{"choices":[]}"#[..]),
            (Answer::Refuse(529), StatusCode::OK, &br#"{"choices":[]}"#[..]),
            (Answer::PhraseOnly, StatusCode::INTERNAL_SERVER_ERROR, WORKER_AT_CAPACITY.as_bytes()),
        ] {
            let frontend = frontend(&["--router-mode", "round-robin"], None);
            let seen: Seen = Arc::default();
            let (a, _a) = fake_worker(first, seen.clone()).await;
            let (b, _b) = fake_worker(Answer::Serve, seen.clone()).await;
            frontend.monitor.register(1, "m", 1, 0).unwrap();
            frontend.monitor.register(2, "m", 1, 0).unwrap();
            frontend.directory.insert(1, &a, 1);
            frontend.directory.insert(2, &b, 1);
            let app = crate::frontend::app(frontend.clone());
            let response = app.oneshot(completion(json_body(10))).await.unwrap();
            assert_eq!(response.status(), status);
            assert!(response.headers().get(REFUSAL_HEADER).is_none(), "the signal is stripped");
            let answer = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
            assert!(answer.windows(relayed.len()).any(|w| w == relayed), "{answer:?}");
        }
    }

    #[tokio::test]
    async fn bodies_past_the_limit_or_the_budget_are_refused_before_routing() {
        let frontend = frontend(&["--http-body-limit-mb", "1", "--http-body-budget-mb", "1"], None);
        frontend.monitor.add_model("m");
        let app = crate::frontend::app(frontend.clone());
        let too_large = app.clone().oneshot(completion(json_body(1 << 20))).await.unwrap();
        assert_eq!(too_large.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(too_large.headers()[header::CONNECTION], "close");
        // Within the limit, the body is read and routed (no worker: 503 Unavailable).
        let fits = app.clone().oneshot(completion(json_body(1000))).await.unwrap();
        assert_eq!(fits.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(fits.headers().get(header::CONNECTION).is_none(), "a routing 503 keeps the connection");
        // With the budget held by another body, the next is refused unread.
        let held = frontend.bodies.read(&HeaderMap::new(), Body::from(vec![b' '; 1 << 20])).await.unwrap();
        let over = app.clone().oneshot(completion(json_body(10))).await.unwrap();
        assert_eq!(over.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(over.headers()[header::CONNECTION], "close");
        drop(held);
        assert_eq!(frontend.bodies.used(), 0);
        let invalid = app.oneshot(completion(b"[1]".to_vec())).await.unwrap();
        assert_eq!(invalid.status(), StatusCode::BAD_REQUEST);
        assert_eq!(frontend.bodies.used(), 0);
    }

    /// Waits (bounded) until `frontend`'s budget shows `bytes` in use.
    async fn wait_used(frontend: &Frontend, bytes: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while frontend.bodies.used() != bytes && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(frontend.bodies.used(), bytes);
    }

    #[tokio::test]
    async fn a_client_that_disconnects_mid_body_gives_its_reservation_back() {
        let frontend = frontend(&[], None);
        frontend.monitor.add_model("m");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = crate::frontend::app(frontend.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let declared = 4 << 20;
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
        );
        client.write_all(head.as_bytes()).await.unwrap();
        client.write_all(&vec![b' '; 1 << 20]).await.unwrap();
        // Reserved as the bytes arrive: 1 MiB of 4 sent, 1 to 2 MiB reserved.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while frontend.bodies.used() < 1 << 20 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let used = frontend.bodies.used();
        assert!((1 << 20..=2 << 20).contains(&used), "{used} bytes reserved for 1 MiB of {declared}");
        drop(client);
        wait_used(&frontend, 0).await;
        server.abort();
    }
}
