//! `loadgate bench` (and one flag of the simulated worker) against hostile
//! or broken servers and nonsense flags, as processes over real sockets.
//! Each test is a defect a review found (it failed before its fix): the
//! bench's memory stays bounded whatever a server sends and however long
//! the run, a 2xx cut short is no completion, and flags no server could
//! serve are refused at start rather than crash or run for nothing.
//!
//! Margins: RSS bounds are 4-8x what the bench holds when working (about
//! 20-30 MiB); every wait is bounded.

use std::io::Read as _;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const MIB: u64 = 1024 * 1024;

fn loadgate(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_loadgate"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn loadgate")
}

/// `loadgate bench` of model `m` against `url`, seeded, quiet, with `extra`.
fn bench(url: &str, extra: &[&str]) -> Child {
    let mut args = vec!["bench", "--url", url, "--model", "m", "--seed", "1", "--quiet"];
    args.extend_from_slice(extra);
    loadgate(&args)
}

/// VmRSS of `pid`, KiB.
fn rss_kib(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Waits for `child` at most `within`; kills it past that. Its status
/// (None: killed), stdout and stderr.
fn finish(mut child: Child, within: Duration) -> (Option<std::process::ExitStatus>, String, String) {
    let deadline = Instant::now() + within;
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (mut out, mut err) = (String::new(), String::new());
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    (status, out, err)
}

/// A raw HTTP/1.1 server on 127.0.0.1: reads each request head, then runs
/// `answer` on the connection.
async fn raw_server<F, Fut>(answer: F) -> SocketAddr
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else { return };
            let answer = answer.clone();
            tokio::spawn(async move {
                // The head and the (small) body: read what comes in the first moments.
                let mut buf = vec![0u8; 64 * 1024];
                let mut seen = Vec::new();
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                answer(tcp).await;
            });
        }
    });
    addr
}

/// A raw server that reads each request head and never answers, holding
/// the connection open (a closure parameter the future does not use would
/// be dropped, and the connection closed, before it runs).
async fn silent_server() -> SocketAddr {
    raw_server(|tcp| async move {
        let _held = tcp;
        tokio::time::sleep(Duration::from_secs(600)).await;
    })
    .await
}

/// The open loop keeps every response body whole in memory: a frontend
/// answering with a large (or endless) 200 stream grows the load generator
/// without bound, until the drain deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_memory_is_bounded_against_a_huge_stream() {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
    let args = ["--rate", "20", "--duration", "0.5", "--stream", "--drain-timeout", "120", "--json"];
    bench_memory_against_an_endless_body(head, &args).await;
}

/// A retry storm's clients open their connections with a `GET` whose
/// answer they read whole into memory: a server answering it with an
/// endless body grew the load generator until `--request-timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_memory_is_bounded_against_a_huge_answer_to_its_connecting_get() {
    let head = "HTTP/1.1 405 Method Not Allowed\r\ntransfer-encoding: chunked\r\n\r\n";
    let args =
        ["--retry-storm", "1", "--duration", "60", "--drain-timeout", "60", "--request-timeout", "120", "--json"];
    bench_memory_against_an_endless_body(head, &args).await;
}

/// Runs the bench with `args` against a server answering every request
/// with `head` and a chunked body that does not end (256 MiB, then
/// nothing); the bench must take it all and hold less than 128 MiB.
async fn bench_memory_against_an_endless_body(head: &'static str, args: &[&str]) {
    let written = Arc::new(AtomicU64::new(0));
    let cap = 256 * MIB;
    let w = written.clone();
    let addr = raw_server(move |mut tcp| {
        let w = w.clone();
        async move {
            if tcp.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let event = format!("data: {}\n\n", "x".repeat(MIB as usize - 8));
            let chunk = format!("{:x}\r\n{event}\r\n", event.len());
            while w.load(Ordering::Relaxed) < cap {
                if tcp.write_all(chunk.as_bytes()).await.is_err() {
                    return;
                }
                w.fetch_add(event.len() as u64, Ordering::Relaxed);
            }
            // Never ends: a body that does not finish.
            tokio::time::sleep(Duration::from_secs(600)).await;
        }
    })
    .await;
    let url = format!("http://{addr}");
    let bench = bench(&url, args);
    let pid = bench.id();
    let deadline = Instant::now() + Duration::from_secs(90);
    while written.load(Ordering::Relaxed) < cap && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sent = written.load(Ordering::Relaxed);
    let rss = rss_kib(pid) / 1024;
    let _ = finish(bench, Duration::ZERO);
    eprintln!("the server sent {} MiB; bench RSS {rss} MiB", sent / MIB);
    assert!(sent >= cap, "the bench did not take the bytes: {} MiB", sent / MIB);
    assert!(rss < 128, "bench holds {rss} MiB after reading {} MiB of responses", sent / MIB);
}

