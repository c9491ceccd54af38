//! Shared helpers of the real-process tests: spawn `loadgate` (killed on
//! drop, its stderr kept and printed when a test fails), parse its listening
//! line, read a process's memory from `/proc`, a raw event-plane client that
//! speaks the handshake of spec section 2 (or not), the request proof, and a
//! fake worker that counts what it receives.
//!
//! Every wait here is bounded in time; every socket has a timeout.

#![allow(dead_code)]

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::BytesMut;
use hmac::{Hmac, Mac};
use loadgate::wire::{self, Frame, Nonce};
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};
use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The shared secret the suite's frontends and workers are given.
pub const SECRET: &str = "attack-suite-secret-0123456789abcdef";
/// A secret of the right shape that is not theirs.
pub const WRONG_SECRET: &str = "not-the-secret-at-all-0123456789ab";
/// How long a process may take to print its listening line.
pub const STARTUP: Duration = Duration::from_secs(20);
/// The frontend's handshake timeout (spec section 2).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// The frontend's deregistration grace (`frontend::DEREGISTER_GRACE`).
pub const GRACE: Duration = Duration::from_millis(500);

/// The request proof header (spec section 1).
pub const PROOF_HEADER: &str = "x-loadgate-proof";

/// The binary under test. `ATTACKS_LEGACY_BIN=/path/to/old/loadgate` runs the
/// suite against a build from before issue 9 (its CLI has none of the new
/// flags, which are then left out), to show that each attack succeeds there.
pub fn bin() -> String {
    std::env::var("ATTACKS_LEGACY_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_loadgate").to_owned())
}

/// True when running against a build from before issue 9.
pub fn legacy() -> bool {
    std::env::var_os("ATTACKS_LEGACY_BIN").is_some()
}

/// Flags (each with one value) that builds before issue 9 do not know.
const NEW_FRONTEND_FLAGS: &[&str] = &[
    "--http-host",
    "--event-host",
    "--admin-host",
    "--admin-port",
    "--model",
    "--max-dp-size",
    "--max-event-connections",
    "--max-workers",
    "--max-models",
    "--max-name-len",
    "--event-read-budget",
    "--http-body-limit-mb",
    "--http-body-budget-mb",
    "--event-idle-timeout-ms",
    "--event-silence-ms",
    "--max-pending-handshakes",
];
const NEW_WORKER_FLAGS: &[&str] = &["--http-host", "--advertise-addr", "--http-body-limit-mb"];

fn legacy_args(args: &[&str]) -> Vec<String> {
    let new = match args.first() {
        Some(&"frontend") => NEW_FRONTEND_FLAGS,
        Some(&"worker") => NEW_WORKER_FLAGS,
        _ => &[],
    };
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if new.contains(arg) {
            it.next();
        } else {
            out.push((*arg).to_owned());
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Test isolation: timing- and memory-sensitive tests run alone.

// An async lock: each test runs on its own runtime and holds it across awaits.
static BOX: RwLock<()> = RwLock::const_new(());

/// Taken by ordinary tests: they may run side by side.
pub async fn shared() -> RwLockReadGuard<'static, ()> {
    BOX.read().await
}

/// Taken by tests that measure time or memory: no other test runs meanwhile.
pub async fn exclusive() -> RwLockWriteGuard<'static, ()> {
    BOX.write().await
}

// ---------------------------------------------------------------------------
// Processes.

/// Most of a child's stderr kept in memory.
const STDERR_KEEP: usize = 1 << 20;

/// A child process, killed on drop; its stderr is kept and printed if the
/// test is failing when it drops.
pub struct Proc {
    child: Child,
    pub name: String,
    stderr: Arc<Mutex<String>>,
}

