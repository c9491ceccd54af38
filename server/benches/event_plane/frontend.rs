//! The `loadgate frontend` under test: a real process on free 127.0.0.1
//! ports (killed on drop), its `/health` and `/metrics` over plain
//! HTTP/1.0, and its CPU time from `/proc`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The model every simulated worker serves.
pub const MODEL: &str = "event-plane-bench";
/// `--active-decode-blocks-threshold`: a rank is busy above half its blocks.
pub const THRESHOLD: &str = "0.5";
/// How long the frontend may take to print its listening line.
const STARTUP: Duration = Duration::from_secs(20);
/// Registration is over when the registered count stays still this long.
const STALLED: Duration = Duration::from_secs(3);
/// Every HTTP request's bound.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// A running frontend.
pub struct Frontend {
    child: Child,
    /// The event-plane address.
    pub events: SocketAddr,
    /// The inference port (`/health`, `/metrics`).
    http: SocketAddr,
}

impl Frontend {
    /// Starts `bin frontend` for `workers` workers with `idle_ms` as its
    /// idle timeout and silence, `extra` flags after the bench's own; its
    /// stdout and stderr go to `log`.
    pub fn start(bin: &str, workers: usize, idle_ms: u64, extra: &[String], log: &Path) -> Frontend {
        let room = (workers + 64).to_string();
        let idle = idle_ms.to_string();
        let mut args: Vec<String> = [
            "frontend",
            "--http-host",
            "127.0.0.1",
            "--http-port",
            "0",
            "--event-host",
            "127.0.0.1",
            "--event-port",
            "0",
            "--admin-port",
            "0",
            "--model",
            MODEL,
            "--active-decode-blocks-threshold",
            THRESHOLD,
            "--max-event-connections",
            &room,
            "--max-workers",
            &room,
            "--event-idle-timeout-ms",
            &idle,
            "--event-silence-ms",
            &idle,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        args.extend(extra.iter().cloned());
        let log_file = std::fs::File::create(log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
        let mut child = Command::new(bin)
            .args(&args)
            .env_remove("LOADGATE_EVENT_SECRET")
            .env_remove("LOADGATE_EVENT_SECRET_PREVIOUS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {bin}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
            // Keep draining so the frontend never blocks on stdout.
            for _ in lines {}
        });
        let line = rx.recv_timeout(STARTUP).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("no listening line from the frontend within {STARTUP:?} (log: {})", log.display())
        });
        let field = |key: &str| -> SocketAddr {
            let prefix = format!("{key}=");
            let value = line.split_whitespace().find_map(|w| w.strip_prefix(&prefix));
            value.and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no {key}= in {line:?}"))
        };
        let (events, http) = (field("events"), field("http"));
        Frontend { child, events, http }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `GET path`: the body, or why not.
    fn get(&self, path: &str) -> Result<String, String> {
        let mut stream = TcpStream::connect_timeout(&self.http, HTTP_TIMEOUT).map_err(|e| e.to_string())?;
        stream.set_read_timeout(Some(HTTP_TIMEOUT)).map_err(|e| e.to_string())?;
        stream.set_write_timeout(Some(HTTP_TIMEOUT)).map_err(|e| e.to_string())?;
        // HTTP/1.0: the answer has a length or ends with the connection, never chunked.
        write!(stream, "GET {path} HTTP/1.0\r\nHost: bench\r\n\r\n").map_err(|e| e.to_string())?;
        let mut text = String::new();
        stream.read_to_string(&mut text).map_err(|e| e.to_string())?;
        let (_, body) = text.split_once("\r\n\r\n").ok_or_else(|| format!("no body in {text:?}"))?;
        Ok(body.to_owned())
    }

    /// `/health`'s `workers` (registered workers).
    pub fn workers(&self) -> Option<u64> {
        let body = self.get("/health").ok()?;
        let value: serde_json::Value = serde_json::from_str(&body).ok()?;
        value["workers"].as_u64()
    }

    /// Waits (polling `/health` every 50 ms, at most `within`) until `n`
    /// workers are registered, or the count has not grown for
    /// [`STALLED`]: how long it took to reach the last count, and that count.
    pub fn wait_workers(&self, n: u64, since: Instant, within: Duration) -> (Duration, u64) {
        let deadline = Instant::now() + within;
        let (mut best, mut reached) = (0, since.elapsed());
        loop {
            let seen = self.workers().unwrap_or(0);
            if seen > best {
                (best, reached) = (seen, since.elapsed());
            }
            if seen >= n || Instant::now() >= deadline || since.elapsed() >= reached + STALLED {
                return (reached, best);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The event plane's counters from `/metrics`: (Load frames applied,
    /// busy flips), and when they were read (the request's midpoint).
    pub fn applied(&self) -> (u64, u64, Instant) {
        let before = Instant::now();
        let body = self.get("/metrics").unwrap_or_else(|e| panic!("GET /metrics: {e}"));
        let at = before + before.elapsed() / 2;
        let metric = |name: &str| -> u64 {
            let value = body.lines().find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')));
            value
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no {name} in /metrics: this bench needs a frontend that counts them"))
                as u64
        };
        (metric("loadgate_frontend_event_loads_applied_total"), metric("loadgate_frontend_event_busy_flips_total"), at)
    }

    /// Its CPU time so far: utime + stime of the process (`/proc/PID/stat`,
    /// in clock ticks) and, to the nanosecond, of every thread and of the
    /// `event-plane` thread (`/proc/PID/task/TID/schedstat`).
    pub fn cpu(&self) -> Cpu {
        let pid = self.pid();
        let mut cpu = Cpu { stat: stat_cpu(&format!("/proc/{pid}/stat")), ..Cpu::default() };
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for task in tasks.flatten() {
                let ran = schedstat_cpu(&task.path().join("schedstat"));
                cpu.process += ran;
                if std::fs::read_to_string(task.path().join("comm")).is_ok_and(|c| c.trim() == "event-plane") {
                    cpu.plane = ran;
                }
            }
        }
        cpu
    }
}

impl Drop for Frontend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU time of the frontend: `stat` from `/proc/PID/stat` (utime + stime,
/// clock-tick resolution), `process` and `plane` (its event-plane thread)
/// from the threads' `schedstat` (nanoseconds; threads that exited are not
/// counted, and the frontend's threads live as long as it does).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu {
    pub stat: Duration,
    pub process: Duration,
    pub plane: Duration,
}

impl std::ops::Sub for Cpu {
    type Output = Cpu;
    fn sub(self, earlier: Cpu) -> Cpu {
        Cpu {
            stat: self.stat.saturating_sub(earlier.stat),
            process: self.process.saturating_sub(earlier.process),
            plane: self.plane.saturating_sub(earlier.plane),
        }
    }
}

/// utime + stime of a `/proc/…/stat` file.
fn stat_cpu(path: &str) -> Duration {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    // The fields after the command's closing parenthesis start at field 3
    // (state): utime (field 14) and stime (15) are the 12th and 13th.
    let rest = text.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    let ticks = field(11) + field(12);
    let per_second = rustix::param::clock_ticks_per_second().max(1);
    Duration::from_nanos(ticks.saturating_mul(1_000_000_000) / per_second)
}

/// The time on a CPU of a `/proc/…/task/TID/schedstat` file (its first
/// field, in nanoseconds).
fn schedstat_cpu(path: &Path) -> Duration {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    Duration::from_nanos(text.split_whitespace().next().and_then(|f| f.parse().ok()).unwrap_or(0))
}
