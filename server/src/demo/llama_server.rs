//! One llama.cpp `llama-server` on a free 127.0.0.1 port, killed when
//! dropped: `--parallel 4 --ctx-size 2048 --threads 1 --metrics --no-webui`
//! (4 slots of 512 tokens, one core), the prompt cache capped at 256 MiB,
//! and `HTTP_THREADS` connection threads.
//! Ready once `GET /health` answers 200; the last lines of its log are kept
//! (bounded) to explain a server that does not come up.

use std::collections::VecDeque;
use std::io::BufReader;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::demo::child::Process;
use crate::demo::install::LlamaInstall;
use crate::demo::log_tail::{keep_tail, TailLimits};

/// Slots (concurrent sequences) per server.
pub(crate) const SLOTS: u32 = 4;

/// llama-server's `--threads-http`: one per open connection; a connection
/// past them waits, accepted but unread, in cpp-httplib's queue, where
/// `requests_deferred` does not count it. Above what the runs without
/// shedding keep open (at 3x about 250 requests per server at 11 req/s of
/// capacity), so that every waiting request is counted.
const HTTP_THREADS: u32 = 512;

/// How long a server may take to load the model and answer `/health`.
const START_WAIT: Duration = Duration::from_secs(60);

/// Attempts at a free port (another process may take the one picked first).
const PORT_ATTEMPTS: usize = 3;

/// Log lines kept, and bytes kept of each.
const LOG_TAIL: TailLimits = TailLimits { lines: 12, bytes: 300 };

/// A running `llama-server`.
#[derive(Debug)]
pub(crate) struct LlamaServer {
    /// Its base URL, `http://127.0.0.1:PORT`.
    pub(crate) url: String,
    pub(crate) process: Process,
}

impl LlamaServer {
    /// Starts a server of `install`'s model under the name `alias` and waits
    /// until it is healthy.
    ///
    /// # Errors
    ///
    /// It cannot be started, exits, or is not healthy within [`START_WAIT`]
    /// (the message quotes the end of its log).
    pub(crate) fn start(install: &LlamaInstall, alias: &str) -> anyhow::Result<Self> {
        let mut last_error = None;
        for _ in 0..PORT_ATTEMPTS {
            match Self::start_once(install, alias) {
                Ok(server) => return Ok(server),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.expect("at least one attempt"))
    }

    fn start_once(install: &LlamaInstall, alias: &str) -> anyhow::Result<Self> {
        let port = free_port()?;
        let mut command = Command::new(&install.server);
        command
            .arg("-m")
            .arg(&install.model)
            .args(["--alias", alias, "--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--parallel", &SLOTS.to_string(), "--ctx-size", "2048", "--threads", "1"])
            .args(["--metrics", "--no-webui", "--cache-ram", "256", "--threads-http", &HTTP_THREADS.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut process =
            Process::spawn(&mut command).with_context(|| format!("cannot start {}", install.server.display()))?;
        let log = Arc::new(Mutex::new(VecDeque::with_capacity(LOG_TAIL.lines)));
        let stderr = process.stderr().expect("piped stderr");
        let tail = Arc::clone(&log);
        // Drains the log for the server's whole life, so its writes never block.
        std::thread::spawn(move || keep_tail(BufReader::new(stderr), &tail, LOG_TAIL));
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + START_WAIT;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let why = runtime.block_on(async {
            // Its own children on 127.0.0.1: never through a proxy the environment names.
            let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).no_proxy().build()?;
            loop {
                let health = client.get(format!("{url}/health")).send().await;
                if health.is_ok_and(|r| r.status().is_success()) {
                    return anyhow::Ok(None);
                }
                if let Some(status) = process.exited() {
                    return Ok(Some(format!("exited ({status})")));
                }
                if Instant::now() >= deadline {
                    return Ok(Some(format!("was not healthy within {START_WAIT:?}")));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })?;
        let Some(why) = why else { return Ok(LlamaServer { url, process }) };
        let tail = log.lock().map(|l| Vec::from(l.clone()).join("\n")).unwrap_or_default();
        anyhow::bail!("llama-server on port {port} {why}; the end of its log:\n{tail}")
    }
}

/// A port nobody listens on right now (the kernel's pick, released at once).
fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(listener.local_addr()?.port())
}
