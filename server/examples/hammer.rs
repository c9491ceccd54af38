//! A closed-loop HTTP/1.1 load generator for the reject-path benchmark
//! (`benches/reject_path/run.py`): `--connections` keep-alive connections,
//! each sending one fixed small chat-completion request, waiting for its
//! answer and sending the next, for `--warmup-seconds` (not counted) and then
//! `--seconds` (counted).
//!
//! Deliberately minimal so that it costs every target alike and depends on
//! nothing the frontend uses: raw tokio sockets, one request in flight per
//! connection, responses framed by `Content-Length` (what axum sends for
//! these replies; a chunked response counts as an error). Each response is
//! counted by status and checked against `--expect-status`, `--expect-body`
//! and `--expect-header`.
//!
//! Prints `phase=measure` when counting starts, `phase=done` when it ends
//! (so a caller can sample the server's CPU time around the window), then
//! one line `result {json}`.
//!
//! ```sh
//! cargo run --release -p loadgate-server --example hammer -- --addr 127.0.0.1:8000 \
//!     --connections 32 --seconds 5 --expect-status 529
//! ```

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use hdrhistogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The request body every connection sends.
const DEFAULT_BODY: &str =
    r#"{"model":"bench","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16,"stream":false}"#;

/// Largest response head the client accepts.
const MAX_HEAD: usize = 64 * 1024;

/// Command-line arguments.
#[derive(Debug, Parser)]
struct Args {
    /// The target, HOST:PORT.
    #[arg(long)]
    addr: SocketAddr,
    /// Request path.
    #[arg(long, default_value = "/v1/chat/completions")]
    path: String,
    /// Request body (JSON).
    #[arg(long, default_value = DEFAULT_BODY)]
    body: String,
    /// Concurrent keep-alive connections (one request in flight on each).
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Seconds counted.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Seconds before counting starts (connections open, caches warm).
    #[arg(long, default_value_t = 1.0)]
    warmup_seconds: f64,
    /// Runtime threads (1: a current-thread runtime).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// A response matches only with this status.
    #[arg(long)]
    expect_status: Option<u16>,
    /// A response matches only with exactly this body.
    #[arg(long)]
    expect_body: Option<String>,
    /// A response matches only with this header, `name: value` (repeatable;
    /// name case-insensitive, value exact).
    #[arg(long)]
    expect_header: Vec<String>,
}

/// What each response is checked against.
#[derive(Debug)]
struct Expect {
    status: Option<u16>,
    body: Option<Vec<u8>>,
    headers: Vec<(String, String)>,
}

/// One connection's counts (merged at the end; no sharing while running).
#[derive(Debug)]
struct Stats {
    by_status: BTreeMap<u16, u64>,
    matched: u64,
    status_mismatch: u64,
    body_mismatch: u64,
    header_mismatch: u64,
    errors: u64,
    connects: u64,
    latency_us: Histogram<u64>,
}

impl Stats {
    fn new() -> anyhow::Result<Self> {
        Ok(Stats {
            by_status: BTreeMap::new(),
            matched: 0,
            status_mismatch: 0,
            body_mismatch: 0,
            header_mismatch: 0,
            errors: 0,
            connects: 0,
            latency_us: Histogram::new_with_bounds(1, 60_000_000, 3)?,
        })
    }

    fn merge(&mut self, other: &Stats) -> anyhow::Result<()> {
        for (status, n) in &other.by_status {
            *self.by_status.entry(*status).or_default() += n;
        }
        self.matched += other.matched;
        self.status_mismatch += other.status_mismatch;
        self.body_mismatch += other.body_mismatch;
        self.header_mismatch += other.header_mismatch;
        self.errors += other.errors;
        self.connects += other.connects;
        self.latency_us.add(&other.latency_us)?;
        Ok(())
    }

    fn responses(&self) -> u64 {
        self.by_status.values().sum()
    }
}

/// A response read into the connection's buffer.
struct Response {
    status: u16,
    close: bool,
    /// End of the head (status line and headers, with the blank line).
    head_end: usize,
    /// End of the body.
    end: usize,
}