impl Proc {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its stderr so far (the logs).
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits (bounded) until its stderr contains `needle`.
    pub fn wait_log(&self, needle: &str, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            if self.stderr().contains(needle) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Its memory now.
    pub fn mem(&self) -> Mem {
        mem(self.pid())
    }

    /// Sends it SIGTERM.
    pub fn terminate(&self) {
        signal(self.pid(), "TERM");
    }

    /// Waits (bounded) for it to exit: its status, or `None` if it still runs.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Kills it now (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let text = self.stderr();
            let tail = &text[text.len().saturating_sub(8192)..];
            let tail = tail.get(tail.find('\n').map_or(0, |i| i + 1)..).unwrap_or(tail);
            eprintln!("----- stderr of {} (last 8 KiB) -----\n{tail}----- end of {} -----", self.name, self.name);
        }
    }
}

/// Starts `loadgate <args>` with `env` and waits (bounded) for its first
/// stdout line; returns the process and that line.
pub fn spawn(name: &str, args: &[&str], env: &[(&str, &str)]) -> (Proc, String) {
    spawn_within(name, args, env, STARTUP)
}

/// As [`spawn`], waiting at most `within` (instead of [`STARTUP`]) for the
/// first stdout line.
pub fn spawn_within(name: &str, args: &[&str], env: &[(&str, &str)], within: Duration) -> (Proc, String) {
    let args: Vec<String> = if legacy() { legacy_args(args) } else { args.iter().map(|s| (*s).to_owned()).collect() };
    let mut command = Command::new(bin());
    command.args(&args);
    launch(name, command, &args, env, within)
}

/// As [`spawn`], under a soft file limit of `nofile` descriptors when given
/// (`sh -c 'ulimit -n N && exec loadgate …'`: the shell becomes `loadgate`,
/// so the pid and the exit status are its own).
pub fn spawn_limited(name: &str, nofile: Option<u32>, args: &[&str], env: &[(&str, &str)]) -> (Proc, String) {
    let script = match nofile {
        Some(n) => format!("ulimit -n {n} && exec \"$0\" \"$@\""),
        None => "exec \"$0\" \"$@\"".to_owned(),
    };
    let mut command = Command::new("sh");
    command.arg("-c").arg(script).arg(bin()).args(args);
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    launch(name, command, &args, env, STARTUP)
}

/// Starts `command` (with `RUST_LOG=warn`, no secret from the caller's
/// environment, then `env`), keeps its stderr, and waits (bounded) for its
/// first stdout line.
fn launch(name: &str, mut command: Command, args: &[String], env: &[(&str, &str)], within: Duration) -> (Proc, String) {
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    command.env("RUST_LOG", "warn");
    // No secret leaks in from the developer's shell.
    for var in ["LOADGATE_EVENT_SECRET", "LOADGATE_EVENT_SECRET_PREVIOUS", "LOADGATE_ADMIN_TOKEN"] {
        command.env_remove(var);
    }
    for (k, v) in env {
        command.env(k, v);
    }
    let mut child = command.spawn().expect("spawn loadgate");
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr_pipe = child.stderr.take().expect("piped stderr");
    let stderr = Arc::new(Mutex::new(String::new()));
    let sink = stderr.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr_pipe).lines() {
            let Ok(line) = line else { break };
            let mut text = sink.lock().unwrap_or_else(|e| e.into_inner());
            if text.len() > STDERR_KEEP {
                let cut = text.len() - STDERR_KEEP / 2;
                let cut = (cut..text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
                text.drain(..cut);
            }
            text.push_str(&line);
            text.push('\n');
        }
    });
    let proc = Proc { child, name: name.to_owned(), stderr };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(line)) = lines.next() {
            let _ = tx.send(line);
        }
        // Keep draining so the child never blocks on a full pipe.
        for _ in lines {}
    });
    match rx.recv_timeout(within) {
        Ok(line) => (proc, line),
        Err(_) => {
            panic!("{name} printed no listening line within {within:?}; args {args:?}; stderr:\n{}", proc.stderr())
        }
    }
}

