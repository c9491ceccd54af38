//! The OpenAI routes: pick a worker, forward the request, relay the answer
//! (SSE chunks as they arrive), and migrate to another worker when one
//! refuses at its hard cap.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use axum::Extension;

use loadgate::engines::CompletionRoute;
use loadgate::{
    metrics::{Endpoint, Reason},
    Class, Migration, RouteError, Tenant, Ticket, WaitError, WorkerId,
};

use crate::directory::WorkerAddress;
use crate::frontend::caller::Caller;
use crate::frontend::engine_priority::{Ceiling, Unreadable};
use crate::frontend::inflight::Held;
use crate::frontend::line::wait_in_line;
use crate::frontend::observe::{Labels, RequestId, REQUEST_ID_HEADER};
use crate::frontend::reply::{self, RejectedReasons};
use crate::frontend::state::Frontend;
use crate::openai::request::{read_head, Reading};
use crate::openai::{InvalidRequest, SERVER_ERROR};
use crate::secret::{body_digest, BodyDigest, ProofTarget};
use crate::throttle::LogThrottle;
use crate::upstream::{self, Failure, Outcome, Payload, Peer, Watcher};

/// `POST /v1/completions`.
pub async fn completions(
    State(frontend): State<Arc<Frontend>>,
    id: Option<Extension<RequestId>>,
    labels: Option<Extension<Labels>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (id, labels) = (id.map(|Extension(id)| id), labels.map(|Extension(l)| l).unwrap_or_default());
    receive(frontend, Endpoint::Completions, id, labels, headers, body).await
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(frontend): State<Arc<Frontend>>,
    id: Option<Extension<RequestId>>,
    labels: Option<Extension<Labels>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (id, labels) = (id.map(|Extension(id)| id), labels.map(|Extension(l)| l).unwrap_or_default());
    receive(frontend, Endpoint::ChatCompletions, id, labels, headers, body).await
}

/// Reads the body within `--http-body-limit-mb` and `--http-body-budget-mb`
/// (the body's reservation lasts as long as the body), then proxies it.
/// The request id (set by the observe layer) goes on to the worker;
/// `labels` (the layer's too) learn the request's tenant at once, so that
/// every answer, refusals of the body included, counts for it.
async fn receive(
    frontend: Arc<Frontend>,
    endpoint: Endpoint,
    id: Option<RequestId>,
    labels: Labels,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let caller = frontend.callers.of(&headers);
    labels.set_tenant(caller.label.clone());
    // Shutting down: no new work (a kept-alive connection may still carry
    // one request during the drain); the client retries elsewhere.
    if frontend.draining() {
        return frontend.unavailable();
    }
    let class = match frontend.priority.header_class(&headers) {
        Ok(class) => class,
        Err(message) => return reply::bad_request(&message),
    };
    match frontend.bodies.read(&headers, body).await {
        Ok(body) => proxy(frontend, endpoint, id, Asked { class, caller, labels }, body).await,
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
    /// request (those out of routing for every request, silent or
    /// quarantined, are skipped by the router itself: the directory
    /// publishes them in the monitor's views). Borrowed, without
    /// allocating, in the common case.
    fn for_router<'a>(&self, migration: &'a Migration) -> Cow<'a, [WorkerId]> {
        if self.unreachable.is_empty() {
            return Cow::Borrowed(migration.refusals());
        }
        let mut all = migration.refusals().to_vec();
        all.extend(self.unreachable.iter().filter(|w| !migration.refusals().contains(w)));
        Cow::Owned(all)
    }
}

/// Warn lines about workers refusing request proofs.
static PROOF_REFUSALS: LogThrottle = LogThrottle::per_second(1);

/// Bodies above this are read (and hashed) on tokio's blocking pool: a scan
/// of a body of 150 MB takes long enough to stall the runtime thread it runs
/// on.
const INLINE_READ_LIMIT: usize = 1024 * 1024;

/// What a request's headers claim: its class (`None`: not given or not
/// honoured) and its caller; and the labels the observe layer reads.
struct Asked {
    class: Option<Class>,
    caller: Caller,
    labels: Labels,
}

