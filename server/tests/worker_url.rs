//! `--worker URL` registration against workers that misbehave, with a real
//! `loadgate frontend` process and fake workers on 127.0.0.1:
//!
//! - one that accepts and never answers: each `GET URL/info` attempt is
//!   bounded, the frontend keeps trying until its 30 s start deadline, then
//!   exits with an error naming the flag and the URL (a `--worker` is
//!   required at start: a refusal fails the start, docs/deployment.md);
//! - one whose `/info` body never ends, or declares 1 GiB: refused at once
//!   (64 KiB at most is read), naming the flag and the URL;
//! - one that hangs the first attempt and answers the next: the frontend
//!   starts with it.
//!
//! Before these bounds (df655a4) the first hung the start forever, the
//! endless body was read whole (here until the fake stops, at 256 MiB) and
//! the start failed with "error decoding response body", naming nothing,
//! and the third never started.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{shared, Frontend};

const MODEL: &str = "worker-url-model";

/// The frontend's deadline for a `--worker`'s `/info`
/// (`WORKER_INFO_DEADLINE` in `frontend/register.rs`).
const INFO_DEADLINE: Duration = Duration::from_secs(30);

/// What a fake worker does with its `n`th connection (from 0).
type Behaviour = fn(usize, TcpStream);

/// A fake worker on 127.0.0.1 that treats each connection by a
/// [`Behaviour`] and counts them. Stops accepting on drop.
struct FakeWorker {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl FakeWorker {
    fn start(behaviour: Behaviour) -> FakeWorker {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fake worker");
        listener.set_nonblocking(true).expect("nonblocking listener");
        let addr = listener.local_addr().expect("fake worker address");
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (count, stopped) = (accepted.clone(), stop.clone());
        std::thread::spawn(move || {
            // Acquire: pairs with the Release store in drop.
            while !stopped.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        stream.set_nonblocking(false).expect("blocking stream");
                        // Relaxed: a counter; the index only tells connections apart.
                        let n = count.fetch_add(1, Ordering::Relaxed);
                        std::thread::spawn(move || behaviour(n, stream));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        FakeWorker { addr, accepted, stop }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Connections accepted so far.
    fn accepted(&self) -> usize {
        // Relaxed: a counter read after the fact.
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for FakeWorker {
    fn drop(&mut self) {
        // Release: the accept loop's Acquire load sees it.
        self.stop.store(true, Ordering::Release);
    }
}

/// Reads until the peer closes (bounded by 2 minutes), never writing.
fn never_answer(_: usize, mut stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(120)));
    let mut buf = [0u8; 4096];
    while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
}

/// Reads a request head (bounded); its path.
fn read_head(stream: &TcpStream) -> Option<String> {
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut reader = BufReader::new(stream);
    let mut first = String::new();
    reader.read_line(&mut first).ok()?;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 || line == "\r\n" {
            break;
        }
    }
    first.split_whitespace().nth(1).map(str::to_owned)
}

/// Bytes of [`endless_info`]'s bodies written, and whether its last
/// connection is done writing.
static ENDLESS_WRITTEN: AtomicU64 = AtomicU64::new(0);
static ENDLESS_DONE: AtomicBool = AtomicBool::new(false);

/// `200` to `/info` with a body that never ends (chunked, 16 KiB chunks,
/// until the peer closes; at most 256 MiB).
fn endless_info(_: usize, stream: TcpStream) {
    write_endless_info(stream);
    // Release: pairs with the test's Acquire load.
    ENDLESS_DONE.store(true, Ordering::Release);
}

fn write_endless_info(mut stream: TcpStream) {
    if read_head(&stream).is_none() {
        return;
    }
    let _ = stream.set_write_timeout(Some(Duration::from_secs(10)));
    let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
    let opening = r#"{"worker_id":1,"model":"m","pad":""#;
    if stream.write_all(format!("{head}{:x}\r\n{opening}\r\n", opening.len()).as_bytes()).is_err() {
        return;
    }
    let chunk = format!("4000\r\n{}\r\n", "a".repeat(0x4000));
    for _ in 0..(256 << 20) / 0x4000 {
        if stream.write_all(chunk.as_bytes()).is_err() {
            return;
        }
        // Relaxed: a counter read after ENDLESS_DONE.
        ENDLESS_WRITTEN.fetch_add(0x4000, Ordering::Relaxed);
    }
}

/// `200` to `/info` declaring a 1 GiB body, then 1 KiB of it, then
/// nothing until the peer closes.
fn declared_huge_info(n: usize, mut stream: TcpStream) {
    if read_head(&stream).is_none() {
        return;
    }
    let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1073741824\r\n\r\n";
    if stream.write_all(format!("{head}{{\"pad\":\"{}", "a".repeat(1024)).as_bytes()).is_ok() {
        never_answer(n, stream);
    }
}

/// The first connection never answered; later ones answer `/info` as a
/// worker with id 7 of [`MODEL`] does, and anything else (`/health`) 200.
fn hangs_once(n: usize, mut stream: TcpStream) {
    if n == 0 {
        return never_answer(n, stream);
    }
    let Some(path) = read_head(&stream) else { return };
    let body =
        if path == "/info" { format!(r#"{{"worker_id":7,"model":"{MODEL}","dp_size":1}}"#) } else { "{}".to_owned() };
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(answer.as_bytes());
}

/// Runs `loadgate frontend --worker URL` (no secret), which must exit,
/// unsuccessfully and without listening, within `within`: its stderr and how
/// long it ran.
fn frontend_fails_to_start(url: &str, within: Duration) -> (String, Duration) {
    let started = Instant::now();
    let mut child = Command::new(common::bin())
        .args(["frontend", "--http-host", "127.0.0.1", "--http-port", "0", "--event-port", "0", "--admin-port", "0"])
        .args(["--worker", url])
        .env("RUST_LOG", "warn")
        .env_remove("LOADGATE_EVENT_SECRET")
        .env_remove("LOADGATE_EVENT_SECRET_PREVIOUS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn loadgate");
    // Both pipes drained as they fill, so the child never blocks on one.
    let drain = |pipe: Box<dyn Read + Send>| {
        let text = Arc::new(Mutex::new(String::new()));
        let sink = text.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut text = sink.lock().unwrap_or_else(|e| e.into_inner());
                text.push_str(&line);
                text.push('\n');
            }
        });
        text
    };
    let stdout = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let read = |text: &Arc<Mutex<String>>| text.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let status: ExitStatus = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if started.elapsed() >= within {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the frontend with --worker {url} neither started nor exited within {within:?}: {}", read(&stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let ran = started.elapsed();
    // The pipes close with the process; let the readers take the rest.
    std::thread::sleep(Duration::from_millis(200));
    let (stdout, stderr) = (read(&stdout), read(&stderr));
    assert!(!status.success(), "the frontend with --worker {url} exited 0; stderr: {stderr}");
    assert!(!stdout.contains("listening"), "the frontend with --worker {url} listened: {stdout}");
    (stderr, ran)
}

/// A worker that accepts and never answers: the start fails once the
/// deadline passes, after several bounded attempts, naming the flag and the
/// URL. Margins: the deadline is 30 s; the exit is awaited 20 s past it
/// (it comes at most one 100 ms pause after it), and at 5 s an attempt
/// about 6 attempts are made where 3 are required.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_never_answers_fails_the_start_naming_it() {
    let _box = shared().await;
    let silent = FakeWorker::start(never_answer);
    let url = silent.url();
    let (stderr, ran) = tokio::task::spawn_blocking({
        let url = url.clone();
        move || frontend_fails_to_start(&url, INFO_DEADLINE + Duration::from_secs(20))
    })
    .await
    .unwrap();
    let expected = format!("--worker {url}: GET {url}/info gave no answer within 30s");
    assert!(stderr.contains(&expected), "expected {expected:?} in stderr: {stderr}");
    assert!(ran >= INFO_DEADLINE, "gave up after {ran:?}, before the deadline");
    assert!(silent.accepted() >= 3, "{} attempts: each attempt is not bounded", silent.accepted());
    eprintln!("failed after {ran:?} and {} attempts: {}", silent.accepted(), stderr.trim());
}

/// A worker whose `/info` body never ends, or declares 1 GiB: the start
/// fails at once, naming the flag and the URL, having read at most 64 KiB.
/// Margins: the exit is awaited 15 s (it takes well under one); the fake
/// may have written what the loopback socket buffers hold (a few MiB), the
/// test allows 32 MiB (df655a4 took all 256).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_info_body_is_refused_at_once() {
    let _box = shared().await;
    for behaviour in [endless_info as Behaviour, declared_huge_info] {
        let worker = FakeWorker::start(behaviour);
        let url = worker.url();
        let (stderr, ran) = tokio::task::spawn_blocking({
            let url = url.clone();
            move || frontend_fails_to_start(&url, Duration::from_secs(15))
        })
        .await
        .unwrap();
        let expected = format!("--worker {url} refused: its /info body is over 64 KiB");
        assert!(stderr.contains(&expected), "expected {expected:?} in stderr: {stderr}");
        assert_eq!(worker.accepted(), 1, "a body too large is refused, not retried");
        eprintln!("refused after {ran:?}: {}", stderr.trim());
    }
    // The endless body's writer stops once the frontend is gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    // Acquire: pairs with the Release store after the last write.
    while !ENDLESS_DONE.load(Ordering::Acquire) {
        assert!(Instant::now() < deadline, "the endless body is still being written");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Relaxed: read after ENDLESS_DONE.
    let written = ENDLESS_WRITTEN.load(Ordering::Relaxed);
    assert!(written < 32 << 20, "{written} bytes of the endless body were taken");
    eprintln!("the endless body's writer stopped after {written} bytes");
}

/// A worker that hangs the first attempt and answers the second: the
/// frontend starts with it. Margin: the attempt gives up after 5 s, the
/// listening line is awaited 20 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_hangs_one_attempt_is_registered_by_the_next() {
    let _box = shared().await;
    let worker = FakeWorker::start(hangs_once);
    let url = worker.url();
    let started = Instant::now();
    let fe = tokio::task::spawn_blocking(move || Frontend::start(None, &["--worker", &url])).await.unwrap();
    eprintln!("started after {:?} and {} connections", started.elapsed(), worker.accepted());
    fe.wait_workers(1, Duration::from_secs(10)).await;
    assert!(worker.accepted() >= 2, "registered without retrying the hung attempt");
    let (models, _) = fe.models().await;
    assert!(models.iter().any(|m| m == MODEL), "{models:?}");
}
