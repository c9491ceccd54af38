//! The worker's check of the frontend's request proof: with an event secret,
//! every route except `/health`, `/metrics` and `/info` needs a valid
//! [`REQUEST_PROOF_HEADER`] for its method, its path and this worker (its id
//! and incarnation), made within `--proof-window-secs` of now, with a nonce
//! this worker has not accepted before; else 401 with the refusal signal
//! `x-loadgate-refusal: proof-refused`, which tells a frontend to try
//! another worker rather than answer its client 401. So nobody reaches the
//! engine around the frontend's shedding and cap, and a proof seen on the
//! wire is good for one delivery to one worker. The proof also vouches for
//! the body's SHA-256: the body is hashed as it streams in and fails at its
//! end if it is not the body the frontend signed, so a proof seen on the
//! wire cannot carry another prompt.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::Frame;
use loadgate::rejection::REFUSAL_HEADER;
use sha2::{Digest as _, Sha256};

use super::nonces::{NonceRefusal, Nonces};
use crate::secret::{unix_ms, BodyDigest, ProofError, ProofTarget, Secrets, REFUSAL_PROOF, REQUEST_PROOF_HEADER};
use crate::throttle::LogThrottle;

/// Routes open without a proof: probes, scrapes, and the worker's identity.
const OPEN_PATHS: [&str; 3] = ["/health", "/metrics", "/info"];

/// Warn lines about a full nonce store.
static FULL: LogThrottle = LogThrottle::per_second(1);

/// What a worker checks request proofs against.
#[derive(Debug)]
pub(crate) struct ProofCheck {
    secrets: Arc<Secrets>,
    /// This worker, in this life.
    own: ProofTarget,
    /// `--proof-window-secs`, in ms.
    window_ms: u64,
    /// `--max-proof-nonces`.
    max_nonces: usize,
    nonces: Mutex<Nonces>,
}

impl ProofCheck {
    /// Checks proofs under `secrets` for `own`, within `window_ms`,
    /// remembering at most `max_nonces` nonces.
    pub(crate) fn new(secrets: Arc<Secrets>, own: ProofTarget, window_ms: u64, max_nonces: usize) -> Self {
        ProofCheck { secrets, own, window_ms, max_nonces, nonces: Mutex::new(Nonces::new(max_nonces)) }
    }

    /// The digest `value` vouches for, if it is a valid, unused proof for
    /// `METHOD PATH` at this worker; else why not.
    fn verify(&self, value: &str, method: &str, path: &str) -> Result<BodyDigest, &'static str> {
        let now = unix_ms();
        let vouched = self.secrets.verify_request_proof(value, method, path, self.own, now, self.window_ms).map_err(
            |e| match e {
                ProofError::Malformed => "malformed",
                ProofError::Expired => "expired (clock skew?)",
                ProofError::OtherWorker => "for another worker or incarnation",
                _ => "invalid",
            },
        )?;
        let forget_at = vouched.unix_ms.saturating_add(self.window_ms);
        let monotonic = std::time::Instant::now();
        let accepted =
            self.nonces.lock().unwrap_or_else(|e| e.into_inner()).accept(vouched.nonce, forget_at, now, monotonic);
        match accepted {
            Ok(()) => Ok(vouched.body),
            Err(NonceRefusal::Replayed) => Err("replayed"),
            Err(NonceRefusal::Full) => {
                if let Some(suppressed) = FULL.admit() {
                    tracing::warn!(
                        suppressed,
                        "request refused: {} request-proof nonces within the window are held \
                         (--max-proof-nonces); new proofs are refused until they expire",
                        self.max_nonces
                    );
                }
                Err("refused (the proof nonce store is full)")
            }
        }
    }
}

/// Passes `request` on if it needs no proof or carries a valid one; else
/// 401 with the OpenAI-shaped error and the refusal signal. Without a
/// secret, passes everything.
pub(crate) async fn require_proof(
    State(check): State<Option<Arc<ProofCheck>>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(check) = check else { return next.run(request).await };
    let path = request.uri().path();
    if OPEN_PATHS.contains(&path) {
        return next.run(request).await;
    }
    let verdict = match request.headers().get(REQUEST_PROOF_HEADER) {
        None => Err("missing"),
        Some(value) => match value.to_str() {
            Err(_) => Err("malformed"),
            Ok(value) => check.verify(value, request.method().as_str(), path),
        },
    };
    match verdict {
        Ok(digest) => {
            let (parts, body) = request.into_parts();
            let body = Body::new(Vouched { inner: body, hasher: Some(Sha256::new()), expected: digest });
            next.run(Request::from_parts(parts, body)).await
        }
        Err(why) => {
            tracing::debug!(%path, why, "request without a valid proof refused");
            unauthorized(&format!("{REQUEST_PROOF_HEADER} {why}: requests must come through the frontend"))
        }
    }
}

