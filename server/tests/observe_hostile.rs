//! The frontend's observability against hostile or unlucky requests (real
//! `loadgate` processes on 127.0.0.1): what `/metrics` and the access log
//! say about a request its client abandons while it waits in the line, or
//! one refused before its body was read; what a client or a worker can
//! write into them. Each test but the gauge's is a defect a review found
//! (it failed before its fix).
//!
//! Margins: the abandoned requests wait 800 ms of a 30 s line; every other
//! wait is bounded by 5-15 s.

mod common;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{BusyWorker, Frontend};

const MODEL: &str = "hostile-busy";
const SETTLE: Duration = Duration::from_secs(15);

async fn metrics(fe: &Frontend) -> String {
    let response = fe
        .client
        .get(format!("{}/metrics", fe.http))
        .header("accept", "application/openmetrics-text")
        .send()
        .await
        .expect("GET /metrics");
    response.text().await.expect("metrics body")
}

fn value(text: &str, series: &str) -> Option<u64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// A frontend with a long waiting line, a busy fake worker for MODEL
/// (every request for it waits), and the access log on.
async fn waiting_setup() -> (Frontend, BusyWorker) {
    let fe = Frontend::start_with_env(
        &[("RUST_LOG", "warn,loadgate::access=info")],
        &["--active-decode-blocks-threshold", "0.85", "--router-queue-timeout-ms", "30000"],
    );
    let busy = BusyWorker::start(fe.events, 91, MODEL);
    fe.wait_workers(1, SETTLE).await;
    // Wait until the fake's load is applied (its worker busy).
    let deadline = Instant::now() + SETTLE;
    loop {
        let text = metrics(&fe).await;
        if text.lines().any(|l| l.starts_with("loadgate_frontend_worker_busy") && l.ends_with(" 1")) {
            break;
        }
        assert!(Instant::now() < deadline, "the busy fake never became busy:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (fe, busy)
}

/// Sends a completion for MODEL that waits in the line, and gives up (the
/// client closes its connection) after `after`.
async fn abandon_while_waiting(fe: &Frontend, id: &str, after: Duration) {
    let client = common::client_within(after);
    let sent = client
        .post(format!("{}/v1/completions", fe.http))
        .header("x-request-id", id)
        .json(&common::small_request(MODEL))
        .send()
        .await;
    assert!(sent.is_err(), "the request should still be waiting in the line: {sent:?}");
}

/// docs/deployment.md: `loadgate_frontend_tenant_requests_total{tenant,outcome}`
/// counts the inference requests of each tenant by outcome, `cancelled`
/// when the client went away first. A client that gave up while its
/// request waited in the line (the commonest cancellation once a line is
/// on) was counted in `dynamo_frontend_requests_total` but in no tenant's
/// series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_while_waiting_counts_as_its_tenants_cancelled() {
    let _shared = common::shared().await;
    let (fe, _busy) = waiting_setup().await;
    abandon_while_waiting(&fe, "gone-while-waiting-1", Duration::from_millis(800)).await;
    assert!(fe.proc.wait_log("request_id=gone-while-waiting-1", SETTLE), "no access line");
    let line = fe.proc.stderr().lines().find(|l| l.contains("gone-while-waiting-1")).unwrap_or_default().to_owned();
    eprintln!("access line: {line}");
    let text = metrics(&fe).await;
    let cancelled_total: u64 = text
        .lines()
        .filter(|l| l.starts_with("dynamo_frontend_requests_total{") && l.contains("error_type=\"cancelled\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(cancelled_total, 1, "the dynamo counter saw the cancellation:\n{text}");
    let tenant = "loadgate_frontend_tenant_requests_total{tenant=\"other\",outcome=\"cancelled\"}";
    assert_eq!(
        value(&text, tenant),
        Some(1),
        "a request counted cancelled in dynamo_frontend_requests_total is in no tenant's series:\n{}",
        text.lines().filter(|l| l.contains("tenant_requests") || l.contains("cancel")).collect::<Vec<_>>().join("\n")
    );
}

/// The request named a model the frontend knows (it waited in that model's
/// line): its cancellation is counted under that model (it was under
/// `model="none"`, so the per-model cancellation counter never saw those
/// of waiting requests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_while_waiting_is_counted_under_its_model() {
    let _shared = common::shared().await;
    let (fe, _busy) = waiting_setup().await;
    abandon_while_waiting(&fe, "gone-while-waiting-2", Duration::from_millis(800)).await;
    assert!(fe.proc.wait_log("request_id=gone-while-waiting-2", SETTLE), "no access line");
    let text = metrics(&fe).await;
    let cancel_lines: Vec<&str> =
        text.lines().filter(|l| l.starts_with("dynamo_frontend_model_cancellation_total{")).collect();
    let series = format!(
        "dynamo_frontend_model_cancellation_total{{model=\"{MODEL}\",endpoint=\"completions\",request_type=\"unary\"}}"
    );
    assert_eq!(value(&text, &series), Some(1), "cancellations: {cancel_lines:?}");
}

/// The access log cuts paths and model names to 256 bytes so that a client
/// cannot make one request write an arbitrarily long line; the method (an
/// extension method is any token, of any length hyper takes) was written
/// whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_write_a_huge_access_line() {
    let _shared = common::shared().await;
    let fe = Frontend::start_with_env(&[("RUST_LOG", "warn,loadgate::access=info")], &[]);
    let addr = fe.http.trim_start_matches("http://").to_owned();
    let method = "A".repeat(60_000);
    let mut conn = TcpStream::connect(&addr).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    conn.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let request = format!("{method} /x HTTP/1.1\r\nhost: a\r\nx-request-id: huge-method\r\nconnection: close\r\n\r\n");
    conn.write_all(request.as_bytes()).expect("send");
    let mut answer = Vec::new();
    let _ = conn.read_to_end(&mut answer);
    let head = String::from_utf8_lossy(&answer[..answer.len().min(40)]).into_owned();
    eprintln!("answer: {head:?}");
    assert!(fe.proc.wait_log("request_id=huge-method", Duration::from_secs(5)), "no access line");
    let log = fe.proc.stderr();
    let line = log.lines().find(|l| l.contains("request_id=huge-method")).unwrap_or_default();
    assert!(line.len() <= 2048, "one request wrote an access line of {} bytes", line.len());
}

/// The access line of a request its client abandoned while it waited in
/// its model's line names the model and the wait (it said `model=none` and
/// `waited_ms=none`, as if the request never waited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_while_waiting_is_logged_with_its_model_and_wait() {
    let _shared = common::shared().await;
    let (fe, _busy) = waiting_setup().await;
    abandon_while_waiting(&fe, "gone-while-waiting-3", Duration::from_millis(800)).await;
    assert!(fe.proc.wait_log("request_id=gone-while-waiting-3", SETTLE), "no access line");
    let line = fe.proc.stderr().lines().find(|l| l.contains("gone-while-waiting-3")).unwrap_or_default().to_owned();
    assert!(line.contains("client_gone=true"), "{line}");
    assert!(line.contains(&format!("model=\"{MODEL}\"")), "the model it waited for is not logged: {line}");
    assert!(!line.contains("waited_ms=none"), "800 ms in the line logged as no wait: {line}");
}

