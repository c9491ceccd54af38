//! `GET`/`POST /busy_threshold`: read and change a model's busy thresholds
//! at run time. A change is applied (and every worker of the model
//! re-evaluated) before the reply is sent. Served on the admin listener
//! (`admin_app` in `mod.rs`), behind the bearer token when one is set, and
//! with `--admin-on-http-port` on the inference port instead, behind the
//! token it needs.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde_json::{json, Value};

use loadgate::patch::{
    parse_threshold_patch, Change, ThresholdPatch, DECODE_FIELD, PREFILL_FIELD, PREFILL_FRAC_FIELD,
    QUEUE_TIMEOUT_FIELD, WAITING_FIELD,
};
use loadgate::{monitor::SetThresholdsError, thresholds::Thresholds, Class, PerClass};

use crate::frontend::reply::plain_error;
use crate::frontend::state::Frontend;

/// Largest accepted `POST /busy_threshold` body.
pub const MAX_BODY: usize = 64 * 1024;

/// An oversized body up to this size is read to its end before the 413, so
/// the client gets the answer rather than a reset while it is still sending.
const DRAIN_LIMIT: usize = 1024 * 1024;

/// One model's thresholds as JSON (`null` where unset), and its waiting
/// line's timeout in ms (0: no line): one number when every class has it,
/// else an object by class.
pub fn thresholds_json(model: &str, thresholds: &Thresholds, queue_timeout_ms: PerClass<u64>) -> Value {
    let config = thresholds.to_config();
    let queue_timeout_ms = match queue_timeout_ms.uniform() {
        Some(ms) => json!(ms),
        None => {
            Value::Object(Class::ALL.iter().map(|c| (c.label().to_owned(), json!(queue_timeout_ms.get(*c)))).collect())
        }
    };
    json!({
        "model": model,
        DECODE_FIELD: config.active_decode_blocks_threshold,
        PREFILL_FIELD: config.active_prefill_tokens_threshold,
        PREFILL_FRAC_FIELD: config.active_prefill_tokens_threshold_frac,
        WAITING_FIELD: config.active_waiting_requests_threshold,
        QUEUE_TIMEOUT_FIELD: queue_timeout_ms,
    })
}

/// `GET /busy_threshold`: every known model's thresholds.
pub async fn read_all(State(frontend): State<Arc<Frontend>>) -> Response {
    // Not between the two halves of a change (`update`).
    let _changes = frontend.admin_changes.lock().unwrap_or_else(|e| e.into_inner());
    let all: Vec<Value> = frontend
        .monitor
        .all_thresholds()
        .iter()
        .map(|(m, t)| thresholds_json(m, t, frontend.queue.millis(m)))
        .collect();
    Json(json!({ "thresholds": all })).into_response()
}

/// `POST /busy_threshold`: `{"model":..., <fields>}`; a field absent is
/// unchanged, a number sets, `null` clears; no field reads. Replies with the
/// model's resulting thresholds. 415 unless the body is JSON, 413 above
/// [`MAX_BODY`], 400 for an invalid body or value, 404 for an unknown model.
pub async fn update(State(frontend): State<Arc<Frontend>>, headers: HeaderMap, body: Body) -> Response {
    if !is_json(&headers) {
        return plain_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json (curl: -H 'Content-Type: application/json')",
        );
    }
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    if declared.is_some_and(|n: usize| n > DRAIN_LIMIT) {
        return too_large();
    }
    let bytes = match read_limited(body, frontend.bodies.timeouts()).await {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return too_large(),
        Err(Unread::Broken(e)) => return plain_error(StatusCode::BAD_REQUEST, format!("could not read the body: {e}")),
        Err(Unread::Late) => {
            let (idle, deadline) = frontend.bodies.timeouts();
            let message = format!("the body paused over {idle:?} or took over {deadline:?}");
            return plain_error(StatusCode::REQUEST_TIMEOUT, message);
        }
    };
    let patch = match parse_threshold_patch(&bytes) {
        Ok(patch) => patch,
        Err(e) => return plain_error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    // The thresholds and the line's timeout change together, and the
    // reply shows them as this change left them: no other change or read
    // in between (`Frontend::admin_changes`).
    let _changes = frontend.admin_changes.lock().unwrap_or_else(|e| e.into_inner());
    let thresholds_only = ThresholdPatch { queue_timeout_ms: Change::Unchanged, ..patch.clone() };
    // Any change, the line's timeout alone too, goes through the monitor's
    // update, which keeps the model: what an operator set outlives the
    // model's last worker, and the model cannot be forgotten under the
    // timeout's change (its life, which the timeout is set for, stays).
    let result = if patch.is_read() {
        frontend.monitor.thresholds(&patch.model).ok_or_else(|| SetThresholdsError::UnknownModel(patch.model.clone()))
    } else {
        frontend.monitor.update_thresholds(&patch.model, |t| patch.apply(t))
    };
    match result {
        Ok(thresholds) => {
            if !thresholds_only.is_read() {
                tracing::info!(model = ?patch.model, ?thresholds, "busy thresholds changed");
            }
            match patch.queue_timeout_ms {
                Change::Unchanged => {}
                Change::Set(ms) => frontend.queue.set(&patch.model, Some(ms.map(Duration::from_millis))),
                Change::Clear => frontend.queue.set(&patch.model, None),
            }
            if patch.queue_timeout_ms != Change::Unchanged {
                let ms = frontend.queue.millis(&patch.model);
                tracing::info!(model = ?patch.model, router_queue_timeout_ms = %ms, "waiting line timeout changed");
            }
            Json(thresholds_json(&patch.model, &thresholds, frontend.queue.millis(&patch.model))).into_response()
        }
        Err(SetThresholdsError::UnknownModel(model)) => plain_error(
            StatusCode::NOT_FOUND,
            format!(
                "unknown model {model:?}: no worker serves it and it is not kept; start the frontend with \
                 --model {model} to keep it (then its thresholds can be set before any worker joins)"
            ),
        ),
        Err(e) => plain_error(StatusCode::BAD_REQUEST, e.to_string()),
    }
}

