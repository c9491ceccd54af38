//! The clients of the write-progress tests (`write_progress.rs`): raw
//! HTTP/1.1 connections with a small receive buffer, a hand-driven h2c
//! connection whose flow-control windows the test holds, and slow readers
//! of both. Every wait here is bounded.

use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::json;
use socket2::{Domain, Socket, Type};

use crate::MODEL;

/// The receive buffer of the raw HTTP/1.1 clients (set before connect: the
/// window scale is fixed by the handshake).
pub(crate) const RCVBUF: usize = 4096;
/// A slow reader takes this much every [`READ_EVERY`].
pub(crate) const READ_PIECE: usize = 8 * 1024;
pub(crate) const READ_EVERY: Duration = Duration::from_millis(100);
/// At most how long a slow read may take (the test's stream lasts about
/// 8 s; the rest is room for a busy machine).
pub(crate) const SLOW_READ_LIMIT: Duration = Duration::from_secs(25);

/// A streamed completion of `words` prompt words and `max_tokens` tokens.
pub(crate) fn stream_body(words: usize, max_tokens: u64) -> Vec<u8> {
    let prompt = vec!["hello"; words].join(" ");
    serde_json::to_vec(&json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": true}))
        .expect("a JSON value serialises")
}

/// `HOST:PORT` of `http://HOST:PORT`.
pub(crate) fn addr_of(base: &str) -> SocketAddr {
    let hostport = base.trim_start_matches("http://");
    hostport.parse().unwrap_or_else(|e| panic!("{hostport}: {e}"))
}

/// The HTTP/1.1 bytes of `POST /v1/completions` with `body`.
pub(crate) fn h1_request(addr: SocketAddr, body: &[u8]) -> Vec<u8> {
    let mut request = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

/// A raw HTTP/1.1 connection to `addr` with a [`RCVBUF`] receive buffer
/// that has sent `request`.
pub(crate) fn h1_small_window(addr: SocketAddr, request: &[u8]) -> TcpStream {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("a TCP socket");
    socket.set_recv_buffer_size(RCVBUF).expect("SO_RCVBUF");
    socket.connect_timeout(&addr.into(), Duration::from_secs(2)).expect("connect within 2 s");
    let mut stream: TcpStream = socket.into();
    stream.set_nodelay(true).expect("TCP_NODELAY");
    stream.set_write_timeout(Some(Duration::from_secs(5))).expect("a write timeout");
    stream.write_all(request).expect("send the request");
    stream
}

/// Reads what `stream` still delivers, as fast as it comes, until it ends
/// (EOF or reset: `true`) or `within` passes (`false`). Returns whether it
/// ended and the bytes read.
pub(crate) fn drain(stream: &mut TcpStream, within: Duration) -> (bool, Vec<u8>) {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    // Bounded by time; each read blocks at most until the deadline.
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return (false, got);
        }
        match stream.read(&mut buf) {
            Ok(0) => return (true, got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return (false, got),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return (true, got),
        }
    }
}

/// One h2c connection (HTTP/2 with prior knowledge on the plain port),
/// driven by hand; its connection task is aborted on drop.
pub(crate) struct H2c {
    send: h2::client::SendRequest<Bytes>,
    conn: tokio::task::JoinHandle<Result<(), h2::Error>>,
    authority: String,
}

impl H2c {
    /// Connects (bounded) with `window` as SETTINGS_INITIAL_WINDOW_SIZE
    /// (`None`: h2's default, 65,535).
    pub(crate) async fn connect(addr: SocketAddr, window: Option<u32>) -> H2c {
        let tcp = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
            .await
            .expect("connect within 2 s")
            .expect("connect");
        tcp.set_nodelay(true).expect("TCP_NODELAY");
        let mut builder = h2::client::Builder::new();
        if let Some(window) = window {
            builder.initial_window_size(window);
        }
        let (send, conn) = tokio::time::timeout(Duration::from_secs(5), builder.handshake::<_, Bytes>(tcp))
            .await
            .expect("h2c handshake within 5 s")
            .expect("the frontend speaks h2c on its HTTP port");
        H2c { send, conn: tokio::spawn(conn), authority: addr.to_string() }
    }

    /// Opens a `POST /v1/completions` stream carrying `body`.
    pub(crate) async fn post(&mut self, body: Vec<u8>) -> h2::client::ResponseFuture {
        let send = tokio::time::timeout(Duration::from_secs(5), self.send.clone().ready())
            .await
            .expect("a stream slot within 5 s")
            .expect("the connection is open");
        self.send = send;
        let request = hyper::Request::builder()
            .method("POST")
            .uri(format!("http://{}/v1/completions", self.authority))
            .header("content-type", "application/json")
            .body(())
            .expect("a request");
        let (response, mut stream) = self.send.send_request(request, false).expect("open a stream");
        stream.send_data(Bytes::from(body), true).expect("send the body");
        response
    }

    /// Whether the connection has ended (closed by the frontend).
    pub(crate) fn closed(&self) -> bool {
        self.conn.is_finished()
    }
}

impl Drop for H2c {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

/// Awaits a response's head (bounded): its status.
pub(crate) async fn head(response: h2::client::ResponseFuture) -> (u16, h2::RecvStream) {
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("a response head within 10 s")
        .expect("a response head");
    (response.status().as_u16(), response.into_body())
}

/// Reads an HTTP/1.1 response of chunked SSE from `stream`, at most
/// [`READ_PIECE`] per [`READ_EVERY`], until its last chunk, the connection
/// ends, or [`SLOW_READ_LIMIT`] passes.
pub(crate) fn read_slowly_h1(stream: &mut TcpStream) -> SlowRead {
    let started = Instant::now();
    let mut read = SlowRead::default();
    let mut buf = vec![0u8; READ_PIECE];
    while !read.ended && read.error.is_none() && started.elapsed() < SLOW_READ_LIMIT {
        std::thread::sleep(READ_EVERY);
        read.ticks += 1;
        // One piece: reads until READ_PIECE or 20 ms without more data
        // (the 4 KiB buffer holds less than a piece).
        let (mut taken, mut closed) = (0, false);
        let piece_deadline = Instant::now() + Duration::from_millis(20);
        while taken < READ_PIECE && Instant::now() < piece_deadline {
            let left = piece_deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
            stream.set_read_timeout(Some(left)).expect("a read timeout");
            match stream.read(&mut buf[..READ_PIECE - taken]) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => {
                    read.got.extend_from_slice(&buf[..n]);
                    taken += n;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
                Err(e) => {
                    read.error = Some(e.to_string());
                    break;
                }
            }
        }
        read.count(taken == READ_PIECE);
        // The last chunk of a chunked body.
        read.ended = read.got.ends_with(b"\r\n0\r\n\r\n");
        if closed && !read.ended {
            read.error = Some("closed by the frontend".to_owned());
        }
    }
    read
}

/// What a slow reader got.
#[derive(Debug, Default)]
pub(crate) struct SlowRead {
    /// Every byte read.
    pub(crate) got: Vec<u8>,
    /// Reads (one per [`READ_EVERY`]).
    pub(crate) ticks: usize,
    /// Reads that found a whole [`READ_PIECE`] waiting: the reader, not the
    /// engine, set the pace.
    pub(crate) full: usize,
    /// The most reads in a row that found a whole piece.
    pub(crate) longest_full_run: usize,
    /// The current run of such reads.
    run: usize,
    /// The response ended (its last chunk, or the end of the h2 stream).
    pub(crate) ended: bool,
    /// How the stream failed, if it did.
    pub(crate) error: Option<String>,
}

impl SlowRead {
    /// Counts a read that found a whole piece waiting (`full`) or not.
    fn count(&mut self, full: bool) {
        self.run = if full { self.run + 1 } else { 0 };
        self.full += usize::from(full);
        self.longest_full_run = self.longest_full_run.max(self.run);
    }
}

/// Reads an h2 response body at most [`READ_PIECE`] per [`READ_EVERY`],
/// releasing exactly what it read to the flow-control windows, until it
/// ends, fails, or [`SLOW_READ_LIMIT`] passes.
pub(crate) async fn read_slowly_h2(body: &mut h2::RecvStream) -> SlowRead {
    let started = Instant::now();
    let mut read = SlowRead::default();
    let mut waiting = Bytes::new();
    while !read.ended && read.error.is_none() && started.elapsed() < SLOW_READ_LIMIT {
        tokio::time::sleep(READ_EVERY).await;
        read.ticks += 1;
        // One piece: from what has arrived, waiting at most 20 ms for more.
        let mut taken = 0;
        while taken < READ_PIECE {
            if waiting.is_empty() {
                match tokio::time::timeout(Duration::from_millis(20), body.data()).await {
                    Ok(Some(Ok(data))) => waiting = data,
                    Ok(Some(Err(e))) => {
                        read.error = Some(e.to_string());
                        break;
                    }
                    Ok(None) => {
                        read.ended = true;
                        break;
                    }
                    Err(_) => break,
                }
            }
            let piece = waiting.split_to((READ_PIECE - taken).min(waiting.len()));
            taken += piece.len();
            read.got.extend_from_slice(&piece);
            if let Err(e) = body.flow_control().release_capacity(piece.len()) {
                read.error = Some(format!("releasing what was read: {e}"));
                break;
            }
        }
        read.count(taken == READ_PIECE);
    }
    read
}

/// At most the last `n` bytes of `text` (on a character boundary).
pub(crate) fn tail(text: &str, n: usize) -> &str {
    let mut at = text.len().saturating_sub(n);
    while !text.is_char_boundary(at) {
        at += 1;
    }
    &text[at..]
}
