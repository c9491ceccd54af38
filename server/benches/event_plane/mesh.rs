//! `--frontends K --rate R`: the TCP mesh at a fleet's size, beside the
//! NATS plane's `benches/nats_plane/run.py --fleet` (issue 25). K
//! frontends, every simulated worker connected to each (W × K
//! connections), and one sender thread that publishes R loads a second in
//! all, round-robin over the workers, each load written to every frontend
//! (as a worker of the mesh writes it K times). Over the measured seconds:
//! each frontend's CPU (utime + stime), RSS and loads applied, and the
//! sender's CPU (what the whole fleet of workers spends writing).

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::frontend::Frontend;
use crate::senders::{self, Conn, Pace};

/// How often the paced sender wakes to write what is due.
const TICK: Duration = Duration::from_millis(1);

/// One worker's report state (shared by its K connections).
#[derive(Clone, Copy, Default)]
struct Worker {
    seq: u64,
    busy: bool,
}

/// Runs the mesh: starts the frontends, connects, then the paced load.
pub fn run(o: &crate::Options, idle_ms: u64, bound: Duration) {
    let log_dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let fes: Vec<Frontend> = (0..o.frontends)
        .map(|k| {
            let log = log_dir.join(format!("event_plane-frontend-{k}.log"));
            Frontend::start(&o.bin, o.workers, idle_ms, &o.extra, &log)
        })
        .collect();
    let started = Instant::now();
    let pace = if o.pace.batch > 0 { o.pace } else { Pace { batch: 100, pause: Duration::from_millis(20) } };
    let mut meshes: Vec<Vec<Conn>> = fes
        .iter()
        .map(|fe| {
            let (conns, failed) = senders::open(fe.events, o.workers, pace, started + bound);
            if !failed.is_empty() {
                println!("  failed connects to {}: {failed:?}", fe.events);
            }
            conns
        })
        .collect();
    for (fe, conns) in fes.iter().zip(&meshes) {
        let (_, seen) = fe.wait_workers(conns.len() as u64, started, bound);
        println!("frontend {} (pid {}): {seen} of {} registered", fe.events, fe.pid(), conns.len());
    }
    let connections: usize = meshes.iter().map(Vec::len).sum();
    let stop = AtomicBool::new(false);
    let flip_permille = (o.flip_percent * 10.0).round() as u32;
    let deadline = Instant::now() + Duration::from_secs_f64(o.warmup + o.seconds) + Duration::from_secs(30);
    let sender_tid = std::sync::OnceLock::new();
    let (written, first, last, cpus, sender_cpu, rss) = std::thread::scope(|s| {
        let sender = s.spawn(|| {
            let _ = sender_tid.set(own_tid());
            send_paced(&mut meshes, o.rate, flip_permille, &stop, deadline)
        });
        std::thread::sleep(Duration::from_secs_f64(o.warmup));
        let tid = *sender_tid.get().expect("the sender started during the warm-up");
        let first: Vec<_> = fes.iter().map(Frontend::applied).collect();
        let cpu_before: Vec<_> = fes.iter().map(Frontend::cpu).collect();
        let sender_before = thread_cpu(tid);
        std::thread::sleep(Duration::from_secs_f64(o.seconds));
        let last: Vec<_> = fes.iter().map(Frontend::applied).collect();
        let cpus: Vec<_> = fes.iter().zip(cpu_before).map(|(fe, before)| fe.cpu() - before).collect();
        let sender_cpu = thread_cpu(tid).saturating_sub(sender_before);
        let rss: Vec<f64> = fes.iter().map(|fe| rss_mib(fe.pid())).collect();
        // Relaxed: the join below orders everything else.
        stop.store(true, Ordering::Relaxed);
        (sender.join().expect("the sender thread"), first, last, cpus, sender_cpu, rss)
    });
    println!(
        "mesh: {} frontends x {} workers = {connections} connections, {} loads/s offered ({}% flips), {} s measured",
        o.frontends, o.workers, o.rate, o.flip_percent, o.seconds
    );
    println!("| process | CPU (% of a core) | RSS (MiB) | loads applied/s |");
    println!("|---|---:|---:|---:|");
    let (mut all_cpu, mut all_rss, mut all_applied) = (0.0, 0.0, 0.0);
    for (k, ((a, b), (cpu, rss))) in first.iter().zip(&last).zip(cpus.iter().zip(&rss)).enumerate() {
        let seconds = b.2.duration_since(a.2).as_secs_f64();
        let applied = (b.0 - a.0) as f64 / seconds;
        let cpu = cpu.stat.as_secs_f64() / o.seconds;
        println!("| frontend {} | {:.1} | {rss:.1} | {applied:.0} |", k + 1, cpu * 100.0);
        (all_cpu, all_rss, all_applied) = (all_cpu + cpu, all_rss + rss, all_applied + applied);
    }
    println!("| all frontends | {:.1} | {all_rss:.1} | {all_applied:.0} |", all_cpu * 100.0);
    println!(
        "| sender (every worker's writes) | {:.1} | - | {} frames written in all |",
        sender_cpu.as_secs_f64() * 100.0 / o.seconds,
        written
    );
}