/// Why a body was not read.
enum Unread {
    /// The connection failed.
    Broken(axum::Error),
    /// It paused longer than the idle timeout, or took longer than the
    /// deadline (`--http-body-idle-timeout-secs`, `--http-body-timeout-secs`,
    /// as on the inference port).
    Late,
}

/// The body if it is at most [`MAX_BODY`]; `None` if larger (read on to
/// [`DRAIN_LIMIT`] and discarded, so the 413 reaches the client); within
/// the body timeouts `(idle, deadline)`.
async fn read_limited(body: Body, (idle, deadline): (Duration, Duration)) -> Result<Option<Vec<u8>>, Unread> {
    let deadline = tokio::time::Instant::now() + deadline;
    let mut stream = body.into_data_stream();
    let mut bytes = Vec::new();
    let mut total = 0usize;
    loop {
        let by = deadline.min(tokio::time::Instant::now() + idle);
        let Some(chunk) = tokio::time::timeout_at(by, stream.next()).await.map_err(|_| Unread::Late)? else { break };
        let chunk = chunk.map_err(Unread::Broken)?;
        total = total.saturating_add(chunk.len());
        if total <= MAX_BODY {
            bytes.extend_from_slice(&chunk);
        } else if total > DRAIN_LIMIT {
            break;
        }
    }
    Ok((total <= MAX_BODY).then_some(bytes))
}

fn too_large() -> Response {
    plain_error(StatusCode::PAYLOAD_TOO_LARGE, format!("body must be at most {MAX_BODY} bytes"))
}

/// `application/json`, with or without parameters (`; charset=utf-8`).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
}

#[cfg(test)]
mod tests {
    use axum::http::Request;
    use clap::Parser as _;
    use loadgate::{MonitorConfig, WorkerMonitor};
    use tower::ServiceExt as _;

    use super::*;
    use crate::directory::WorkerDirectory;
    use crate::frontend::{admin_app, Args};

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    /// A frontend (not serving) that keeps model `m`.
    fn frontend() -> Arc<Frontend> {
        let cli = Cli::parse_from(["frontend"]);
        let monitor = Arc::new(WorkerMonitor::new(MonitorConfig::default()).unwrap());
        monitor.add_model("m");
        let directory = Arc::new(WorkerDirectory::new(monitor.clone()));
        Arc::new(Frontend::new(&cli.args, monitor, directory, None).unwrap())
    }

    async fn post(app: axum::Router, body: Value) -> Value {
        let request = Request::post("/busy_threshold")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let response = app.oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let bytes = axum::body::to_bytes(response.into_body(), MAX_BODY).await.unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    /// Found by a review: a call that changes both a threshold and the
    /// line's timeout applied the two one after the other, so two such
    /// calls at once could leave one's threshold with the other's timeout:
    /// a state neither order of the calls gives. Now an admin change is
    /// applied whole before another starts: after each pair of calls run
    /// at once, the model holds all of the one or all of the other, and
    /// each reply shows its own call's change whole. (A race: before the
    /// fix one pair in 2000 to 20,000 showed it, so 30,000 pairs, a few
    /// seconds; after it, none can.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_changes_at_once_apply_each_whole() {
        let frontend = frontend();
        let app = admin_app(frontend.clone(), None);
        let a = json!({"model": "m", DECODE_FIELD: 0.5, QUEUE_TIMEOUT_FIELD: 100});
        let b = json!({"model": "m", DECODE_FIELD: null, QUEUE_TIMEOUT_FIELD: 7});
        let state = |v: &Value| (v[DECODE_FIELD].clone(), v[QUEUE_TIMEOUT_FIELD].clone());
        let (state_a, state_b) = ((json!(0.5), json!(100)), (json!(null), json!(7)));
        let mut mixed = Vec::new();
        for round in 0..30_000 {
            let (first, second) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
            let one = tokio::spawn(post(app.clone(), first.clone()));
            let two = tokio::spawn(post(app.clone(), second.clone()));
            let (one, two) = (one.await.unwrap(), two.await.unwrap());
            let now =
                state(&thresholds_json("m", &frontend.monitor.thresholds("m").unwrap(), frontend.queue.millis("m")));
            for reply in [&one, &two] {
                if state(reply) != state_a && state(reply) != state_b {
                    mixed.push(format!("round {round}: a reply {reply}"));
                }
            }
            if now != state_a && now != state_b {
                mixed.push(format!("round {round}: the model holds {now:?}"));
            }
        }
        assert!(mixed.is_empty(), "{} mixed states, first: {:?}", mixed.len(), mixed.first());
    }
}
