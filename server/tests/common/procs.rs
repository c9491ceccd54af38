//! Processes: spawn `loadgate` (killed on drop, its stderr kept and
//! printed when a test fails), parse its listening line, read a process's
//! memory from `/proc`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use super::{bin, legacy, legacy_args, signal, STARTUP};

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

/// Runs `loadgate <args>` expecting it to exit by itself within `within`:
/// its exit status (`None`: still running then, and killed) and its stderr.
pub fn exit_within(args: &[&str], within: Duration) -> (Option<std::process::ExitStatus>, String) {
    let mut child =
        Command::new(bin()).args(args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("run loadgate");
    let deadline = Instant::now() + within;
    let mut status = None;
    while status.is_none() && Instant::now() < deadline {
        status = child.try_wait().expect("wait for loadgate");
        std::thread::sleep(Duration::from_millis(20));
    }
    if status.is_none() {
        child.kill().expect("kill loadgate");
    }
    let out = child.wait_with_output().expect("read loadgate's output");
    (status, String::from_utf8_lossy(&out.stderr).into_owned())
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
