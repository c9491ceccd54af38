//! The demo's child processes: a [`Process`] killed when dropped, or when
//! the demo is stopped by a signal ([`stop_children_on_signals`]), and
//! `loadgate <role>` children of this same binary that announce themselves
//! with a `listening ...` line. They share a random event secret (handed over
//! in `LOADGATE_EVENT_SECRET`, never on a command line), so the demo runs
//! with an authenticated event plane.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write as _};
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rustix::process::{kill_process, Pid, Signal};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use signal_hook::low_level::emulate_default_handler;

use crate::demo::log_tail::{keep_tail, TailLimits};

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

/// A pool of child processes that must all run while it is measured.
pub(crate) trait Pooled {
    /// An error naming a child of the pool that has exited.
    fn check_alive(&mut self) -> anyhow::Result<()>;
}

/// A child process, killed (and reaped) when dropped.
#[derive(Debug)]
pub(crate) struct Process {
    child: Child,
}

impl Process {
    /// Starts `command`; the child dies with the value returned, or with
    /// the demo on a signal. Started and listed under one lock, so a signal
    /// handled meanwhile cannot miss it.
    ///
    /// # Errors
    ///
    /// The command cannot start, or the demo is stopping on a signal.
    pub(crate) fn spawn(command: &mut Command) -> std::io::Result<Self> {
        let mut live = live();
        if live.stopping {
            return Err(std::io::Error::other("the demo is stopping"));
        }
        let child = command.spawn()?;
        live.pids.push(child.id());
        Ok(Process { child })
    }

    /// The child's process id.
    pub(crate) fn id(&self) -> u32 {
        self.child.id()
    }

    /// The child's standard output, if piped and not yet taken.
    pub(crate) fn stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// The child's standard error, if piped and not yet taken.
    pub(crate) fn stderr(&mut self) -> Option<ChildStderr> {
        self.child.stderr.take()
    }

