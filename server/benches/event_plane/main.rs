//! The event plane at N simulated workers: today's wire format, simulated
//! senders, a real `loadgate frontend` on 127.0.0.1 (issue 22).
//!
//! ```sh
//! cargo bench -p loadgate-server --bench event_plane -- --workers 10000 --flip-percent 10 --seconds 5
//! ```
//!
//! Phases, each bounded in time:
//!
//! 1. **Registration.** N connections to the event port (in one loop, or
//!    paced with `--connect-batch`/`--connect-pause-ms`), one Register
//!    each, all in one model; the frontend's CPU (utime + stime from
//!    `/proc/PID/stat`, and its `event-plane` thread's) from before the
//!    first connect until `/health` counts N workers.
//! 2. **Hold.** Nothing is sent for `--hold` seconds (the frontend's idle
//!    timeout and silence are set past it, so only TCP can close a
//!    connection); then how many connections are still open on each side
//!    (`/proc/net/tcp`), why the others closed (the socket's error), how
//!    many workers are registered, and the kernel's `TcpExt` counters
//!    before and after (`TCPAbortOnTimeout`, `ListenOverflows`, …).
//! 3. **Load.** One thread writes Load frames to every open connection,
//!    `--frames-per-write` per write, round-robin, as fast as the sockets
//!    take them; `--flip-percent` of them move their worker's load across
//!    the threshold. After `--warmup` seconds, the frontend's counter of
//!    applied Load frames (`loadgate_frontend_event_loads_applied_total` on
//!    `/metrics`) is read twice, `--seconds` apart: reports applied per
//!    second, by the frontend, not as written.
//!
//! The frontend's log goes to `target/tmp/event_plane-frontend.log`.

mod frontend;
mod kernel;
mod mesh;
mod senders;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use frontend::{Cpu, Frontend};
use kernel::{Netstat, PortSockets};
use senders::Pace;

const USAGE: &str = "\
event_plane [--workers N] [--flip-percent P] [--seconds S] [--warmup S] [--hold S]
            [--connect-batch K --connect-pause-ms MS] [--frames-per-write F]
            [--frontends K --rate R] [--bin PATH] [--frontend-arg FLAG]...
  --workers N           simulated workers, one connection each (default 1000)
  --flip-percent P      % of Load frames that flip their worker's busy bit (default 0)
  --seconds S           measured seconds of the load phase (default 5; 0 skips it)
  --warmup S            load-phase seconds before the measurement (default 1)
  --hold S              quiet seconds after registration (default 15; 0 skips it)
  --connect-batch K     pause after every K connects (default 0: one loop)
  --connect-pause-ms MS the pause (default 10)
  --frames-per-write F  Load frames per write per connection (default 64)
  --frontends K         K frontends, every worker connected to each (the mesh; default 1)
  --rate R              loads a second in all, each written to every frontend (default 0:
                        as fast as the sockets take them; needed with --frontends > 1)
  --bin PATH            the loadgate binary (default: this workspace's)
  --frontend-arg FLAG   one more frontend argument (repeatable)";

/// The command line.
pub(crate) struct Options {
    pub(crate) workers: usize,
    pub(crate) flip_percent: f64,
    pub(crate) seconds: f64,
    pub(crate) warmup: f64,
    pub(crate) hold: f64,
    pub(crate) pace: Pace,
    pub(crate) per_write: usize,
    pub(crate) bin: String,
    pub(crate) extra: Vec<String>,
    pub(crate) frontends: usize,
    pub(crate) rate: u64,
}

impl Options {
    fn parse() -> Result<Options, String> {
        let mut o = Options {
            workers: 1000,
            flip_percent: 0.0,
            seconds: 5.0,
            warmup: 1.0,
            hold: 15.0,
            pace: Pace { batch: 0, pause: Duration::from_millis(10) },
            per_write: 64,
            bin: env!("CARGO_BIN_EXE_loadgate").to_owned(),
            extra: Vec::new(),
            frontends: 1,
            rate: 0,
        };
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            // `cargo bench` passes `--bench` to every bench target.
            if flag == "--bench" {
                continue;
            }
            let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"));
            fn num<T: std::str::FromStr>(flag: &str, v: String) -> Result<T, String> {
                v.parse().map_err(|_| format!("{flag}: not a number: {v}"))
            }
            match flag.as_str() {
                "--workers" => o.workers = num(&flag, value()?)?,
                "--flip-percent" => o.flip_percent = num(&flag, value()?)?,
                "--seconds" => o.seconds = num(&flag, value()?)?,
                "--warmup" => o.warmup = num(&flag, value()?)?,
                "--hold" => o.hold = num(&flag, value()?)?,
                "--connect-batch" => o.pace.batch = num(&flag, value()?)?,
                "--connect-pause-ms" => o.pace.pause = Duration::from_millis(num(&flag, value()?)?),
                "--frames-per-write" => o.per_write = num(&flag, value()?)?,
                "--frontends" => o.frontends = num(&flag, value()?)?,
                "--rate" => o.rate = num(&flag, value()?)?,
                "--bin" => o.bin = value()?,
                "--frontend-arg" => o.extra.push(value()?),
                "-h" | "--help" => return Err(USAGE.to_owned()),
                other => return Err(format!("unknown argument {other}\n{USAGE}")),
            }
        }
        let bounded = |v: f64| v.is_finite() && (0.0..=3600.0).contains(&v);
        if !(1..=1_000_000).contains(&o.workers)
            || !(0.0..=100.0).contains(&o.flip_percent)
            || ![o.seconds, o.warmup, o.hold].into_iter().all(bounded)
            || !(1..=1024).contains(&o.per_write)
            || !(1..=64).contains(&o.frontends)
            || (o.frontends > 1 && o.rate == 0)
        {
            return Err(format!("an argument is out of range\n{USAGE}"));
        }
        Ok(o)
    }
}