/// A 200 stream cut short (a close-delimited body, no `data: [DONE]`, no
/// usage) is no completion: it was counted "ok", its latency in the
/// percentiles and in the demo's goodput.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_does_not_count_a_cut_stream_as_ok() {
    let addr = raw_server(|mut tcp| async move {
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
        let first = "data: {\"id\":\"x\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\" the\",\"finish_reason\":null}]}\n\n";
        let _ = tcp.write_all(format!("{head}{first}").as_bytes()).await;
        // The frontend goes away mid-stream.
        let _ = tcp.shutdown().await;
    })
    .await;
    let url = format!("http://{addr}");
    let bench = bench(&url, &["--rate", "20", "--duration", "0.5", "--stream", "--drain-timeout", "5", "--json"]);
    let (status, out, err) = tokio::task::spawn_blocking(move || finish(bench, Duration::from_secs(30))).await.unwrap();
    assert!(status.is_some(), "bench did not end: {err}");
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out} {err}"));
    eprintln!("{summary}");
    assert!(summary["sent"].as_u64().unwrap() > 0);
    assert_eq!(summary["ok"], 0, "cut streams counted as completed: {summary}");
}

/// A 2xx whose usage claims more completion tokens than a u64 holds (the
/// bench's parse saturates at u64::MAX): the second such answer overflowed
/// the run's token sum, a panic of the load generator in a debug build (in
/// a release one a wrapped, wrong tok/s). Every answer is served at once;
/// the seeded run has about 20 of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_survives_a_server_claiming_more_tokens_than_a_u64_holds() {
    let addr = raw_server(|mut tcp| async move {
        let body = r#"{"choices":[{"text":"a"}],"usage":{"completion_tokens":99999999999999999999999}}"#;
        let head =
            format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len());
        let _ = tcp.write_all(format!("{head}{body}").as_bytes()).await;
    })
    .await;
    let url = format!("http://{addr}");
    let bench = bench(&url, &["--rate", "40", "--duration", "0.5", "--drain-timeout", "5", "--json"]);
    let (status, out, err) = tokio::task::spawn_blocking(move || finish(bench, Duration::from_secs(30))).await.unwrap();
    assert!(!err.contains("panicked"), "{status:?}: {}", err.lines().take(3).collect::<Vec<_>>().join("\n"));
    assert!(status.is_some_and(|s| s.success()), "{status:?}: {out} {err}");
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out} {err}"));
    assert!(summary["ok"].as_u64().is_some_and(|n| n >= 2), "{summary}");
}

/// `--rate` takes any positive number: a tiny one panicked (a gap too long
/// for a `Duration`); now it makes no arrival.
#[test]
fn bench_tiny_rate_does_not_panic() {
    let bench = bench("http://127.0.0.1:9", &["--rate", "1e-300", "--duration", "1"]);
    let (status, _, err) = finish(bench, Duration::from_secs(20));
    assert!(!err.contains("panicked"), "exit {status:?}: {}", err.lines().take(3).collect::<Vec<_>>().join("\n"));
}

/// `--prompt-tokens` takes any u32: a huge one aborts the process
/// (the prompt is built as a Vec of 4e9 words), though no frontend could
/// take a body of that size (192 MiB by default).
#[test]
fn bench_huge_prompt_tokens_is_refused_cleanly() {
    let bench = bench("http://127.0.0.1:9", &["--rate", "1", "--duration", "1", "--prompt-tokens", "4294967295"]);
    let (status, _, err) = finish(bench, Duration::from_secs(20));
    let status = status.expect("ended");
    assert!(status.code().is_some(), "killed by a signal ({status:?}): {}", err.trim());
}