/// The value of `key=` in a listening line (`None` when absent).
pub fn field(line: &str, key: &str) -> Option<String> {
    let prefix = format!("{key}=");
    line.split_whitespace().find_map(|w| w.strip_prefix(&prefix)).map(str::to_owned)
}

/// The value of `key=` in a listening line; panics when absent.
pub fn expect_field(line: &str, key: &str) -> String {
    field(line, key).unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// A process's resident memory, from `/proc/PID/status`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Mem {
    /// VmRSS, KiB.
    pub rss_kib: u64,
    /// VmHWM (peak RSS), KiB.
    pub hwm_kib: u64,
}

impl Mem {
    pub fn rss_mib(&self) -> f64 {
        self.rss_kib as f64 / 1024.0
    }

    pub fn hwm_mib(&self) -> f64 {
        self.hwm_kib as f64 / 1024.0
    }
}

/// Reads VmRSS and VmHWM of `pid` (zeros when unreadable).
pub fn mem(pid: u32) -> Mem {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    Mem { rss_kib: kib("VmRSS:"), hwm_kib: kib("VmHWM:") }
}

// ---------------------------------------------------------------------------
// Frontend and workers.

/// An HTTP client whose every request is bounded.
pub fn client() -> reqwest::Client {
    client_within(Duration::from_secs(15))
}

/// How long a [`long_client`] request may take: longer than any test's
/// longest stream.
pub const LONG_REQUEST: Duration = Duration::from_secs(60);

/// An HTTP client for tests that hold long streams: every request is
/// bounded by [`LONG_REQUEST`].
pub fn long_client() -> reqwest::Client {
    client_within(LONG_REQUEST)
}

/// An HTTP client whose every request is bounded by `timeout` (and every
/// connect by 2 s).
pub fn client_within(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder().timeout(timeout).connect_timeout(Duration::from_secs(2)).build().expect("reqwest client")
}

/// A `loadgate frontend` process and its three addresses.
pub struct Frontend {
    pub proc: Proc,
    /// `http://HOST:PORT` of the inference port.
    pub http: String,
    /// The event-plane address.
    pub events: SocketAddr,
    /// `http://HOST:PORT` of the admin listener (`None`: off; a legacy
    /// build serves admin routes on the inference port).
    pub admin: Option<String>,
    pub client: reqwest::Client,
}

/// The env that hands `secret` to a process (none: no secret).
pub fn secret_env(secret: Option<&str>) -> Vec<(&'static str, String)> {
    secret.map(|s| vec![("LOADGATE_EVENT_SECRET", s.to_owned())]).unwrap_or_default()
}

impl Frontend {
    /// A frontend on free 127.0.0.1 ports with `secret` (from
    /// `LOADGATE_EVENT_SECRET`) and `extra` flags.
    pub fn start(secret: Option<&str>, extra: &[&str]) -> Frontend {
        let env = secret_env(secret);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Frontend::start_with_env(&env, extra)
    }

    /// A frontend on free 127.0.0.1 ports with `env` and `extra` flags.
    pub fn start_with_env(env: &[(&str, &str)], extra: &[&str]) -> Frontend {
        let mut args =
            vec!["frontend", "--http-host", "127.0.0.1", "--http-port", "0", "--event-port", "0", "--admin-port", "0"];
        args.extend_from_slice(extra);
        let (proc, line) = spawn("frontend", &args, env);
        let http = field(&line, "http").unwrap_or_else(|| panic!("no http= in {line:?}"));
        let events = field(&line, "events").unwrap_or_else(|| panic!("no events= in {line:?}"));
        let admin = match field(&line, "admin") {
            Some(a) if a == "off" => None,
            Some(a) => Some(format!("http://{a}")),
            None if legacy() => Some(format!("http://{http}")),
            None => panic!("no admin= in {line:?}"),
        };
        Frontend {
            proc,
            http: format!("http://{http}"),
            events: events.parse().unwrap_or_else(|e| panic!("events={events}: {e}")),
            admin,
            client: client(),
        }
    }