/// The line's gauge returns to 0 once the abandoned request is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_line_is_empty_after_its_waiter_left() {
    let _shared = common::shared().await;
    let (fe, _busy) = waiting_setup().await;
    abandon_while_waiting(&fe, "gone-while-waiting-4", Duration::from_millis(800)).await;
    let series = format!("loadgate_frontend_queue_waiting{{model=\"{MODEL}\"}}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = metrics(&fe).await;
        let waiting = value(&text, &series);
        let awaiting = value(&text, "dynamo_frontend_inflight_requests{model=\"none\"}");
        if waiting == Some(0) && awaiting == Some(0) {
            break;
        }
        assert!(Instant::now() < deadline, "{series} = {waiting:?}, inflight none = {awaiting:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A request the frontend refuses before it reads the model (a body that is
/// not JSON: 400) is an inference request of its tenant that ended with
/// another status: `outcome="error"` by docs/deployment.md. It was in
/// `dynamo_frontend_requests_total` but in no tenant's series (the tenant
/// was labelled only on the responses of requests whose body was read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_body_counts_in_its_tenants_errors() {
    let _shared = common::shared().await;
    let (fe, _busy) = waiting_setup().await;
    let response = fe
        .client
        .post(format!("{}/v1/completions", fe.http))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("an answer");
    assert_eq!(response.status(), 400);
    let text = metrics(&fe).await;
    let validation = "dynamo_frontend_requests_total{model=\"none\",endpoint=\"completions\",request_type=\"unary\",status=\"error\",error_type=\"validation\"}";
    assert_eq!(value(&text, validation), Some(1), "{text}");
    let tenant = "loadgate_frontend_tenant_requests_total{tenant=\"other\",outcome=\"error\"}";
    assert_eq!(
        value(&text, tenant),
        Some(1),
        "{}",
        text.lines().filter(|l| l.contains("tenant_requests")).collect::<Vec<_>>().join("\n")
    );
}

/// Every family of the frontend writes a worker's model name escaped
/// (`LabelText`); the waiting line's four wrote it as given. With a line
/// on, one worker serving a model named with a `"` made `/metrics`
/// unreadable: Prometheus drops the whole scrape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_name_with_a_quote_leaves_the_exposition_well_formed() {
    let _shared = common::shared().await;
    let fe = Frontend::start(None, &["--router-queue-timeout-ms", "100"]);
    let model = "quote\"model";
    let _worker = common::worker(Some(fe.events), model, None, &[]);
    fe.wait_workers(1, SETTLE).await;
    for accept in ["application/openmetrics-text", "text/plain"] {
        let text = fe
            .client
            .get(format!("{}/metrics", fe.http))
            .header("accept", accept)
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("body");
        assert!(text.contains("model=\"quote\\\"model\""), "the escaped name is written elsewhere");
        let broken: Vec<&str> = text.lines().filter(|l| l.contains("model=\"quote\"model\"")).collect();
        assert!(broken.is_empty(), "{accept}: unescaped label values:\n{}", broken.join("\n"));
    }
}