async fn proxy(
    frontend: Arc<Frontend>,
    endpoint: Endpoint,
    id: Option<RequestId>,
    asked: Asked,
    body: Bytes,
) -> Response {
    let Asked { class: header_class, caller, labels } = asked;
    // The body's priority counts only without the header. The prompt is
    // counted for the router's tracking, for the line's token bounds, and
    // whenever a line may hold the request (its gauge of tokens waiting).
    let reading = Reading {
        prompt: frontend.inflight.tracking() || frontend.line_counts_tokens || frontend.queue.ever_lined(),
        nvext_priority: header_class.is_none() && frontend.priority.reads_nvext(),
    };
    let head = if body.len() <= INLINE_READ_LIMIT {
        read_head(endpoint, &body, reading)
    } else {
        let shared = body.clone();
        tokio::task::spawn_blocking(move || read_head(endpoint, &shared, reading))
            .await
            .unwrap_or_else(|e| Err(InvalidRequest::body(format!("could not read the request: {e}"))))
    };
    let (model, prompt, priority, engine_priority) = match head {
        Ok(head) => (head.model, head.prompt_tokens, head.priority, head.engine_priority),
        Err(message) => return reply::bad_request(&message),
    };
    let class = caller.cap(header_class.unwrap_or_else(|| frontend.priority.nvext_class(priority)));
    labels.set_request(&model, class);
    // No priority the engine reads above the request's class.
    let body = match Ceiling::for_request(&frontend.priority, class).filter(|_| engine_priority) {
        Some(ceiling) => match hold_priorities(&frontend, ceiling, body).await {
            Ok(body) => body,
            Err(refusal) => return refusal,
        },
        None => body,
    };
    let route = match endpoint {
        Endpoint::Completions => CompletionRoute::Completions,
        Endpoint::ChatCompletions => CompletionRoute::ChatCompletions,
    };
    let payload = Payload::new(route, body, frontend.bodies.clone());
    let request = Outgoing { endpoint, prompt, payload, id: id.as_ref(), class, tenant: caller.tenant };
    route_and_send(&frontend, &model, &request, &labels).await
}

/// `body` with the priorities its engine reads held to `ceiling`: as it
/// came, or a copy counted in the body budget before it is made.
async fn hold_priorities(frontend: &Frontend, ceiling: Ceiling, body: Bytes) -> Result<Bytes, Response> {
    let edits = if body.len() <= INLINE_READ_LIMIT {
        ceiling.edits(&body)
    } else {
        let shared = body.clone();
        tokio::task::spawn_blocking(move || ceiling.edits(&shared))
            .await
            .unwrap_or_else(|e| Err(Unreadable(format!("could not read the request: {e}"))))
    };
    match edits {
        Ok(edits) if edits.is_empty() => Ok(body),
        Ok(edits) => frontend
            .bodies
            .adopt_built(edits.len_of(&body), |out| edits.apply(&body, out))
            .ok_or_else(|| frontend.bodies.over_budget()),
        Err(Unreadable(message)) => Err(reply::bad_request(&message)),
    }
}

/// What is sent to a worker, the same for every attempt.
struct Outgoing<'a> {
    endpoint: Endpoint,
    /// Prompt tokens (for the router's own tracking).
    prompt: u64,
    payload: Payload,
    id: Option<&'a RequestId>,
    /// Its priority class (the line's order and timeout).
    class: Class,
    /// Its tenant (the line's turns and caps).
    tenant: Tenant,
}

impl Outgoing<'_> {
    /// Whether another worker may still be sent the request: the payload
    /// holds its body. A worker that refused it (or did not take it) after
    /// holding the whole body for the release grace has had it let go; the
    /// request ends with that worker's answer, as with no worker left.
    fn movable(&self) -> bool {
        self.payload.body().is_some()
    }
}