    /// The suite's usual frontend: the secret, and `extra`.
    pub fn secured(extra: &[&str]) -> Frontend {
        Frontend::start(Some(SECRET), extra)
    }

    /// `GET /health`'s `workers` (None when it did not answer JSON: 200
    /// with workers, 503 with none).
    pub async fn workers(&self) -> Option<u64> {
        let response = self.client.get(format!("{}/health", self.http)).send().await.ok()?;
        if !matches!(response.status().as_u16(), 200 | 503) {
            return None;
        }
        response.json::<Value>().await.ok()?["workers"].as_u64()
    }

    /// Waits (bounded) until `/health` reports `n` workers.
    pub async fn wait_workers(&self, n: u64, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let seen = self.workers().await;
            if seen == Some(n) {
                return;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {n} workers (last seen {seen:?})");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// `GET /v1/models`: the ids and the size of the answer in bytes.
    pub async fn models(&self) -> (Vec<String>, usize) {
        let response = self.client.get(format!("{}/v1/models", self.http)).send().await.expect("GET /v1/models");
        assert_eq!(response.status(), 200, "GET /v1/models");
        let text = response.text().await.expect("models body");
        let value: Value = serde_json::from_str(&text).expect("models JSON");
        let ids = value["data"]
            .as_array()
            .map(|a| a.iter().filter_map(|m| m["id"].as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        (ids, text.len())
    }

    /// One small completion for `model`: status and body.
    pub async fn complete(&self, model: &str) -> (u16, String) {
        complete(&self.client, &self.http, model, None).await
    }

    /// Its memory now.
    pub fn mem(&self) -> Mem {
        self.proc.mem()
    }

    /// The frontend still serves `model` (a normal request gets 200, not
    /// from the impostor) and its RSS is under `max_rss_mib`. Returns the RSS.
    pub async fn assert_still_serving(&self, model: &str, max_rss_mib: f64) -> Mem {
        let (status, body) = self.complete(model).await;
        assert_eq!(status, 200, "a normal request after the attack: {body}");
        assert!(!body.contains(IMPOSTOR_MARK), "a normal request was answered by the impostor: {body}");
        assert_eq!(self.workers().await.map(|_| ()), Some(()), "/health answers");
        let mem = self.mem();
        eprintln!("frontend after the attack: VmRSS {:.1} MiB, VmHWM {:.1} MiB", mem.rss_mib(), mem.hwm_mib());
        assert!(mem.rss_mib() < max_rss_mib, "frontend RSS {:.1} MiB >= {max_rss_mib} MiB", mem.rss_mib());
        mem
    }
}

/// A small completion request body.
pub fn small_request(model: &str) -> Value {
    json!({"model": model, "prompt": "hello world", "max_tokens": 2})
}

/// POSTs one small completion to `base` (`http://HOST:PORT`), with an optional
/// proof header value.
pub async fn complete(client: &reqwest::Client, base: &str, model: &str, proof: Option<&str>) -> (u16, String) {
    let mut request = client.post(format!("{base}/v1/completions")).json(&small_request(model));
    if let Some(proof) = proof {
        request = request.header(PROOF_HEADER, proof);
    }
    match request.send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            (status, response.text().await.unwrap_or_default())
        }
        Err(e) => (0, format!("request failed: {e}")),
    }
}

/// A `loadgate worker` process.
pub struct Worker {
    pub proc: Proc,
    /// `http://HOST:PORT`.
    pub http: String,
}

/// A simulated worker for `model` on a free 127.0.0.1 port, pushing to
/// `events` (none: standalone), with `secret` and `extra` flags.
pub fn worker(events: Option<SocketAddr>, model: &str, secret: Option<&str>, extra: &[&str]) -> Worker {
    let env = secret_env(secret);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    worker_with_env(events, model, &env, extra)
}

/// A simulated worker as [`worker`], with `env` instead of a secret.
pub fn worker_with_env(events: Option<SocketAddr>, model: &str, env: &[(&str, &str)], extra: &[&str]) -> Worker {
    let events = events.map(|e| e.to_string());
    let mut args = vec!["worker", "--http-host", "127.0.0.1", "--http-port", "0", "--model", model];
    // Fast steps unless the test names its own.
    if !extra.contains(&"--decode-step-ms") {
        args.extend(["--decode-step-ms", "1"]);
    }
    if let Some(events) = &events {
        args.extend(["--frontend", events.as_str()]);
    }
    args.extend_from_slice(extra);
    let (proc, line) = spawn("worker", &args, env);
    let http = field(&line, "http").unwrap_or_else(|| panic!("no http= in {line:?}"));
    Worker { proc, http: format!("http://{http}") }
}

// ---------------------------------------------------------------------------
// The request proof, exactly as spec section 1 defines it (HMAC-SHA256; the
// handshake MACs come from the library: `loadgate::wire::{proof_mac, welcome_mac}`).

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

/// The milliseconds since the Unix epoch now.
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The request proof header value for `METHOD PATH` with `body` at `unix_ms`:
/// `v2.<unix_ms>.<hex SHA-256(body)>.<hex HMAC(secret,
/// "loadgate-request-v2\n<ms>\n<METHOD> <PATH>\n<hex SHA-256(body)>")>`.
pub fn request_proof(secret: &[u8], method: &str, path: &str, body: &[u8], unix_ms: u64) -> String {
    let hex = |bytes: &[u8]| -> String { bytes.iter().map(|b| format!("{b:02x}")).collect() };
    let digest = hex(&Sha256::digest(body));
    let message = format!("loadgate-request-v2\n{unix_ms}\n{method} {path}\n{digest}");
    let mac = hmac(secret, &[message.as_bytes()]);
    format!("v2.{unix_ms}.{digest}.{}", hex(&mac))
}

/// The bytes [`complete`] sends for `model`.
pub fn small_body(model: &str) -> Vec<u8> {
    serde_json::to_vec(&small_request(model)).expect("a JSON value serialises")
}

/// A nonce for tests (need not be cryptographic here).
pub fn random_nonce() -> Nonce {
    std::array::from_fn(|_| fastrand::u8(..))
}

/// `frame`'s bytes on the wire.
pub fn encoded(frame: &Frame) -> Vec<u8> {
    let mut buf = BytesMut::new();
    wire::encode(frame, &mut buf).expect("a frame the suite builds encodes");
    buf.to_vec()
}

// ---------------------------------------------------------------------------
// A raw event-plane client.

/// How long a client waits for the frontend's Challenge.
const CHALLENGE_WAIT: Duration = Duration::from_secs(3);
/// A legacy frontend sends no Challenge: how long to wait before going on.
const LEGACY_CHALLENGE_WAIT: Duration = Duration::from_millis(200);

/// One TCP connection to a frontend's event port, driven by hand.
pub struct EventConn {
    pub stream: TcpStream,
    /// Bytes read but not yet decoded.
    pending: BytesMut,
    /// The Challenge's nonce, once read.
    pub frontend_nonce: Option<Nonce>,
}

/// What a completed handshake sent: the Proof frame (for a replay).
#[derive(Clone, Debug)]
pub struct Handshake {
    pub proof_frame: Vec<u8>,
}

impl EventConn {
    /// Connects (bounded).
    pub fn connect(addr: SocketAddr) -> io::Result<EventConn> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_nodelay(true)?;
        EventConn::from_stream(stream)
    }

    /// Wraps an open connection (either side of the event plane).
    pub fn from_stream(stream: TcpStream) -> io::Result<EventConn> {
        stream.set_nonblocking(false)?;
        stream.set_write_timeout(Some(Duration::from_secs(2)))?;
        Ok(EventConn { stream, pending: BytesMut::new(), frontend_nonce: None })
    }

    /// Reads one frame (bounded); `Ok(None)` when none completed in time,
    /// an error when the peer closed or sent bytes that do not decode.
    pub fn read_frame(&mut self, within: Duration) -> io::Result<Option<Frame>> {
        let deadline = Instant::now() + within;
        let mut buf = [0u8; 4096];
        loop {
            match wire::decode(&mut self.pending) {
                Ok(Some(frame)) => return Ok(Some(frame)),
                Ok(None) => {}
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.stream.set_read_timeout(Some(left))?;
            match self.stream.read(&mut buf) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed by the peer")),
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads the frontend's Challenge (bounded); `None` when none came.
    pub fn read_challenge(&mut self, within: Duration) -> io::Result<Option<Nonce>> {
        let nonce = match self.read_frame(within)? {
            Some(Frame::Challenge { nonce }) => Some(nonce),
            Some(other) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} instead of a Challenge", other.kind_name()),
                ))
            }
            None => None,
        };
        self.frontend_nonce = nonce;
        Ok(nonce)
    }