/// Writes `rate` loads a second in all (each to every frontend's connection
/// of its worker) until `stop` or `deadline`; returns the frames handed to
/// the kernel. A connection whose socket is full keeps the rest for the
/// next tick.
fn send_paced(meshes: &mut [Vec<Conn>], rate: u64, flip_permille: u32, stop: &AtomicBool, deadline: Instant) -> u64 {
    let workers = meshes.iter().map(Vec::len).min().unwrap_or(0);
    if workers == 0 || rate == 0 {
        return 0;
    }
    for conn in meshes.iter_mut().flatten() {
        conn.set_nonblocking();
    }
    let mut state = vec![Worker::default(); workers];
    let (start, mut due_sent, mut next, mut credit, mut written) = (Instant::now(), 0u64, 0usize, 0u32, 0u64);
    let mut dirty: Vec<usize> = Vec::new();
    // Relaxed: a flag polled on its own; the deadline bounds it anyway.
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        while due_sent < due {
            let worker = &mut state[next];
            worker.seq += 1;
            credit += flip_permille;
            if credit >= 1000 {
                credit -= 1000;
                worker.busy = !worker.busy;
            }
            for conns in meshes.iter_mut() {
                conns[next].queue(worker.seq, worker.busy);
            }
            dirty.push(next);
            next = (next + 1) % workers;
            due_sent += 1;
        }
        dirty.sort_unstable();
        dirty.dedup();
        for &w in &dirty {
            for conns in meshes.iter_mut() {
                written += conns[w].flush();
            }
        }
        dirty.retain(|&w| meshes.iter().any(|conns| conns[w].pending()));
        std::thread::sleep(TICK);
    }
    written
}

/// This thread's id (from `/proc/thread-self`, a link to `PID/task/TID`).
fn own_tid() -> i32 {
    let link = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
    let tid = link.file_name().and_then(|n| n.to_str()).and_then(|n| n.parse().ok());
    tid.expect("a thread id")
}

/// A thread's CPU time so far (`/proc/self/task/TID/schedstat`, ns).
fn thread_cpu(tid: i32) -> Duration {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).unwrap_or_default();
    Duration::from_nanos(text.split_whitespace().next().and_then(|f| f.parse().ok()).unwrap_or(0))
}

/// A process's resident set (`VmRSS` of `/proc/PID/status`), MiB.
fn rss_mib(pid: u32) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = text.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next());
    kib.and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) / 1024.0
}

impl Conn {
    /// Switches the socket to non-blocking writes (a failure closes it).
    fn set_nonblocking(&mut self) {
        if let Err(e) = self.stream.set_nonblocking(true) {
            self.closed = Some(e.to_string());
        }
    }

    /// Appends a Load of this connection's worker to what it still has to write.
    fn queue(&mut self, seq: u64, busy: bool) {
        if self.closed.is_none() {
            self.leftover.extend_from_slice(&senders::load_frame(self.worker, seq, busy));
        }
    }

    /// Whether it still has bytes to write.
    fn pending(&self) -> bool {
        self.closed.is_none() && !self.leftover.is_empty()
    }

    /// Writes what it can of its queue; returns the whole frames written.
    fn flush(&mut self) -> u64 {
        if !self.pending() {
            return 0;
        }
        match self.stream.write(&self.leftover) {
            Ok(n) => {
                self.leftover.drain(..n);
                (n / senders::LOAD_LEN) as u64
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) => {
                self.closed = Some(e.to_string());
                0
            }
        }
    }
}
