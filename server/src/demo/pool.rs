//! A frontend and its workers as child processes of this binary, over real
//! sockets on 127.0.0.1; stopped when dropped. They share a random event
//! secret (handed over in `LOADGATE_EVENT_SECRET`, never on a command line),
//! so the demo runs with an authenticated event plane.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::demo::args::{Args, MODEL};

/// How long a child may take to print its `listening ...` line.
const STARTUP: Duration = Duration::from_secs(30);

/// A child process of this binary, killed when dropped.
struct Process {
    child: Child,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fresh random event secret: 32 bytes from the OS, hex-encoded.
fn random_secret() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("cannot get random bytes: {e}"))?;
    Ok(crate::secret::to_hex(&bytes))
}

/// Starts `loadgate <args>` with the event secret `secret` and returns it
/// with its `listening ...` line.
fn spawn(args: &[String], secret: &str) -> anyhow::Result<(Process, String)> {
    let exe = std::env::current_exe().context("cannot find the loadgate binary")?;
    let mut child = Command::new(exe)
        .args(args)
        .env("RUST_LOG", "warn")
        .env("LOADGATE_EVENT_SECRET", secret)
        .env_remove("LOADGATE_EVENT_SECRET_PREVIOUS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start loadgate {}", args.join(" ")))?;
    let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    let process = Process { child };
    // Read on a thread, so a child that prints nothing cannot hang the demo;
    // it keeps draining the pipe so the child's writes never fail or block.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = stdout.lines();
        let _ = tx.send(lines.next().and_then(Result::ok).unwrap_or_default());
        for _ in lines {}
    });
    let line = rx
        .recv_timeout(STARTUP)
        .map_err(|_| anyhow::anyhow!("loadgate {} printed no listening line within {STARTUP:?}", args.join(" ")))?;
    anyhow::ensure!(line.starts_with("listening "), "loadgate {} did not start: {line:?}", args.join(" "));
    Ok((process, line.trim().to_owned()))
}

/// The value of `key=` in a `listening ...` line.
fn field(line: &str, key: &str) -> anyhow::Result<String> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .map(str::to_owned)
        .with_context(|| format!("no {key}= in {line:?}"))
}

/// A frontend and its workers, stopped when dropped.
pub(crate) struct Pool {
    pub(crate) http: String,
    _frontend: Process,
    _workers: Vec<Process>,
}

impl Pool {
    pub(crate) fn start(args: &Args, threshold: Option<f64>) -> anyhow::Result<Pool> {
        let secret = random_secret()?;
        let mut frontend_args: Vec<String> = [
            "frontend",
            "--http-host",
            "127.0.0.1",
            "--http-port",
            "0",
            "--event-host",
            "127.0.0.1",
            "--event-port",
            "0",
            "--disable-admin-api",
            "--router-mode",
            &args.router_mode,
        ]
        .map(String::from)
        .into();
        if let Some(t) = threshold {
            frontend_args.extend(["--active-decode-blocks-threshold".to_owned(), t.to_string()]);
        }
        let (frontend, line) = spawn(&frontend_args, &secret)?;
        let http = field(&line, "http")?;
        let events = field(&line, "events")?;
        let workers = (0..args.workers)
            .map(|i| {
                let worker_args = [
                    "worker".to_owned(),
                    "--model".to_owned(),
                    MODEL.to_owned(),
                    "--http-host".to_owned(),
                    "127.0.0.1".to_owned(),
                    "--http-port".to_owned(),
                    "0".to_owned(),
                    "--frontend".to_owned(),
                    events.clone(),
                    "--worker-id".to_owned(),
                    (i + 1).to_string(),
                    "--kv-total-blocks".to_owned(),
                    args.kv_total_blocks.to_string(),
                    "--max-num-batched-tokens".to_owned(),
                    args.max_num_batched_tokens.to_string(),
                    "--decode-step-ms".to_owned(),
                    args.decode_step_ms.to_string(),
                ];
                spawn(&worker_args, &secret).map(|(p, _)| p)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let pool = Pool { http, _frontend: frontend, _workers: workers };
        pool.wait_for_workers(args.workers)?;
        Ok(pool)
    }

    /// Polls the frontend's `/health` until every worker has registered.
    fn wait_for_workers(&self, n: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(async {
            let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
            loop {
                let health = client.get(format!("http://{}/health", self.http)).send().await;
                if let Ok(resp) = health {
                    let v: serde_json::Value = resp.json().await.unwrap_or_default();
                    if v["workers"].as_u64() == Some(n as u64) {
                        return Ok(());
                    }
                }
                anyhow::ensure!(Instant::now() < deadline, "workers did not register with the frontend in time");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    }
}