    /// The whole worker side of the handshake with `secret`: reads the
    /// Challenge, sends a Proof, reads the Welcome and checks its MAC.
    /// Against a legacy frontend (no Challenge) it returns at once.
    pub fn handshake(&mut self, secret: &str) -> Result<Handshake, String> {
        let wait = if legacy() { LEGACY_CHALLENGE_WAIT } else { CHALLENGE_WAIT };
        let Some(frontend_nonce) = self.read_challenge(wait).map_err(|e| format!("reading the challenge: {e}"))? else {
            if legacy() {
                return Ok(Handshake { proof_frame: Vec::new() });
            }
            return Err(format!("no Challenge within {wait:?}"));
        };
        let nonce = random_nonce();
        let mac = wire::proof_mac(secret.as_bytes(), &frontend_nonce, &nonce);
        let proof_frame = encoded(&Frame::Proof { nonce, mac });
        self.send_raw(&proof_frame).map_err(|e| format!("sending the proof: {e}"))?;
        match self.read_frame(Duration::from_secs(3)).map_err(|e| format!("reading the welcome: {e}"))? {
            Some(Frame::Welcome { mac })
                if wire::verify_welcome_mac(secret.as_bytes(), &frontend_nonce, &nonce, &mac) =>
            {
                Ok(Handshake { proof_frame })
            }
            Some(Frame::Welcome { .. }) => Err("the Welcome's MAC does not verify".into()),
            Some(other) => Err(format!("{} instead of a Welcome", other.kind_name())),
            None => Err("no Welcome within 3 s".into()),
        }
    }

