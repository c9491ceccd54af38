//! A fake worker (the impostor's endpoint): answers every request with 200
//! and counts what it receives; or, holding, answers each after a while
//! and records how many it held at once.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// What the fake worker puts in its answers, to tell them apart.
pub const IMPOSTOR_MARK: &str = "IMPOSTOR-ANSWER";

/// A tiny HTTP server on 127.0.0.1 that answers every request with 200 and
/// counts requests and bytes. Stops on drop.
pub struct FakeWorker {
    pub addr: SocketAddr,
    requests: Arc<AtomicUsize>,
    bytes: Arc<AtomicU64>,
    /// Requests held now, and the most held at once.
    held: Arc<(AtomicUsize, AtomicUsize)>,
    /// The body of the last request received (its first 64 KiB).
    last_body: Arc<Mutex<Vec<u8>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeWorker {
    pub fn start() -> FakeWorker {
        FakeWorker::holding(Duration::ZERO)
    }

    /// As [`start`](Self::start), holding each request `hold` before its answer.
    pub fn holding(hold: Duration) -> FakeWorker {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fake worker");
        listener.set_nonblocking(true).expect("nonblocking listener");
        let addr = listener.local_addr().expect("fake worker address");
        let requests = Arc::new(AtomicUsize::new(0));
        let bytes = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let held = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
        let last_body = Arc::new(Mutex::new(Vec::new()));
        let (r, b, s, h, l) = (requests.clone(), bytes.clone(), stop.clone(), held.clone(), last_body.clone());
        let thread = std::thread::spawn(move || {
            // Acquire: pairs with the Release store in drop.
            while !s.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (r, b, h, l) = (r.clone(), b.clone(), h.clone(), l.clone());
                        std::thread::spawn(move || serve_fake(stream, &r, &b, (&h, &l), hold));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        FakeWorker { addr, requests, bytes, held, last_body, stop, thread: Some(thread) }
    }

    /// The body of the last request received (its first 64 KiB), as JSON.
    pub fn last_body(&self) -> serde_json::Value {
        serde_json::from_slice(&self.last_body.lock().unwrap()).expect("the last body is JSON")
    }

    /// Requests received so far.
    pub fn requests(&self) -> usize {
        // Relaxed: a counter read after the fact.
        self.requests.load(Ordering::Relaxed)
    }

    /// The most requests it held at once (see [`holding`](Self::holding)).
    pub fn peak(&self) -> usize {
        // Relaxed: read after the fact.
        self.held.1.load(Ordering::Relaxed)
    }

    /// Bytes received so far (heads and bodies).
    pub fn bytes(&self) -> u64 {
        // Relaxed: a counter read after the fact.
        self.bytes.load(Ordering::Relaxed)
    }
}

impl Drop for FakeWorker {
    fn drop(&mut self) {
        // Release: the accept loop's Acquire load sees it.
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Serves one connection of the fake worker: one request, 200 (after
/// `hold`), close.
fn serve_fake(
    mut stream: TcpStream,
    requests: &AtomicUsize,
    bytes: &AtomicU64,
    (held, last_body): (&(AtomicUsize, AtomicUsize), &Mutex<Vec<u8>>),
    hold: Duration,
) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut head = Vec::new();
    let mut buf = vec![0u8; 256 * 1024];
    let (head_len, mut body_seen) = loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                // Relaxed: a counter.
                bytes.fetch_add(n as u64, Ordering::Relaxed);
                head.extend_from_slice(&buf[..n]);
                if let Some(at) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                    break (at + 4, head.len() - at - 4);
                }
                if head.len() > 64 * 1024 {
                    return;
                }
            }
        }
    };
    // Relaxed: a counter.
    requests.fetch_add(1, Ordering::Relaxed);
    let text = String::from_utf8_lossy(&head[..head_len]).to_ascii_lowercase();
    let length: usize =
        text.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    let mut body = head[head_len..].to_vec();
    while body_seen < length {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                // Relaxed: a counter.
                bytes.fetch_add(n as u64, Ordering::Relaxed);
                body_seen += n;
                if body.len() < 64 * 1024 {
                    body.extend_from_slice(&buf[..n]);
                }
            }
        }
    }
    body.truncate(64 * 1024);
    *last_body.lock().unwrap() = body;
    if !hold.is_zero() {
        // Relaxed: counters; the peak is a max over every update.
        let now = held.0.fetch_add(1, Ordering::Relaxed) + 1;
        held.1.fetch_max(now, Ordering::Relaxed);
        std::thread::sleep(hold);
        held.0.fetch_sub(1, Ordering::Relaxed);
    }
    let body = format!(
        r#"{{"id":"cmpl-x","object":"text_completion","model":"m","choices":[{{"index":0,"text":"{IMPOSTOR_MARK}","finish_reason":"stop"}}],"usage":{{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}}}"#
    );
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(answer.as_bytes());
}