/// Times of the two phases.
#[derive(Clone, Copy, Debug)]
struct Window {
    measure: Instant,
    end: Instant,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()?
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(args.threads).enable_all().build()?
    };
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let mut headers = Vec::new();
    for h in &args.expect_header {
        let (name, value) = h.split_once(':').ok_or_else(|| anyhow::anyhow!("--expect-header {h:?}: no ':'"))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let expect = std::sync::Arc::new(Expect {
        status: args.expect_status,
        body: args.expect_body.as_ref().map(|b| b.as_bytes().to_vec()),
        headers,
    });
    let request = std::sync::Arc::new(
        format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: */*\r\nContent-Length: {}\r\n\r\n{}",
            args.path,
            args.addr,
            args.body.len(),
            args.body
        )
        .into_bytes(),
    );
    let start = Instant::now();
    let measure = start + Duration::from_secs_f64(args.warmup_seconds.max(0.0));
    let window = Window { measure, end: measure + Duration::from_secs_f64(args.seconds.max(0.001)) };

    let mut tasks = Vec::with_capacity(args.connections);
    for _ in 0..args.connections.max(1) {
        let (request, expect) = (request.clone(), expect.clone());
        tasks.push(tokio::spawn(connection(args.addr, request, expect, window)));
    }
    let phases = tokio::spawn(async move {
        tokio::time::sleep_until(window.measure).await;
        println!("phase=measure");
        let _ = std::io::stdout().flush();
        tokio::time::sleep_until(window.end).await;
        println!("phase=done");
        let _ = std::io::stdout().flush();
    });

    let mut total = Stats::new()?;
    for task in tasks {
        total.merge(&task.await??)?;
    }
    phases.await?;
    let seconds = (window.end - window.measure).as_secs_f64();
    let responses = total.responses();
    let by_status: BTreeMap<String, u64> = total.by_status.iter().map(|(s, n)| (s.to_string(), *n)).collect();
    let result = serde_json::json!({
        "addr": args.addr.to_string(),
        "connections": args.connections,
        "threads": args.threads,
        "seconds": seconds,
        "responses": responses,
        "rps": responses as f64 / seconds,
        "by_status": by_status,
        "matched": total.matched,
        "status_mismatch": total.status_mismatch,
        "body_mismatch": total.body_mismatch,
        "header_mismatch": total.header_mismatch,
        "errors": total.errors,
        "connects": total.connects,
        "latency_us": {
            "p50": total.latency_us.value_at_quantile(0.5),
            "p99": total.latency_us.value_at_quantile(0.99),
            "max": total.latency_us.max(),
        },
    });
    println!("result {result}");
    Ok(())
}

/// One closed-loop connection until the window ends; reconnects after an
/// error or a `Connection: close`.
async fn connection(
    addr: SocketAddr,
    request: std::sync::Arc<Vec<u8>>,
    expect: std::sync::Arc<Expect>,
    window: Window,
) -> anyhow::Result<Stats> {
    let mut stats = Stats::new()?;
    let mut buf = Vec::with_capacity(8 * 1024);
    'connect: while Instant::now() < window.end {
        let mut stream = match TcpStream::connect(addr).await {
            Ok(s) => s,
            Err(_) => {
                if Instant::now() >= window.measure {
                    stats.errors += 1;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        stats.connects += 1;
        buf.clear();
        loop {
            let sent = Instant::now();
            let outcome = exchange(&mut stream, &request, &mut buf).await;
            let now = Instant::now();
            if now >= window.end {
                break 'connect;
            }
            let counted = now >= window.measure;
            match outcome {
                Ok(response) => {
                    if counted {
                        record(&mut stats, &expect, &buf, &response, now - sent);
                    }
                    if response.close {
                        continue 'connect;
                    }
                }
                Err(_) => {
                    if counted {
                        stats.errors += 1;
                    }
                    continue 'connect;
                }
            }
        }
    }
    Ok(stats)
}

fn record(stats: &mut Stats, expect: &Expect, buf: &[u8], response: &Response, latency: Duration) {
    *stats.by_status.entry(response.status).or_default() += 1;
    let _ = stats.latency_us.record(u64::try_from(latency.as_micros()).unwrap_or(u64::MAX).max(1));
    let body = &buf[response.head_end..response.end];
    if expect.status.is_some_and(|s| s != response.status) {
        stats.status_mismatch += 1;
    } else if expect.body.as_deref().is_some_and(|b| b != body) {
        stats.body_mismatch += 1;
    } else if !expect.headers.iter().all(|(name, value)| has_header(&buf[..response.head_end], name, value)) {
        stats.header_mismatch += 1;
    } else {
        stats.matched += 1;
    }
}

/// Whether `head` has a header `name` (lowercase) with exactly `value`.
fn has_header(head: &[u8], name: &str, value: &str) -> bool {
    head.split(|&b| b == b'\n').skip(1).any(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        line.iter().position(|&b| b == b':').is_some_and(|colon| {
            line[..colon].trim_ascii().eq_ignore_ascii_case(name.as_bytes())
                && line[colon + 1..].trim_ascii() == value.as_bytes()
        })
    })
}

/// Sends `request` and reads one response into `buf`.
async fn exchange(stream: &mut TcpStream, request: &[u8], buf: &mut Vec<u8>) -> anyhow::Result<Response> {
    stream.write_all(request).await?;
    buf.clear();
    let head_end = loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            break i + 4;
        }
        anyhow::ensure!(buf.len() < MAX_HEAD, "response head too large");
        if stream.read_buf(buf).await? == 0 {
            anyhow::bail!("connection closed");
        }
    };
    let head = std::str::from_utf8(&buf[..head_end])?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| anyhow::anyhow!("bad status line {status_line:?}"))?;
    let mut length = None;
    let mut close = false;
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').ok_or_else(|| anyhow::anyhow!("bad header {line:?}"))?;
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(value.parse::<usize>()?);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            anyhow::bail!("transfer-encoding {value} not supported");
        } else if name.eq_ignore_ascii_case("connection") && value.eq_ignore_ascii_case("close") {
            close = true;
        }
    }
    let length = length.ok_or_else(|| anyhow::anyhow!("no content-length"))?;
    let end = head_end + length;
    while buf.len() < end {
        if stream.read_buf(buf).await? == 0 {
            anyhow::bail!("connection closed in the body");
        }
    }
    Ok(Response { status, close, head_end, end })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