    /// Connects and completes the handshake with `secret` (panics if refused).
    pub fn authenticated(addr: SocketAddr, secret: &str) -> EventConn {
        let mut conn = EventConn::connect(addr).expect("connect to the event port");
        conn.handshake(secret).unwrap_or_else(|e| panic!("handshake with the right secret failed: {e}"));
        conn
    }

    /// Writes `frame`.
    pub fn send(&mut self, frame: &Frame) -> io::Result<()> {
        let mut buf = BytesMut::new();
        wire::encode(frame, &mut buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        self.send_raw(&buf)
    }

    /// Writes raw bytes.
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// True when the frontend closes this connection within `within`
    /// (EOF or reset); bytes it sends meanwhile are skipped.
    pub fn closed_within(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut buf = [0u8; 1024];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            if self.stream.set_read_timeout(Some(left)).is_err() {
                return true;
            }
            match self.stream.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return true,
            }
        }
    }
}

/// A Register frame.
pub fn register(worker: u64, incarnation: u64, dp_size: u32, model: &str, http_addr: &str) -> Frame {
    Frame::Register { worker, incarnation, dp_size, model: model.to_owned(), http_addr: http_addr.to_owned() }
}

// ---------------------------------------------------------------------------
// A fake worker (the impostor's endpoint).