/// Routes the request and sends it, migrating on refusals and failures,
/// until a worker answers or none is left.
/// `labels` add up the time spent in the model's waiting line.
async fn route_and_send(frontend: &Arc<Frontend>, model: &str, request: &Outgoing<'_>, labels: &Labels) -> Response {
    let endpoint = request.endpoint;
    // The request proof vouches for the body: hashed at the first dispatch
    // (a shed request is never hashed), once for every attempt.
    let mut digest = None;
    let mut migration = Migration::new(frontend.migration_limit);
    let mut excluded = Exclusions::default();
    // The waiting line, if the model has one: the request may wait until
    // this deadline (however many workers it tries) for a worker to free.
    let line = frontend.queue.timeout(model, request.class).map(|timeout| Instant::now() + timeout);
    // Its time in the line, however many times it waits: one sample.
    let mut line_time = frontend.queue.time();
    loop {
        let exclude = excluded.for_router(&migration);
        // Only a request no worker refused at its cap waits: no publication
        // would wake it (the worker that refused is not busy).
        let wait_until = line.filter(|_| migration.refusals().is_empty());
        let (worker, taken) = match wait_until {
            Some(deadline) => {
                let ticket =
                    Ticket::new(request.prompt, deadline).with_class(request.class).with_tenant(request.tenant);
                let turn = frontend.routing_turn.as_ref();
                let take = |worker| take(frontend, worker, request.prompt);
                labels.wait_begins();
                let began = Instant::now();
                let (routed, took) = tokio::select! {
                    // The wait first: one routed at once never looks at the
                    // drain (no registration with its `Notify`).
                    biased;
                    waited = wait_in_line(&frontend.router, &mut line_time, model, &exclude, ticket, turn, take) => {
                        waited
                    }
                    // Shutting down: no new work starts, so a request still
                    // waiting leaves the line as if no worker were left (503).
                    () = frontend.drain_begun() => (Err(WaitError::Unavailable), began.elapsed()),
                };
                labels.wait_ends(took);
                match routed {
                    Ok(taken) => taken,
                    Err(WaitError::UnknownModel) => {
                        return route_error(frontend, model, RouteError::UnknownModel, &excluded)
                    }
                    Err(WaitError::Unavailable) => {
                        return route_error(frontend, model, RouteError::Unavailable, &excluded)
                    }
                    // Deadline or a full line.
                    Err(reason) => return refused_from_line(frontend, request, model, reason),
                }
            }
            None => {
                let routed = {
                    // Routed and tracked in one turn, with the fleet lease
                    // (see `Frontend::routing_turn`); the refusal is built
                    // after it.
                    let _turn =
                        frontend.routing_turn.as_ref().map(|turn| turn.lock().unwrap_or_else(|e| e.into_inner()));
                    // No worker ahead of the model's waiters (a class
                    // with no line, or a request a worker refused at its
                    // cap): as if every worker were busy.
                    let routed = frontend.router.route_class_behind_line(model, &exclude, request.class);
                    routed.map(|worker| (worker, take(frontend, worker, request.prompt)))
                };
                match routed {
                    Ok(taken) => taken,
                    Err(RouteError::Overloaded) => {
                        return no_worker_left(frontend, request, model, &migration, &excluded)
                    }
                    Err(error) => return route_error(frontend, model, error, &excluded),
                }
            }
        };
        drop(exclude);
        let digest = match digest {
            Some(digest) => digest,
            None => match request.payload.body() {
                Some(body) => *digest.insert(signing_digest(frontend, &body).await),
                // Only let go after a worker took it, which ends the loop.
                None => return reply::openai_error(StatusCode::BAD_GATEWAY, SERVER_ERROR, "worker unreachable"),
            },
        };
        match dispatch(frontend, worker, taken, request, &digest).await {
            Outcome::Answer(response) => {
                frontend.directory.proof_accepted(worker);
                return response;
            }
            // The frontend's problem, not the client's: another worker may
            // take it, and this one leaves routing for a while.
            Outcome::ProofRefused => {
                frontend.upstream_stats.record(Failure::Proof);
                let out_for = frontend.directory.proof_refused(worker);
                if let Some(suppressed) = PROOF_REFUSALS.admit() {
                    tracing::warn!(
                        worker,
                        ?out_for,
                        suppressed,
                        "the worker refused the request proof (its clock is off past its --proof-window-secs, \
                         or it lacks the current event secret); out of routing for now"
                    );
                }
                excluded.unreachable.push(worker);
                excluded.last_failure = Some(Failure::Proof);
                if excluded.unreachable.len() > frontend.migration_limit.max(1) || !request.movable() {
                    return frontend.unavailable();
                }
            }
            Outcome::AtCapacity => {
                tracing::debug!(worker, ?model, "worker at capacity; migrating");
                excluded.at_capacity = true;
                if !migration.refused(worker) || !request.movable() {
                    return frontend.reject_overloaded(model, endpoint, request.class, [Reason::WorkerCapacity]);
                }
            }
            // The worker took the request: it is not run again elsewhere.
            Outcome::Cut(failure) => {
                frontend.upstream_stats.record(failure);
                return failed_answer(failure);
            }
            Outcome::Failed(failure) => {
                frontend.upstream_stats.record(failure);
                // The frontend's own limits: not the worker's fault.
                if matches!(failure, Failure::OutOfDescriptors | Failure::OverBudget) {
                    return frontend.unavailable();
                }
                frontend.directory.quarantine(worker);
                excluded.unreachable.push(worker);
                excluded.last_failure = Some(failure);
                if excluded.unreachable.len() > frontend.migration_limit.max(1) || !request.movable() {
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

/// The router found no eligible worker left for this request, and some in
/// routing (with every one out of routing it answers Unavailable). Busy
/// workers, or workers that refused it at their cap, are alive: the
/// overload status. When every worker in routing failed this request: 504
/// if the last failure was a timeout, else 503 Unavailable.
fn no_worker_left(
    frontend: &Frontend,
    request: &Outgoing<'_>,
    model: &str,
    migration: &Migration,
    excluded: &Exclusions,
) -> Response {
    // With nothing failed, the workers in routing the router found are
    // alive: the common shed path (all busy) reads nothing more. A request
    // whose own failures may have used them up scans the model once.
    let alive = excluded.unreachable.is_empty() || frontend.monitor.has_routable(model, &excluded.unreachable);
    if !alive {
        return excluded.timed_out().map_or_else(|| frontend.unavailable(), failed_answer);
    }
    // Every worker left free had refused this request already.
    let excluded_free = (!migration.refusals().is_empty()).then_some(Reason::Excluded);
    let capacity = excluded.at_capacity.then_some(Reason::WorkerCapacity);
    // A sheddable request is judged by the lowered thresholds.
    let headroom = (request.class == Class::Sheddable && frontend.router.sheddable_headroom() > 0.0)
        .then_some(Reason::SheddableHeadroom);
    let causes = excluded_free.into_iter().chain(capacity).chain(headroom);
    frontend.reject_overloaded(model, request.endpoint, request.class, causes)
}

/// The overload answer of a request the waiting line gave no worker: its
/// deadline passed, the line was full, a critical request took its place,
/// or its tenant held its cap. Counted under that reason alone (the busy signals that sent it
/// to the line were not what refused it).
fn refused_from_line(frontend: &Frontend, request: &Outgoing<'_>, model: &str, error: WaitError) -> Response {
    let reason = match error {
        WaitError::Deadline => Reason::Deadline,
        WaitError::ClassShed => Reason::ClassShed,
        WaitError::TenantCap => Reason::TenantCap,
        _ => Reason::QueueFull,
    };
    frontend.metrics.record_class(model, request.endpoint, request.class, [reason]);
    reply::overloaded(frontend.retry_after_waiting(frontend.waiting(model)), &RejectedReasons::collect([reason]))
}

/// The answer after the last worker tried failed: 504 for a timeout, else 502.
fn failed_answer(failure: Failure) -> Response {
    let message = match failure {
        Failure::BetweenChunks => "the worker stopped sending",
        _ if failure.is_timeout() => "the worker did not answer in time",
        _ => "worker unreachable",
    };
    reply::openai_error(failure.status(), SERVER_ERROR, message)
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

/// The routed `worker`'s address and the load the router tracks for it
/// from now on (`None`: it has left the directory).
fn take(frontend: &Arc<Frontend>, worker: WorkerId, prompt: u64) -> Option<(WorkerAddress, Held)> {
    let address = frontend.directory.get(worker)?;
    let held = frontend.inflight.hold(worker, &address, prompt);
    Some((address, held))
}

/// Sends the request to `worker` (one attempt, `upstream/`), holding the
/// load the router tracks for it (`taken`) until the worker's answer has
/// been read.
async fn dispatch(
    frontend: &Arc<Frontend>,
    worker: WorkerId,
    taken: Option<(WorkerAddress, Held)>,
    outgoing: &Outgoing<'_>,
    digest: &BodyDigest,
) -> Outcome {
    let Some((address, held)) = taken else {
        return Outcome::Failed(Failure::Gone);
    };
    let path = path(outgoing.endpoint);
    let mut request =
        frontend.client.post(format!("{}{path}", address.base_url)).header(header::CONTENT_TYPE, "application/json");
    if let Some(id) = outgoing.id {
        // Not covered by the request proof (method, path, body): harmless.
        request = request.header(REQUEST_ID_HEADER, id.header_value().clone());
    }
    // An engine gets no request proof: it would not check it, and a proof
    // must not travel to a peer that is not a loadgate worker.
    if !address.engine {
        let target = ProofTarget { worker, incarnation: frontend.monitor.incarnation(worker).unwrap_or(0) };
        request = frontend.signed(request, "POST", path, digest, target);
    }
    let watcher = Dispatched { held, frontend: frontend.clone() };
    upstream::attempt(request, &outgoing.payload, address.assembles, frontend.upstream, Peer::Worker(worker), watcher)
        .await
}

/// What a dispatched request holds: the router's tracked load (released
/// when the worker's answer has been read, whether or not the client has
/// read it yet), and where its late failures are counted.
struct Dispatched {
    held: Held,
    frontend: Arc<Frontend>,
}

impl Watcher for Dispatched {
    fn answered(&mut self) {
        self.held.answered();
    }

    fn chunk(&mut self, chunk: &[u8]) {
        self.held.on_chunk(chunk);
    }

    fn failed(&mut self, failure: Failure) {
        self.frontend.upstream_stats.record(failure);
    }
}

#[cfg(test)]
mod tests;