fn main() {
    let o = match Options::parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    raise_nofile((o.workers * o.frontends) as u64 + 256);
    let log = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("event_plane-frontend.log");
    // The idle timeout and silence lie past every phase: only TCP closes a
    // connection here.
    let bound = Duration::from_secs(60) + Duration::from_millis((o.workers * o.frontends) as u64 * 10);
    let idle_ms = ((o.hold + o.warmup + o.seconds) * 1000.0) as u64 + 2 * bound.as_millis() as u64;
    if o.rate > 0 {
        mesh::run(&o, idle_ms, bound);
        return;
    }
    let fe = Frontend::start(&o.bin, o.workers, idle_ms, &o.extra, &log);
    let port = fe.events.port();
    println!(
        "event_plane: {} workers, {}% flips, frontend pid {} (events {}, log {})",
        o.workers,
        o.flip_percent,
        fe.pid(),
        fe.events,
        log.display()
    );

    // 1. Registration.
    let netstat_before = Netstat::read();
    let cpu_before = fe.cpu();
    let started = Instant::now();
    let (mut conns, failed) = senders::open(fe.events, o.workers, o.pace, started + bound);
    let connected = started.elapsed();
    let registered = fe.wait_workers(conns.len() as u64, started, bound);
    let cpu = fe.cpu() - cpu_before;
    println!(
        "registration: {} connected in {:.3} s{}",
        conns.len(),
        connected.as_secs_f64(),
        if failed.is_empty() { String::new() } else { format!(", failed connects {failed:?}") }
    );
    let (took, seen) = registered;
    println!("  {seen} of {} registered after {:.3} s", conns.len(), took.as_secs_f64());
    print_cpu("  frontend CPU", cpu, conns.len());
    println!("  sockets now: {}", PortSockets::read(port));

    // 2. Hold.
    if o.hold > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(o.hold));
        let sockets = PortSockets::read(port);
        let (open, closed) = senders::check(&mut conns);
        let netstat_after = Netstat::read();
        println!("hold {} s after registration:", o.hold);
        println!(
            "  open (worker side): {open} of {}; registered (/health): {}",
            conns.len(),
            fe.workers().map_or("?".into(), |w| w.to_string())
        );
        println!("  closed: {}", if closed.is_empty() { "none".into() } else { format!("{closed:?}") });
        println!("  sockets: {sockets}");
        println!("  TcpExt since before the first connect:\n    {}", netstat_before.report(&netstat_after));
        println!(
            "  TCPAbortOnTimeout: {} -> {}",
            netstat_before.get("TCPAbortOnTimeout"),
            netstat_after.get("TCPAbortOnTimeout")
        );
    }

    // 3. Load.
    if o.seconds > 0.0 {
        let (open, closed) = senders::check(&mut conns);
        let registered = fe.workers().map_or("?".into(), |w| w.to_string());
        println!("before the load: {open} open, {registered} registered, closed since {closed:?}");
        load_phase(&o, &fe, &mut conns);
    }
}

