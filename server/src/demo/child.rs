//! The demo's child processes: a [`Process`] killed when dropped, or when
//! the demo is stopped by a signal ([`stop_children_on_signals`]), and
//! `loadgate <role>` children of this same binary that announce themselves
//! with a `listening ...` line. They share a random event secret (handed over
//! in `LOADGATE_EVENT_SECRET`, never on a command line), so the demo runs
//! with an authenticated event plane.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Context as _;
use rustix::process::{kill_process, Pid, Signal};
use tokio::signal::unix::{signal, SignalKind};

/// How long a `loadgate` child may take to print its `listening ...` line.
const STARTUP: Duration = Duration::from_secs(30);

/// The children not yet reaped, by pid (a pid here cannot have been
/// reused), and whether the demo is stopping on a signal.
#[derive(Debug)]
struct Live {
    pids: Vec<u32>,
    stopping: bool,
}

static LIVE: Mutex<Live> = Mutex::new(Live { pids: Vec::new(), stopping: false });

fn live() -> MutexGuard<'static, Live> {
    // A panic elsewhere while holding it leaves the list as it was.
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A child process, killed (and reaped) when dropped.
#[derive(Debug)]
pub(crate) struct Process {
    child: Child,
}

impl Process {
    /// Takes ownership of `child`: it dies with this value, or with the
    /// demo on a signal (at once if one already came).
    pub(crate) fn new(mut child: Child) -> Self {
        let mut live = live();
        if live.stopping {
            let _ = child.kill();
        } else {
            live.pids.push(child.id());
        }
        Process { child }
    }

    /// `Some(status)` once the child has exited.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        // Reaped and forgotten under the lock: the signal thread never
        // kills a pid that was reaped (and could be another process's).
        let mut live = live();
        let status = self.child.try_wait().ok().flatten();
        if status.is_some() {
            live.pids.retain(|&pid| pid != self.child.id());
        }
        status
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let mut live = live();
        let _ = self.child.kill();
        let _ = self.child.wait();
        live.pids.retain(|&pid| pid != self.child.id());
    }
}

/// From now on, SIGINT, SIGTERM or SIGHUP kill every child (and any child
/// started after) and exit with 128 + the signal's number: a demo stopped
/// from outside (`kill`, `timeout`, a closed terminal, a cancelled CI job)
/// leaves no llama-server, nats-server or `loadgate` child running. SIGKILL
/// cannot be caught: its children outlive it.
///
/// # Errors
///
/// The signal handlers could not be installed.
pub(crate) fn stop_children_on_signals() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // Installed before this returns: a signal from now on is handled.
    let kinds = [
        (SignalKind::interrupt(), Signal::INT),
        (SignalKind::terminate(), Signal::TERM),
        (SignalKind::hangup(), Signal::HUP),
    ];
    let mut signals = {
        let _context = runtime.enter();
        kinds
            .into_iter()
            .map(|(kind, number)| Ok((signal(kind)?, number.as_raw())))
            .collect::<std::io::Result<Vec<_>>>()
            .context("cannot install the demo's signal handlers")?
    };
    std::thread::Builder::new().name("demo-signals".to_owned()).spawn(move || {
        let number = runtime.block_on(async move {
            let waits = signals.iter_mut().map(|(signal, number)| {
                let number = *number;
                Box::pin(async move {
                    signal.recv().await;
                    number
                })
            });
            futures_util::future::select_all(waits).await.0
        });
        kill_children();
        eprintln!("loadgate demo: stopped by signal {number}; its child processes were killed");
        std::process::exit(128 + number);
    })?;
    Ok(())
}

/// Kills every live child, and any started from now on.
fn kill_children() {
    let mut live = live();
    live.stopping = true;
    for pid in live.pids.drain(..) {
        // A pid still listed is a child not yet reaped: it is ours.
        if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
            let _ = kill_process(pid, Signal::KILL);
        }
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