    /// Waits up to `within` for the child to exit; its status if it did.
    fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// An error if the child has exited (`what` names it): a pool whose
    /// child died during a run measured something else than its mode.
    pub(crate) fn check_alive(&mut self, what: &str) -> anyhow::Result<()> {
        match self.exited() {
            Some(status) => anyhow::bail!("{what} exited during the run ({status})"),
            None => Ok(()),
        }
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

/// From now on, SIGINT, SIGTERM or SIGHUP kill every child (and remove the
/// demo's tenants file), and then the demo itself by that signal (as
/// without a handler, so a shell sees it):
/// a demo stopped from outside (`kill`, `timeout`, a closed terminal, a
/// cancelled CI job) leaves no llama-server, nats-server or `loadgate`
/// child running. A signal ignored when the demo started (`nohup`, a
/// background job) stays ignored. SIGKILL cannot be caught: its children
/// outlive it.
///
/// # Errors
///
/// The signal handlers could not be installed.
pub(crate) fn stop_children_on_signals() -> anyhow::Result<()> {
    let ignored = ignored_signals();
    let watched: Vec<i32> =
        [SIGINT, SIGTERM, SIGHUP].into_iter().filter(|signal| ignored & (1 << (signal - 1)) == 0).collect();
    let mut signals = Signals::new(&watched).context("cannot install the demo's signal handlers")?;
    std::thread::Builder::new().name("demo-signals".to_owned()).spawn(move || {
        let Some(signal) = signals.forever().next() else { return };
        // Held to the end: a thread that would start, reap or drop a child
        // waits, and cannot end the process first with another status.
        let _live = kill_children();
        // The process ends here without unwinding: what a drop would have
        // removed is removed now (the tenants file, if this demo wrote one).
        let _ = std::fs::remove_file(crate::demo::tenants_file::path());
        // Not `eprintln!`: a closed stderr must not stop this thread before the exit.
        let _ =
            writeln!(std::io::stderr(), "loadgate demo: stopped by signal {signal}; its child processes were killed");
        // Resets the signal to its default action and raises it again.
        let _ = emulate_default_handler(signal);
        std::process::exit(128 + signal);
    })?;
    Ok(())
}

/// The signals this process ignores (bit `n - 1` for signal `n`), from
/// `/proc/self/status` (none if it cannot be read).
fn ignored_signals() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("SigIgn:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .unwrap_or(0)
}

/// Kills every live child; any start from now on is refused. Returns the
/// registry, still locked.
fn kill_children() -> MutexGuard<'static, Live> {
    let mut live = live();
    live.stopping = true;
    for pid in live.pids.drain(..) {
        // A pid still listed is a child not yet reaped: it is ours.
        if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
            let _ = kill_process(pid, Signal::KILL);
        }
    }
    live
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
/// with its `listening ...` line. No `DYN_*` or `LOADGATE_*` variable of
/// the demo's own environment is passed on. A child that does not start is
/// reported with the last lines it wrote to its standard error.
pub(crate) fn spawn_loadgate(args: &[String], secret: &str) -> anyhow::Result<(Process, String)> {
    let exe = std::env::current_exe().context("cannot find the loadgate binary")?;
    let mut command = Command::new(exe);
    // Each mode is the flags the demo gives and nothing else: a variable of the demo's
    // environment that a frontend or worker reads (a threshold, a waiting line, the deprecated
    // shared names such as LOADGATE_HTTP_MAX_CONNECTIONS) would change every mode alike.
    for (name, _) in std::env::vars_os() {
        let name_str = name.to_string_lossy();
        if ["DYN_", "LOADGATE_"].iter().any(|p| name_str.starts_with(p)) {
            command.env_remove(&name);
        }
    }
    command
        .args(args)
        .env("RUST_LOG", "warn")
        .env("LOADGATE_EVENT_SECRET", secret)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut process =
        Process::spawn(&mut command).with_context(|| format!("cannot start loadgate {}", args.join(" ")))?;
    let (said, said_all) = keep_stderr(process.stderr().expect("piped stderr"));
    let stdout = BufReader::new(process.stdout().expect("piped stdout"));
    // Read on a thread, so a child that prints nothing cannot hang the demo;
    // it keeps draining the pipe so the child's writes never fail or block.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = stdout.lines();
        let _ = tx.send(lines.next().and_then(Result::ok).unwrap_or_default());
        for _ in lines {}
    });
    let line = rx.recv_timeout(STARTUP);
    let started = line.as_deref().is_ok_and(|line| line.starts_with("listening "));
    if !started {
        // What it said before it exited (or while it hung), for the error:
        // all of it once it exited and its reader reached the end.
        let _ = process.wait_exit(Duration::from_secs(2));
        let _ = said_all.recv_timeout(Duration::from_secs(2));
        let said: Vec<String> = said.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect();
        let said = said.join("\n");
        let why = match line {
            Ok(_) => "did not start".to_owned(),
            Err(_) => format!("printed no listening line within {STARTUP:?}"),
        };
        anyhow::bail!("loadgate {} {why}; it said:\n{said}", args.join(" "));
    }
    Ok((process, line.expect("started").trim().to_owned()))
}

/// What is kept of a child's standard error for an error message.
const KEPT: TailLimits = TailLimits { lines: 20, bytes: 500 };

/// Reads `stderr` on a thread to its end, whatever its bytes (so the
/// child's writes never block), keeping its last lines ([`KEPT`]); the
/// receiver hears when the end was reached.
fn keep_stderr(stderr: ChildStderr) -> (Arc<Mutex<VecDeque<String>>>, mpsc::Receiver<()>) {
    let kept = Arc::new(Mutex::new(VecDeque::new()));
    let tail = kept.clone();
    let (ended, end) = mpsc::channel();
    std::thread::spawn(move || {
        keep_tail(BufReader::new(stderr), &tail, KEPT);
        let _ = ended.send(());
    });
    (kept, end)
}

/// The value of `key=` in a `listening ...` line.
pub(crate) fn field(line: &str, key: &str) -> anyhow::Result<String> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .map(str::to_owned)
        .with_context(|| format!("no {key}= in {line:?}"))
}