/// The same four families let a model name carry a newline into the
/// exposition: a worker (or an engine listing such a model) wrote whole
/// forged sample lines into the frontend's `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_name_cannot_inject_samples() {
    let _shared = common::shared().await;
    let fe = Frontend::start(None, &["--router-queue-timeout-ms", "100"]);
    let model = "inj\"} 0\nloadgate_forged_total{by=\"a worker\"} 999999\n# x{model=\"";
    let _worker = common::worker(Some(fe.events), model, None, &[]);
    fe.wait_workers(1, SETTLE).await;
    let text = fe.client.get(format!("{}/metrics", fe.http)).send().await.expect("GET").text().await.expect("body");
    let forged: Vec<&str> = text.lines().filter(|l| l.starts_with("loadgate_forged_total")).collect();
    assert!(forged.is_empty(), "forged samples in /metrics:\n{}", forged.join("\n"));
}

/// A registered worker's model name reached the frontend's log verbatim: a
/// newline in it forged a whole log line (tracing's formatter escapes ESC
/// and the like, not `\n`). Any local process could do it without a secret;
/// with one, any worker. Names a peer sends are logged quoted now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_name_cannot_forge_a_log_line() {
    let _shared = common::shared().await;
    // The default filter (info), as a deployment runs it.
    let fe = Frontend::start_with_env(&[("RUST_LOG", "info")], &[]);
    let mut conn = common::EventConn::connect(fe.events).expect("connect");
    let forged = "2099-01-01T00:00:00.000000Z ERROR loadgate::admin: FORGED admin token leaked";
    let model = format!("m\n{forged}");
    conn.send(&common::register(4242, 1, 1, &model, "127.0.0.1:1")).expect("send Register");
    assert!(fe.proc.wait_log("worker registered", Duration::from_secs(5)), "{}", fe.proc.stderr());
    // An address with a newline is refused (not HOST:PORT), and said so quoted.
    let mut conn = common::EventConn::connect(fe.events).expect("connect");
    conn.send(&common::register(4243, 1, 1, "m", "127.0.0.1:1\nFORGED too")).expect("send Register");
    assert!(fe.proc.wait_log("Register of worker 4243", Duration::from_secs(5)), "{}", fe.proc.stderr());
    let log = fe.proc.stderr();
    let forged_lines: Vec<&str> =
        log.lines().filter(|l| l.starts_with("2099-01-01") || l.starts_with("FORGED")).collect();
    assert!(forged_lines.is_empty(), "a peer forged frontend log lines: {forged_lines:?}");
}
