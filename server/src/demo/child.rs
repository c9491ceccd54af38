//! The demo's child processes: a [`Process`] killed when dropped, and
//! `loadgate <role>` children of this same binary that announce themselves
//! with a `listening ...` line. They share a random event secret (handed over
//! in `LOADGATE_EVENT_SECRET`, never on a command line), so the demo runs
//! with an authenticated event plane.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context as _;

/// How long a `loadgate` child may take to print its `listening ...` line.
const STARTUP: Duration = Duration::from_secs(30);

/// A child process, killed (and reaped) when dropped.
#[derive(Debug)]
pub(crate) struct Process {
    child: Child,
}

impl Process {
    /// Takes ownership of `child`: it dies with this value.
    pub(crate) fn new(child: Child) -> Self {
        Process { child }
    }

    /// `Some(status)` once the child has exited.
    pub(crate) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fresh random event secret: 32 bytes from the OS, hex-encoded.
pub(crate) fn random_secret() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("cannot get random bytes: {e}"))?;
    Ok(crate::secret::to_hex(&bytes))
}

/// The arguments every demo frontend starts with: loopback listeners on
/// free ports, no admin API, and `router_mode`.
pub(crate) fn frontend_args(router_mode: &str) -> Vec<String> {
    let args = ["frontend", "--http-host", "127.0.0.1", "--http-port", "0", "--event-host", "127.0.0.1"];
    let mut args: Vec<String> = args.map(String::from).into();
    args.extend(["--event-port", "0", "--disable-admin-api", "--router-mode", router_mode].map(String::from));
    args
}

/// Starts `loadgate <args>` with the event secret `secret` and returns it
/// with its `listening ...` line. Frontend and worker variables of the
/// demo's own environment (`DYN_*`, `LOADGATE_FRONTEND_*`,
/// `LOADGATE_WORKER_*`) are not passed on.
pub(crate) fn spawn_loadgate(args: &[String], secret: &str) -> anyhow::Result<(Process, String)> {
    let exe = std::env::current_exe().context("cannot find the loadgate binary")?;
    let mut command = Command::new(exe);
    // Each mode is the flags the demo gives and nothing else: a frontend or worker variable
    // in the demo's environment (a threshold, a waiting line) would change every mode alike.
    for (name, _) in std::env::vars_os() {
        let name_str = name.to_string_lossy();
        if ["DYN_", "LOADGATE_FRONTEND_", "LOADGATE_WORKER_"].iter().any(|p| name_str.starts_with(p)) {
            command.env_remove(&name);
        }
    }
    let mut child = command
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
    let process = Process::new(child);
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
pub(crate) fn field(line: &str, key: &str) -> anyhow::Result<String> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .map(str::to_owned)
        .with_context(|| format!("no {key}= in {line:?}"))
}
