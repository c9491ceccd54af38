//! `loadgate bench` as a process over real sockets: its exit status and its
//! progress on stderr. A dead URL (connection refused everywhere) exits 1
//! naming the error, in the open loop and in a retry storm; a server of this
//! test process answering every request with 529 exits 0; with stderr not a
//! terminal the plain progress line (every 5 s) shows in a 7 s run, and not
//! with `LOADGATE_BENCH_QUIET`; the proxy variables apply to it (a client,
//! unlike the frontend and the worker), and `NO_PROXY` exempts a host.

#[path = "common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;

/// How long a bench of at most 7 s of arrivals may take to print its report
/// (its drain is 2 s; the rest is margin for a busy machine).
const BENCH_WITHIN: Duration = Duration::from_secs(40);
/// How long a bench may take to exit after its report.
const EXIT_WITHIN: Duration = Duration::from_secs(10);
/// How long its stderr may take to reach this process after it exited.
const STDERR_WITHIN: Duration = Duration::from_secs(5);
/// What every plain progress line starts with (`loadgen/progress.rs`).
const PROGRESS: &str = "bench: ";

/// A completions endpoint on 127.0.0.1 answering every request with 529.
async fn refusing_server() -> SocketAddr {
    let refuse = || async { (StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE), "overloaded") };
    let app = axum::Router::new().fallback(refuse);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the refusing server");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// A URL on 127.0.0.1 whose port nobody listens on (bound, then closed).
fn dead_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let addr = listener.local_addr().expect("its address");
    drop(listener);
    format!("http://{addr}")
}

/// Runs `loadgate bench --url url --model m --drain-timeout 2 --json` with
/// `extra` flags and `env`: its `--json` line, exit status and process.
async fn bench(url: &str, extra: &[&str], env: &[(&str, &str)]) -> (String, ExitStatus, common::Proc) {
    let args: Vec<String> = ["bench", "--url", url, "--model", "m", "--drain-timeout", "2", "--json"]
        .iter()
        .chain(extra)
        .map(|s| (*s).to_owned())
        .collect();
    let env: Vec<(String, String)> = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let (mut bench, line) = common::spawn_within("bench", &args, &env, BENCH_WITHIN);
        let status = bench.wait_exit(EXIT_WITHIN).expect("the bench exits after its report");
        (line, status, bench)
    })
    .await
    .expect("the bench ran")
}

/// The summary's `key`, a count.
fn count(line: &str, key: &str) -> u64 {
    let summary: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("bench --json: {e}: {line}"));
    summary[key].as_u64().unwrap_or_else(|| panic!("no {key} in {line}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_url_exits_1_naming_the_connection_error() {
    let _box = common::shared().await;
    let url = dead_url();
    let (line, status, bench) = bench(&url, &["--rate", "20", "--duration", "1"], &[]).await;
    assert_eq!(status.code(), Some(1), "{line}");
    assert!(count(&line, "sent") > 0 && count(&line, "transport_errors") == count(&line, "sent"), "{line}");
    assert!(bench.wait_log("no request got an HTTP response; the first error:", STDERR_WITHIN), "the error line");
    let stderr = bench.stderr();
    assert!(stderr.to_lowercase().contains("connection refused"), "the connection error named: {stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_storm_on_a_dead_url_exits_1_too() {
    let _box = common::shared().await;
    let url = dead_url();
    let storm = ["--retry-storm", "2", "--duration", "1", "--retry-fallback-ms", "100", "--request-timeout", "5"];
    let (line, status, bench) = bench(&url, &storm, &[]).await;
    assert_eq!(status.code(), Some(1), "{line}");
    assert!(count(&line, "transport_errors") > 0, "{line}");
    assert!(bench.wait_log("no request got an HTTP response; the first error:", STDERR_WITHIN), "the error line");
    assert!(bench.stderr().to_lowercase().contains("connection refused"), "{}", bench.stderr());
}

/// A completions endpoint on 127.0.0.1 answering every request 200 with a
/// whole JSON answer: the 1st, 3rd, 5th... it receives at once, the others
/// after `slow`.
async fn alternating_server(slow: Duration) -> SocketAddr {
    let received = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let answer = move || {
        // Relaxed: only numbers the requests.
        let n = received.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        async move {
            if n % 2 == 1 {
                tokio::time::sleep(slow).await;
            }
            (StatusCode::OK, [("content-type", "application/json")], r#"{"choices":[{"text":"hi"}]}"#)
        }
    };
    let app = axum::Router::new().fallback(answer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the alternating server");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// `--slo-ttft-ms` counts the completions whose first byte came within the
/// objective, per second of arrivals: against a server answering every
/// other request at once and the rest after 1.2 s, an objective of 600 ms
/// (600 ms of margin either way on a busy machine; the slow ones done 0.8 s
/// before the 2 s drain ends) counts exactly the fast half.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slo_goodput_counts_the_completions_within_the_objective() {
    let _box = common::shared().await;
    let url = format!("http://{}", alternating_server(Duration::from_millis(1200)).await);
    let args = ["--rate", "20", "--duration", "1", "--slo-ttft-ms", "600"];
    let (line, status, bench) = bench(&url, &args, &[]).await;
    assert_eq!(status.code(), Some(0), "{line}\n{}", bench.stderr());
    let summary: serde_json::Value = serde_json::from_str(&line).expect("bench --json");
    let ok = count(&line, "ok");
    assert!(ok > 0 && ok == count(&line, "sent"), "every request completed: {line}");
    assert_eq!(summary["slo_ttft_ms"].as_u64(), Some(600), "{line}");
    let within =
        summary["slo_goodput_rps"].as_f64().expect("slo_goodput_rps") * summary["duration_s"].as_f64().unwrap();
    assert_eq!(within.round() as u64, ok.div_ceil(2), "the fast half: {line}");
}

/// A server that accepts every connection and never answers held every
/// request of the open loop in flight, and the load generator grew by about
/// 25 KiB a request (a debug build at --rate 3000: 262 MiB with 9,570 in
/// flight, 25 MiB more a second), bounded only by the open-file limit.
/// With --max-in-flight 20 the arrivals past the 20th are not sent: each
/// counts as a transport error, and the 20 sent are unfinished at the drain
/// deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arrivals_past_max_in_flight_are_not_sent() {
    let _box = common::shared().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the silent server");
    let addr = listener.local_addr().expect("its address");
    let accepted = Arc::new(AtomicU64::new(0));
    let seen = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::Relaxed);
            held.push(tcp);
        }
    });
    let args = ["--rate", "100", "--duration", "1", "--max-in-flight", "20"];
    let (line, status, bench) = bench(&format!("http://{addr}"), &args, &[]).await;
    let sent = count(&line, "sent");
    assert!(sent > 20, "{line}");
    assert_eq!(count(&line, "unfinished"), 20, "{line}");
    assert_eq!(count(&line, "transport_errors"), sent - 20, "{line}");
    assert!(accepted.load(Ordering::Relaxed) <= 20, "connections: {line}");
    assert_eq!(status.code(), Some(1), "no request was answered: {}", bench.stderr());
    assert!(bench.stderr().contains("20 requests in flight already (--max-in-flight)"), "{}", bench.stderr());
}