/// Memory grows with `--duration` before any request: the timeline
/// allocates two histograms per second of it up front (about 53 KiB per
/// second: 1 GiB at --duration 20000, 4.5 GiB at the accepted maximum of a day).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_memory_does_not_grow_with_duration() {
    // A server that never answers, so that the run stays up.
    let addr = silent_server().await;
    let url = format!("http://{addr}");
    let bench = bench(&url, &["--rate", "1", "--duration", "20000"]);
    let pid = bench.id();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss = rss_kib(pid) / 1024;
    let _ = finish(bench, Duration::ZERO);
    assert!(rss < 128, "bench RSS {rss} MiB three seconds into a --duration 20000 run");
}

/// `--prefill-tokens-per-s 0` is accepted; the worker then never
/// prefills anything: every request hangs forever, holding its place in the cap.
#[test]
fn a_worker_with_a_zero_prefill_rate_refuses_to_start() {
    let worker = loadgate(&["worker", "--model", "m", "--http-port", "0", "--prefill-tokens-per-s", "0"]);
    let (status, out, err) = finish(worker, Duration::from_secs(20));
    let status = status.expect("the worker refuses to start");
    assert!(!status.success(), "started: {out}");
    assert!(err.contains("--prefill-tokens-per-s"), "{err}");
}

/// `--output-tokens 0` (or above 2^31 - 1) is accepted, and every
/// request it sends is one no worker takes (400): the run reports 100 %
/// "rejected" and exits 0 instead of refusing the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_refuses_output_tokens_no_server_accepts() {
    let mut worker = loadgate(&["worker", "--model", "m", "--http-port", "0"]);
    let mut line = String::new();
    {
        use std::io::BufRead as _;
        std::io::BufReader::new(worker.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    }
    let url = format!("http://{}", line.trim().strip_prefix("listening http=").unwrap());
    let bench = bench(&url, &["--rate", "20", "--duration", "0.5", "--output-tokens", "0", "--json"]);
    let (status, out, _) = tokio::task::spawn_blocking(move || finish(bench, Duration::from_secs(30))).await.unwrap();
    let _ = worker.kill();
    let _ = worker.wait();
    assert_ne!(status.and_then(|s| s.code()), Some(0), "accepted and ran: {out}");
}

/// A frontend answering 307 sent the bench's load (and its tenant keys) on
/// to wherever its `Location` pointed, and the bench counted the other
/// server's 200 as a completion of this one. Now the 3xx is the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_does_not_follow_redirects() {
    let followed = Arc::new(AtomicU64::new(0));
    let f = followed.clone();
    let elsewhere = raw_server(move |mut tcp| {
        f.fetch_add(1, Ordering::Relaxed);
        async move {
            let body =
                r#"{"id":"x","object":"text_completion","choices":[{"index":0,"text":"a","finish_reason":"length"}]}"#;
            let head =
                format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len());
            let _ = tcp.write_all(format!("{head}{body}").as_bytes()).await;
        }
    })
    .await;
    let addr = raw_server(move |mut tcp| async move {
        let head = format!(
            "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://{elsewhere}/v1/completions\r\ncontent-length: 0\r\n\r\n"
        );
        let _ = tcp.write_all(head.as_bytes()).await;
    })
    .await;
    let url = format!("http://{addr}");
    let bench = bench(&url, &["--rate", "20", "--duration", "0.5", "--drain-timeout", "5", "--json"]);
    let (status, out, err) = tokio::task::spawn_blocking(move || finish(bench, Duration::from_secs(30))).await.unwrap();
    assert!(status.is_some(), "bench did not end: {err}");
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out} {err}"));
    eprintln!("{summary}");
    assert_eq!(followed.load(Ordering::Relaxed), 0, "the redirect was followed: {summary}");
    assert_eq!(summary["ok"], 0, "{summary}");
    assert!(summary["by_status"]["307"].as_u64().is_some_and(|n| n > 0), "{summary}");
}