/// What the fake worker puts in its answers, to tell them apart.
pub const IMPOSTOR_MARK: &str = "IMPOSTOR-ANSWER";

/// A tiny HTTP server on 127.0.0.1 that answers every request with 200 and
/// counts requests and bytes. Stops on drop.
pub struct FakeWorker {
    pub addr: SocketAddr,
    requests: Arc<AtomicUsize>,
    bytes: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeWorker {
    pub fn start() -> FakeWorker {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fake worker");
        listener.set_nonblocking(true).expect("nonblocking listener");
        let addr = listener.local_addr().expect("fake worker address");
        let requests = Arc::new(AtomicUsize::new(0));
        let bytes = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, b, s) = (requests.clone(), bytes.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            // Acquire: pairs with the Release store in drop.
            while !s.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (r, b) = (r.clone(), b.clone());
                        std::thread::spawn(move || serve_fake(stream, &r, &b));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        FakeWorker { addr, requests, bytes, stop, thread: Some(thread) }
    }

    /// Requests received so far.
    pub fn requests(&self) -> usize {
        // Relaxed: a counter read after the fact.
        self.requests.load(Ordering::Relaxed)
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

/// Serves one connection of the fake worker: one request, 200, close.
fn serve_fake(mut stream: TcpStream, requests: &AtomicUsize, bytes: &AtomicU64) {
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
    while body_seen < length {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                // Relaxed: a counter.
                bytes.fetch_add(n as u64, Ordering::Relaxed);
                body_seen += n;
            }
        }
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

// ---------------------------------------------------------------------------
// Faults: signals, metrics, load.

/// Sends `signal` (a name such as `STOP`, `CONT`, `TERM`, `KILL`) to `pid`.
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill").args([format!("-{signal}"), pid.to_string()]).status().expect("run kill");
    assert!(status.success(), "kill -{signal} {pid} failed");
}

/// The sum of every sample of `name` (with any labels) in a text
/// exposition; `None` when no sample is there.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = match line.rsplit_once(' ') {
            Some(parts) => parts,
            None => continue,
        };
        let bare = series.split('{').next().unwrap_or(series);
        if bare == name {
            if let Ok(v) = value.parse::<f64>() {
                *found.get_or_insert(0.0) += v;
            }
        }
    }
    found
}

/// `GET base/metrics` as text (empty when it did not answer).
pub async fn metrics_text(client: &reqwest::Client, base: &str) -> String {
    match client.get(format!("{base}/metrics")).send().await {
        Ok(response) => response.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// One answered (or failed) request of a load run.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// When it was sent, from the run's start.
    pub sent: Duration,
    /// How long it took.
    pub took: Duration,
    /// The status (0: no HTTP answer).
    pub status: u16,
    /// The body, or the transport error.
    pub body: String,
}

/// Sends small completions for `model` to `base` from `clients` concurrent
/// loops until `run_for` has passed (at most `max_each` per loop); every
/// request bounded by `timeout`. Returns every outcome, in no order.
pub async fn load(
    base: &str,
    model: &str,
    clients: usize,
    run_for: Duration,
    max_each: usize,
    timeout: Duration,
) -> Vec<Outcome> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let client = client_within(timeout);
        let base = base.to_owned();
        let model = model.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            while started.elapsed() < run_for && seen.len() < max_each {
                let sent = started.elapsed();
                let t = Instant::now();
                let (status, body) = complete(&client, &base, &model, None).await;
                seen.push(Outcome { sent, took: t.elapsed(), status, body });
            }
            seen
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("a load loop panicked"));
    }
    all
}

/// How many outcomes had each status, sorted by status.
pub fn by_status(outcomes: &[Outcome]) -> Vec<(u16, usize)> {
    let mut counts = std::collections::BTreeMap::new();
    for o in outcomes {
        *counts.entry(o.status).or_insert(0) += 1;
    }
    counts.into_iter().collect()
}