/// The load phase: the sender on its own thread, the frontend's counter
/// read `--seconds` apart after `--warmup`.
fn load_phase(o: &Options, fe: &Frontend, conns: &mut [senders::Conn]) {
    let open = conns.iter().filter(|c| c.closed.is_none()).count();
    let stop = AtomicBool::new(false);
    let flip_permille = (o.flip_percent * 10.0).round() as u32;
    let deadline = Instant::now() + Duration::from_secs_f64(o.warmup + o.seconds) + Duration::from_secs(30);
    let (sent, first, last, cpu) = std::thread::scope(|s| {
        let sender = s.spawn(|| senders::send(conns, o.per_write, flip_permille, &stop, deadline));
        std::thread::sleep(Duration::from_secs_f64(o.warmup));
        let first = fe.applied();
        let cpu_before = fe.cpu();
        std::thread::sleep(Duration::from_secs_f64(o.seconds));
        let last = fe.applied();
        let cpu = fe.cpu() - cpu_before;
        // Relaxed: the join below orders everything else.
        stop.store(true, Ordering::Relaxed);
        (sender.join().expect("the sender thread"), first, last, cpu)
    });
    let seconds = last.2.duration_since(first.2).as_secs_f64();
    let (applied, flips) = (last.0 - first.0, last.1 - first.1);
    println!("load: {open} connections, {} frames per write, {}% flips", o.per_write, o.flip_percent);
    println!(
        "  applied by the frontend: {:.0} reports/s ({applied} in {seconds:.3} s), busy flips {:.0}/s ({:.2}% of applied)",
        applied as f64 / seconds,
        flips as f64 / seconds,
        if applied > 0 { flips as f64 * 100.0 / applied as f64 } else { 0.0 }
    );
    println!(
        "  written by the sender (warmup included): {} frames, {} writes, {} found the socket full",
        sent.frames(),
        sent.writes,
        sent.full
    );
    println!(
        "  frontend CPU over the measurement: utime+stime {:.0} %, process {:.0} %, event-plane thread {:.0} %",
        cpu.stat.as_secs_f64() * 100.0 / seconds,
        cpu.process.as_secs_f64() * 100.0 / seconds,
        cpu.plane.as_secs_f64() * 100.0 / seconds
    );
    // On a shared machine the thread may not get a whole core: what it
    // applies per second of its own CPU is the steadier figure.
    println!(
        "  per event-plane CPU second: {:.0} reports ({:.0} ns per report)",
        applied as f64 / cpu.plane.as_secs_f64().max(1e-9),
        cpu.plane.as_secs_f64() * 1e9 / applied.max(1) as f64
    );
    let closed: BTreeMap<&str, usize> =
        conns.iter().filter_map(|c| c.closed.as_deref()).fold(BTreeMap::new(), |mut m, r| {
            *m.entry(r).or_default() += 1;
            m
        });
    if !closed.is_empty() {
        println!("  closed connections (all phases): {closed:?}");
    }
}

fn print_cpu(what: &str, cpu: Cpu, registrations: usize) {
    let per = |d: Duration| d.as_secs_f64() * 1e6 / registrations.max(1) as f64;
    println!(
        "{what}: utime+stime {:.0} ms ({:.1} µs per registration); schedstat: process {:.1} ms ({:.1} µs per \
         registration), event-plane thread {:.1} ms ({:.1} µs per registration)",
        cpu.stat.as_secs_f64() * 1e3,
        per(cpu.stat),
        cpu.process.as_secs_f64() * 1e3,
        per(cpu.process),
        cpu.plane.as_secs_f64() * 1e3,
        per(cpu.plane),
    );
}

/// Raises the soft limit on open files to `want` (at most the hard limit):
/// the connections are open files here and, inherited, in the frontend.
fn raise_nofile(want: u64) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    let hard = limit.maximum.unwrap_or(u64::MAX);
    if limit.current.is_some_and(|soft| soft >= want) {
        return;
    }
    let target = want.min(hard);
    if let Err(e) = setrlimit(Resource::Nofile, Rlimit { current: Some(target), maximum: limit.maximum }) {
        eprintln!("could not raise the open-file limit to {target}: {e}");
    }
    if target < want {
        eprintln!("the open-file hard limit is {hard}, under the {want} this run needs");
    }
}
