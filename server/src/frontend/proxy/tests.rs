//! The proxy against fake workers on 127.0.0.1.

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
use crate::secret::{unix_ms, ProofTarget, Secrets, REQUEST_PROOF_HEADER};
use axum::http::StatusCode;
use loadgate::rejection::{REFUSAL_AT_CAPACITY, REFUSAL_HEADER, WORKER_AT_CAPACITY};
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

/// A fake worker on 127.0.0.1 with id `id` (incarnation 0) answering as
/// `answer` says.
async fn fake_worker(id: u64, answer: Answer, seen: Seen) -> (String, tokio::task::JoinHandle<()>) {
    let own = ProofTarget { worker: id, incarnation: 0 };
    let secrets = Secrets::from_values(SECRET, None).unwrap();
    let handler = move |request: Request| {
        let seen = seen.clone();
        let secrets = secrets.clone();
        async move {
            let proof = request.headers().get(REQUEST_PROOF_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let vouched = proof
                .and_then(|p| secrets.verify_request_proof(&p, "POST", "/v1/completions", own, unix_ms(), 5_000).ok());
            let body = axum::body::to_bytes(request.into_body(), usize::MAX).await.unwrap();
            let valid = vouched.map(|v| v.body) == Some(body_digest(&body));
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
    let directory = Arc::new(WorkerDirectory::new(monitor.clone()));
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
    let (refusing, _a) = fake_worker(1, Answer::Refuse(529), seen.clone()).await;
    let (serving, _b) = fake_worker(2, Answer::Serve, seen.clone()).await;
    frontend.monitor.register(1, "m", 1, 0).unwrap();
    frontend.monitor.register(2, "m", 1, 0).unwrap();
    frontend.directory.insert(1, &refusing, 1);
    frontend.directory.insert(2, &serving, 1);
    let body = json_body(3 << 20);
    let len = body.len();
    let app = crate::frontend::app(frontend.clone(), crate::frontend::AdminPlace::Elsewhere(None));
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
        let (a, _a) = fake_worker(1, first, seen.clone()).await;
        let (b, _b) = fake_worker(2, Answer::Serve, seen.clone()).await;
        frontend.monitor.register(1, "m", 1, 0).unwrap();
        frontend.monitor.register(2, "m", 1, 0).unwrap();
        frontend.directory.insert(1, &a, 1);
        frontend.directory.insert(2, &b, 1);
        let app = crate::frontend::app(frontend.clone(), crate::frontend::AdminPlace::Elsewhere(None));
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
    let app = crate::frontend::app(frontend.clone(), crate::frontend::AdminPlace::Elsewhere(None));
    let too_large = app.clone().oneshot(completion(json_body(1 << 20))).await.unwrap();
    assert_eq!(too_large.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(too_large.headers()[header::CONNECTION], "close");
    // Within the limit, the body is read and routed (no worker: 503 Unavailable).
    let fits = app.clone().oneshot(completion(json_body(1000))).await.unwrap();
    assert_eq!(fits.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(fits.headers().get(header::CONNECTION).is_none(), "a routing 503 keeps the connection");
    // With the budget held by another body, the next is refused unread.
    let held = frontend.bodies.read(&HeaderMap::new(), Body::from(vec![b' '; 1 << 20])).await.unwrap();
    // (Past the small bodies' lane: a body of 64 KiB or less would be read.)
    let over = app.clone().oneshot(completion(json_body(100 << 10))).await.unwrap();
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
    let app = crate::frontend::app(frontend.clone(), crate::frontend::AdminPlace::Elsewhere(None));
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