/// `--rate 1e12` was taken: the open loop spawned arrivals 1 ps apart
/// without bound, its memory growing by gigabytes. It is refused at start.
#[test]
fn bench_huge_rate_is_refused() {
    let bench = bench("http://127.0.0.1:9", &["--rate", "1e12", "--duration", "1"]);
    let (status, _, err) = finish(bench, Duration::from_secs(10));
    assert!(status.is_some_and(|s| !s.success()), "still running or accepted: {err}");
    assert!(err.contains("--rate must be a positive number of requests per second, at most 100000"), "{err}");
}

/// A `--plot` that cannot be written was found out after the run (of
/// any `--duration`): the load was sent for nothing. Now no request leaves.
#[test]
fn bench_refuses_a_plot_it_cannot_write_before_any_request() {
    // Never accepted from: a connection the bench made would wait in its backlog.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let plot = std::env::temp_dir().join(format!("loadgate-bench-hostile-{}-no-such-dir/x.svg", std::process::id()));
    let plot = plot.to_str().unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let bench = bench(&url, &["--rate", "20", "--duration", "1", "--drain-timeout", "1", "--plot", plot]);
    let (status, _, err) = finish(bench, Duration::from_secs(30));
    assert!(status.is_some_and(|s| !s.success()), "still running or accepted: {err}");
    assert!(err.contains(plot), "{err}");
    let connected = listener.accept().map(|_| ());
    assert!(connected.is_err(), "the bench connected before the plot was refused: {err}");
}

/// A `--plot` naming a named pipe nobody reads made the bench (and the
/// demo) wait without end before its first request: the check that the
/// plot can be written opened the pipe, which blocks until a reader comes.
#[test]
fn bench_refuses_a_plot_that_is_a_named_pipe() {
    let fifo = std::env::temp_dir().join(format!("loadgate-bench-hostile-{}-fifo.svg", std::process::id()));
    let _ = std::fs::remove_file(&fifo);
    assert!(Command::new("mkfifo").arg(&fifo).status().expect("run mkfifo").success());
    let bench = bench("http://127.0.0.1:9", &["--rate", "1", "--duration", "1", "--plot", fifo.to_str().unwrap()]);
    let (status, _, err) = finish(bench, Duration::from_secs(20));
    let _ = std::fs::remove_file(&fifo);
    assert!(status.is_some_and(|s| !s.success()), "still waiting after 20 s, or accepted: {err}");
    assert!(err.contains("named pipe"), "{err}");
}

/// A retry storm is bounded by `--duration` plus `--drain-timeout`, but a
/// server that never answered its clients' connecting `GET` (before the
/// burst) held it for `--request-timeout` more: 2 s of storm took 22 s.
/// Margin: 10 s for a bound of 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_storm_against_a_silent_server_ends_on_time() {
    let addr = silent_server().await;
    let url = format!("http://{addr}");
    let args = ["--retry-storm", "3", "--duration", "1", "--drain-timeout", "1", "--request-timeout", "20", "--json"];
    let bench = bench(&url, &args);
    let started = Instant::now();
    let (status, out, err) = tokio::task::spawn_blocking(move || finish(bench, Duration::from_secs(40))).await.unwrap();
    let took = started.elapsed();
    assert!(status.is_some(), "still running after 40 s: {err}");
    assert!(took < Duration::from_secs(10), "a storm of 1 + 1 s took {took:?}: {out} {err}");
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out} {err}"));
    assert_eq!(summary["unfinished"], 3, "{summary}");
}

/// `data:[DONE]` (no space after the colon: valid SSE, as the frontend's
/// own token count reads it) ended no stream for the bench: every 200 was
/// counted a transport error, and the run exited 1 saying no request got
/// an HTTP response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_counts_a_stream_ended_by_data_done_without_a_space() {
    let addr = raw_server(|mut tcp| async move {
        let body =
            "data:{\"choices\":[{\"text\":\"a\"}]}\n\ndata:{\"usage\":{\"completion_tokens\":1}}\n\ndata:[DONE]\n\n";
        let head =
            format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n", body.len());
        let _ = tcp.write_all(format!("{head}{body}").as_bytes()).await;
    })
    .await;
    let url = format!("http://{addr}");
    let bench = bench(&url, &["--rate", "20", "--duration", "0.5", "--drain-timeout", "5", "--stream", "--json"]);
    let (status, out, err) = tokio::task::spawn_blocking(move || finish(bench, Duration::from_secs(30))).await.unwrap();
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out} {err}"));
    assert!(status.is_some_and(|s| s.success()), "{status:?}: {summary} {err}");
    assert!(summary["sent"].as_u64().is_some_and(|n| n > 0), "{summary}");
    assert_eq!(summary["ok"], summary["sent"], "{summary}");
    assert_eq!(summary["transport_errors"], 0, "{summary}");
}