/// A request body that hashes its bytes as they pass and, at its end, fails
/// unless they are the body the proof vouched for (a handler reading it sees
/// an error instead of the end).
struct Vouched {
    inner: Body,
    /// `None` once the end was checked.
    hasher: Option<Sha256>,
    expected: BodyDigest,
}

/// The body is not the one the request proof vouched for.
#[derive(Debug)]
struct NotTheSignedBody;

impl std::fmt::Display for NotTheSignedBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the body is not the one {REQUEST_PROOF_HEADER} vouches for")
    }
}

impl std::error::Error for NotTheSignedBody {}

impl http_body::Body for Vouched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(hasher)) = (frame.data_ref(), this.hasher.as_mut()) {
                    hasher.update(data);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => match this.hasher.take().map(|hasher| hasher.finalize()) {
                Some(digest) if digest.as_slice() != this.expected => {
                    tracing::warn!("request body does not match its proof; refused");
                    Poll::Ready(Some(Err(axum::Error::new(NotTheSignedBody))))
                }
                _ => Poll::Ready(None),
            },
            other => other,
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// `401` with `{"error":{"message","type":"Unauthorized","param":null,"code":401}}`.
fn unauthorized(message: &str) -> Response {
    let body = serde_json::json!({"error": {"message": message, "type": "Unauthorized", "param": null, "code": 401}});
    let mut response = (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    // A frontend reads this, not the status: another worker may take it.
    response.headers_mut().insert(REFUSAL_HEADER, HeaderValue::from_static(REFUSAL_PROOF));
    response
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::routing::{get, post};
    use axum::Router;
    use tower::ServiceExt as _;

    use super::*;

    const OWN: ProofTarget = ProofTarget { worker: 7, incarnation: 70 };
    const WINDOW_MS: u64 = 5_000;

    fn empty() -> BodyDigest {
        crate::secret::body_digest(b"")
    }

    fn secrets(value: &[u8]) -> Arc<Secrets> {
        Arc::new(Secrets::from_values(value, None).unwrap())
    }

    /// A fresh proof by `key` for `METHOD PATH` at `target`, made at `at`.
    fn proof_at(key: &Secrets, method: &str, path: &str, target: ProofTarget, at: u64) -> String {
        key.request_proof(method, path, &empty(), target, fastrand::u128(..), at)
    }

    fn proof(key: &Secrets, method: &str, path: &str) -> String {
        proof_at(key, method, path, OWN, unix_ms())
    }

    fn app_with(secrets: Option<Arc<Secrets>>, max_nonces: usize) -> Router {
        let check = secrets.map(|s| Arc::new(ProofCheck::new(s, OWN, WINDOW_MS, max_nonces)));
        Router::new()
            .route("/v1/completions", post(|| async { "generated" }))
            .route("/v1/chat/completions", post(|| async { "generated" }))
            .route("/v1/models", get(|| async { "models" }))
            .route("/info", get(|| async { "info" }))
            .route("/v1/echo", post(|body: Bytes| async move { body }))
            .route("/health", get(|| async { "healthy" }))
            .route("/metrics", get(|| async { "metrics" }))
            .layer(axum::middleware::from_fn_with_state(check, require_proof))
    }

    fn app(secrets: Option<Arc<Secrets>>) -> Router {
        app_with(secrets, 1_000)
    }

    async fn call(app: &Router, method: &str, path: &str, proof: Option<String>) -> (StatusCode, serde_json::Value) {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(proof) = proof {
            request = request.header(REQUEST_PROOF_HEADER, proof);
        }
        let response = app.clone().oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
        let status = response.status();
        if status == StatusCode::UNAUTHORIZED {
            assert_eq!(response.headers()[REFUSAL_HEADER], REFUSAL_PROOF, "a refusal carries its signal");
        }
        let bytes = axum::body::to_bytes(response.into_body(), 64 * 1024).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
    }

    const GUARDED: [(&str, &str); 3] =
        [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models")];

    #[tokio::test]
    async fn a_valid_proof_passes_once_and_anything_else_is_401() {
        let key = secrets(b"0123456789abcdef-worker");
        let app = app(Some(key.clone()));
        let other = secrets(b"another secret of 16+");
        for (method, path) in GUARDED {
            let now = unix_ms();
            let good = proof(&key, method, path);
            assert_eq!(call(&app, method, path, Some(good.clone())).await.0, StatusCode::OK);
            // The same proof again: a replay.
            assert_eq!(call(&app, method, path, Some(good)).await.0, StatusCode::UNAUTHORIZED);
            // Query strings are not part of the signed path.
            let with_query = format!("{path}?x=1");
            assert_eq!(call(&app, method, &with_query, Some(proof(&key, method, path))).await.0, StatusCode::OK);
            let refused = [
                None,
                Some("garbage".to_owned()),
                Some(proof(&other, method, path)),
                Some(proof(&key, method, "/somewhere/else")),
                Some(proof(&key, if method == "GET" { "POST" } else { "GET" }, path)),
                Some(proof_at(&key, method, path, OWN, now - WINDOW_MS - 1_000)),
                Some(proof_at(&key, method, path, OWN, now + WINDOW_MS + 1_000)),
                Some(proof_at(&key, method, path, ProofTarget { worker: 8, ..OWN }, now)),
                Some(proof_at(&key, method, path, ProofTarget { incarnation: 69, ..OWN }, now)),
            ];
            for proof in refused {
                let (status, body) = call(&app, method, path, proof.clone()).await;
                assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path} with {proof:?}");
                assert_eq!(body["error"]["type"], "Unauthorized");
                assert_eq!(body["error"]["code"], 401);
                assert!(body["error"]["param"].is_null());
                assert!(body["error"]["message"].as_str().unwrap().contains(REQUEST_PROOF_HEADER));
            }
        }
        // Unknown paths are guarded too (deny by default).
        assert_eq!(call(&app, "GET", "/v1/other", None).await.0, StatusCode::UNAUTHORIZED);
    }

    #[tokio::test]
    async fn a_full_nonce_store_refuses_new_proofs() {
        let key = secrets(b"0123456789abcdef-worker");
        let app = app_with(Some(key.clone()), 2);
        for _ in 0..2 {
            assert_eq!(call(&app, "GET", "/v1/models", Some(proof(&key, "GET", "/v1/models"))).await.0, StatusCode::OK);
        }
        let (status, body) = call(&app, "GET", "/v1/models", Some(proof(&key, "GET", "/v1/models"))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(body["error"]["message"].as_str().unwrap().contains("full"), "{body}");
    }

    #[tokio::test]
    async fn probes_scrapes_and_the_identity_stay_open() {
        let app = app(Some(secrets(b"0123456789abcdef-worker")));
        for path in OPEN_PATHS {
            assert_eq!(call(&app, "GET", path, None).await.0, StatusCode::OK);
        }
    }

    #[tokio::test]
    async fn without_a_secret_everything_passes() {
        let app = app(None);
        for (method, path) in GUARDED {
            assert_eq!(call(&app, method, path, None).await.0, StatusCode::OK);
        }
    }

    #[tokio::test]
    async fn the_previous_secret_still_verifies_during_rotation() {
        let old = secrets(b"the old secret, 16+");
        let both = Arc::new(Secrets::from_values(b"the new secret, 16+", Some(b"the old secret, 16+")).unwrap());
        let app = app(Some(both));
        assert_eq!(call(&app, "GET", "/v1/models", Some(proof(&old, "GET", "/v1/models"))).await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn the_proof_vouches_for_the_body() {
        let key = secrets(b"0123456789abcdef-worker");
        let app = app(Some(key.clone()));
        let send = |body: &'static [u8], signed: &'static [u8]| {
            let digest = crate::secret::body_digest(signed);
            let proof = key.request_proof("POST", "/v1/echo", &digest, OWN, fastrand::u128(..), unix_ms());
            let request = Request::builder()
                .method("POST")
                .uri("/v1/echo")
                .header(REQUEST_PROOF_HEADER, proof)
                .body(Body::from(body));
            let app = app.clone();
            async move {
                let response = app.oneshot(request.unwrap()).await.unwrap();
                let status = response.status();
                (status, axum::body::to_bytes(response.into_body(), 1024).await.unwrap())
            }
        };
        let (status, echoed) = send(b"the signed prompt", b"the signed prompt").await;
        assert_eq!((status, &echoed[..]), (StatusCode::OK, &b"the signed prompt"[..]));
        // Another prompt under a proof seen on the wire: the body fails at its end.
        let (status, _) = send(b"another prompt", b"the signed prompt").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let (status, _) = send(b"", b"the signed prompt").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }
}