/// `--slo-ttft-ms` takes at least 1 ms and is not for a retry storm.
#[test]
fn the_slo_objective_is_checked_at_start() {
    for args in
        [&["--rate", "1", "--duration", "1", "--slo-ttft-ms", "0"][..], &["--retry-storm", "2", "--slo-ttft-ms", "500"]]
    {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_loadgate"))
            .args(["bench", "--url", "http://127.0.0.1:9", "--model", "m"])
            .args(args)
            .output()
            .expect("run loadgate bench");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("--slo-ttft-ms"), "{args:?}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_refused_with_529_exits_0() {
    let _box = common::shared().await;
    let url = format!("http://{}", refusing_server().await);
    let (line, status, bench) = bench(&url, &["--rate", "50", "--duration", "1"], &[]).await;
    assert_eq!(status.code(), Some(0), "{line}\n{}", bench.stderr());
    assert!(count(&line, "sent") > 0, "{line}");
    assert_eq!(count(&line, "rejected"), count(&line, "sent"), "every request refused: {line}");
    assert!(!bench.stderr().contains("no request got"), "{}", bench.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_terminal_a_plain_progress_line_shows_every_5_s() {
    let _box = common::shared().await;
    let url = format!("http://{}", refusing_server().await);
    // Arrivals for 7 s: the line is due at 5 s, 2 s before the last arrival.
    let (line, status, bench) = bench(&url, &["--rate", "20", "--duration", "7"], &[]).await;
    assert_eq!(status.code(), Some(0), "{line}");
    assert!(bench.wait_log(PROGRESS, STDERR_WITHIN), "no progress line: {}", bench.stderr());
    let stderr = bench.stderr();
    let progress = stderr.lines().find(|l| l.starts_with(PROGRESS)).unwrap_or_default();
    for figure in ["/7 s", "sent ", "ok 0", "rejected ", "errors 0", "in flight "] {
        assert!(progress.contains(figure), "{figure:?} in {progress:?}");
    }
    let sent: u64 = progress.split("sent ").nth(1).and_then(|r| r.split(' ').next()?.parse().ok()).unwrap_or(0);
    assert!(sent > 0, "requests sent by 5 s: {progress:?}");
    assert!(!line.contains(PROGRESS), "progress stays off stdout: {line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_shows_no_progress() {
    let _box = common::shared().await;
    let url = format!("http://{}", refusing_server().await);
    let env = [("LOADGATE_BENCH_QUIET", "true")];
    let (line, status, bench) = bench(&url, &["--rate", "20", "--duration", "6"], &env).await;
    assert_eq!(status.code(), Some(0), "{line}");
    // The stderr reader may lag the exit: give it its bound before looking.
    assert!(!bench.wait_log(PROGRESS, Duration::from_secs(1)), "a progress line: {}", bench.stderr());
}

/// `loadgate bench` sends through the proxy `HTTP_PROXY` names, as a client
/// like `curl` does (docs/deployment.md, "Proxy variables"), unless
/// `NO_PROXY` exempts the host: the URL is dead, the "proxy" answers 529.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_honours_the_proxy_variables_and_no_proxy() {
    let _box = common::shared().await;
    let url = dead_url();
    let proxy = format!("http://{}", refusing_server().await);
    let run = ["--rate", "20", "--duration", "1"];
    let (line, status, through) = bench(&url, &run, &[("HTTP_PROXY", proxy.as_str()), ("NO_PROXY", "")]).await;
    assert_eq!(status.code(), Some(0), "{line}\n{}", through.stderr());
    assert_eq!(count(&line, "rejected"), count(&line, "sent"), "every request went to the proxy: {line}");
    let (line, status, _) = bench(&url, &run, &[("HTTP_PROXY", proxy.as_str()), ("NO_PROXY", "127.0.0.1")]).await;
    assert_eq!(status.code(), Some(1), "straight to the dead URL: {line}");
    assert_eq!(count(&line, "transport_errors"), count(&line, "sent"), "{line}");
}