/// A `--url` the bench cannot send to (empty, another scheme, a bad port)
/// ran the whole `--duration`, every request failing; an empty one sent
/// them to the host `v1` (`http:///v1/completions`). Refused at start.
#[test]
fn bench_refuses_a_url_it_cannot_send_to() {
    for url in ["", "ftp://127.0.0.1:9", "127.0.0.1:99999"] {
        let started = Instant::now();
        let bench = bench(url, &["--rate", "5", "--duration", "60"]);
        let (status, _, err) = finish(bench, Duration::from_secs(30));
        assert!(status.is_some_and(|s| !s.success()), "{url:?}: still running or accepted: {err}");
        assert!(err.contains(&format!("--url `{url}`")), "{url:?}: {err}");
        assert!(started.elapsed() < Duration::from_secs(20), "{url:?}: refused only after running");
    }
}

/// A storm's clients still running at its bound were dropped from the
/// report with everything they had seen: against a frontend that refuses
/// each client once (529, retry in 500 ms) and then never answers, the
/// summary said 0 attempts, 0 retries, no status, the very storm it
/// measures left out of its peak. Margin: the retries fall 500 ms into a
/// 2 s storm (due before its 1 s of attempts end); the three first POSTs
/// are the three clients' first attempts unless one starts 500 ms late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_reports_what_its_unfinished_clients_saw() {
    let posts = Arc::new(AtomicU64::new(0));
    let seen = posts.clone();
    let addr = raw_server(move |mut tcp| {
        let seen = seen.clone();
        async move {
            // The connecting GET (its head read already), then each whole request in turn.
            let mut answer = "HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n";
            let mut pending = Vec::new();
            loop {
                if tcp.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
                let Some(head) = next_request(&mut tcp, &mut pending).await else { return };
                if head.starts_with("POST") && seen.fetch_add(1, Ordering::Relaxed) >= 3 {
                    // A retry: never answered.
                    tokio::time::sleep(Duration::from_secs(600)).await;
                }
                answer = "HTTP/1.1 529 Overloaded\r\nretry-after-ms: 500\r\ncontent-length: 0\r\n\r\n";
            }
        }
    })
    .await;
    let url = format!("http://{addr}");
    let args = ["--retry-storm", "3", "--duration", "1", "--drain-timeout", "1", "--request-timeout", "20", "--json"];
    let summary = summary_of(&url, &args, Duration::from_secs(40)).await;
    assert_eq!(summary["unfinished"], 3, "{summary}");
    assert_eq!(summary["attempts"], 6, "{summary}");
    assert_eq!(summary["retries"], 3, "{summary}");
    assert_eq!(summary["by_status"]["529"], 3, "{summary}");
    assert_eq!(summary["peak_retries_10ms"], 3, "{summary}");
    assert_eq!(summary["out_of_attempts"], 0, "{summary}");
}

/// The storm retried only 529 and 503, so against a frontend whose
/// overload status is 429 (which the OpenAI SDKs retry too) every client
/// counted as failed at its first refusal. Now a 429 is retried after its
/// hint: the three clients refused once each succeed on their retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_retries_a_429_as_an_sdk_would() {
    let posts = Arc::new(AtomicU64::new(0));
    let seen = posts.clone();
    let addr = raw_server(move |mut tcp| {
        let seen = seen.clone();
        async move {
            let mut answer = "HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n".to_owned();
            let mut pending = Vec::new();
            loop {
                if tcp.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
                let Some(_) = next_request(&mut tcp, &mut pending).await else { return };
                answer = match seen.fetch_add(1, Ordering::Relaxed) {
                    0..3 => {
                        "HTTP/1.1 429 Too Many Requests\r\nretry-after-ms: 200\r\ncontent-length: 0\r\n\r\n".to_owned()
                    }
                    _ => {
                        let body = r#"{"choices":[{"text":"hi"}]}"#;
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        )
                    }
                };
            }
        }
    })
    .await;
    let url = format!("http://{addr}");
    let args = ["--retry-storm", "3", "--duration", "5", "--drain-timeout", "5", "--json"];
    let summary = summary_of(&url, &args, Duration::from_secs(40)).await;
    assert_eq!(summary["succeeded"], 3, "{summary}");
    assert_eq!((summary["by_status"]["429"].clone(), summary["retries"].clone()), (3.into(), 3.into()), "{summary}");
}

/// Reads the next whole request (head, and body by its `content-length`)
/// from `tcp`, `pending` holding what came after the last; its head.
async fn next_request(tcp: &mut tokio::net::TcpStream, pending: &mut Vec<u8>) -> Option<String> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..end]).into_owned();
            let length: usize = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if pending.len() >= end + 4 + length {
                pending.drain(..end + 4 + length);
                return Some(head);
            }
        }
        match tcp.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => pending.extend_from_slice(&buf[..n]),
        }
    }
}

/// A closed stdout (`loadgate bench ... | head -0`, a reader gone) made
/// the report's `println!` panic: exit 101 and a panic message instead of
/// an error saying what happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_with_its_stdout_closed_fails_without_a_panic() {
    let addr = raw_server(|mut tcp| async move {
        let _ = tcp.write_all(b"HTTP/1.1 529 Overloaded\r\ncontent-length: 0\r\n\r\n").await;
    })
    .await;
    let url = format!("http://{addr}");
    let mut bench = bench(&url, &["--rate", "20", "--duration", "0.3", "--drain-timeout", "2", "--json"]);
    // The reader of its stdout is gone before it writes its report.
    drop(bench.stdout.take());
    bench.stdout = Some(Command::new("true").stdout(Stdio::piped()).spawn().unwrap().stdout.take().unwrap());
    let (status, _, err) = tokio::task::spawn_blocking(move || finish(bench, Duration::from_secs(30))).await.unwrap();
    let status = status.expect("the bench ends");
    assert!(!err.contains("panicked"), "{status:?}: {err}");
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("stdout"), "{err}");
}

/// Every distinct `x-loadgate-rejected-reason` was kept apart, in the
/// run's, each class's and each tenant's count: a server naming each
/// refusal differently grew the bench (and its `--json`) with every request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_keeps_a_bounded_number_of_refusal_reasons() {
    let n = Arc::new(AtomicU64::new(0));
    let addr = raw_server(move |mut tcp| {
        let i = n.fetch_add(1, Ordering::Relaxed);
        async move {
            let head =
                format!("HTTP/1.1 529 Overloaded\r\nx-loadgate-rejected-reason: r{i}\r\ncontent-length: 0\r\n\r\n");
            let _ = tcp.write_all(head.as_bytes()).await;
        }
    })
    .await;
    let url = format!("http://{addr}");
    let args = ["--rate", "200", "--duration", "1", "--drain-timeout", "5", "--mix", "critical=1", "--json"];
    let summary = summary_of(&url, &args, Duration::from_secs(30)).await;
    let critical = &summary["by_class"]["critical"];
    let reasons = critical["reasons"].as_object().unwrap_or_else(|| panic!("{summary}"));
    assert!(critical["rejected"].as_u64().is_some_and(|n| n > 100), "{summary}");
    assert!(reasons.len() <= 65, "{} reasons kept apart", reasons.len());
    assert_eq!(
        reasons.values().filter_map(serde_json::Value::as_u64).sum::<u64>(),
        critical["rejected"].as_u64().unwrap()
    );
}

/// The `--json` summary of `loadgate bench` against `url` with `args`,
/// which must end `within`.
async fn summary_of(url: &str, args: &[&str], within: Duration) -> serde_json::Value {
    let bench = bench(url, args);
    let (status, out, err) = tokio::task::spawn_blocking(move || finish(bench, within)).await.unwrap();
    assert!(status.is_some(), "still running after {within:?}: {err}");
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out} {err}"))
}
