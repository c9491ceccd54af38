//! Frontend side of the event plane: [`EventPlane`], ONE mio thread that
//! serves every worker connection and applies frames straight to the
//! [`WorkerMonitor`].
//!
//! - With a secret, every connection is challenged on accept and no frame
//!   applies before a valid Proof (`handshake.rs`).
//! - A worker id belongs to the connection that registered it
//!   (`ownership.rs`); a worker whose connection closes is deregistered
//!   after a grace period unless it registers again.
//! - Every count a peer controls is bounded (`limits.rs`), and reading is
//!   fair: each ready connection reads at most `--event-read-budget` bytes
//!   per round, round-robin, so a flooding connection delays another's
//!   Register by one round at most.
//! - Time is bounded too: a connection must authenticate (with a secret) or
//!   register (without one) within [`HANDSHAKE_TIMEOUT`]; past
//!   `--max-pending-handshakes` such pending connections (or at
//!   `--max-event-connections`) a new connection may evict only a pending
//!   one that did not answer within its share of that deadline, so a flood
//!   that never answers cannot evict a worker's handshake
//!   (`listener/admission.rs`); an established
//!   connection silent for `--event-idle-timeout-ms` is closed (a worker
//!   host that vanished without a FIN must not hold its id forever).
//! - Liveness: a worker whose connection sends nothing for
//!   [`PlaneConfig::silence`] (`--event-silence-ms`, bounded by the load
//!   staleness window) leaves routing at once (it is marked silent in the
//!   [`WorkerDirectory`]) and rejoins with its next frame; a worker whose
//!   connection closed leaves routing at once too, and is deregistered when
//!   the grace passes without a new connection. Heartbeats keep a live
//!   worker's load fresh, so only a live connection's data is ever used.
//! - An accept that fails (out of file descriptors) is retried after a
//!   pause; the listener never waits for a new connection to retry.
//!
//! A bad frame closes only its own connection.
//!
//! # No TCP keepalive
//!
//! Accepted event sockets have no TCP keepalive: silence is judged here,
//! by the handshake deadline, `--event-silence-ms` and
//! `--event-idle-timeout-ms`, never by the kernel. Until issue 22 they had
//! it (first probe after 5 s of silence, then every second, 3 probes), and
//! it closed healthy connections: 10,000 workers that connected in one loop
//! and then sent nothing (with the idle timeout raised past 8 s) lost 40 to
//! 50 % of their connections with ETIMEDOUT 8 s after registering. The
//! loop is paced by the listen backlog (129 connections accepted, then the
//! next SYN waits for its 1 s retransmission), so the connections go
//! silent in groups; the kernel's timer wheel rounds a 5 s timer up to a
//! 512 ms bucket and a 1 s one to 64 ms, and sockets whose probe was
//! answered re-arm together, so thousands of keepalive timers expired in
//! the same tick. On loopback each probe (and answer) waits in the CPU's
//! input backlog, which holds `net.core.netdev_max_backlog` (1,000)
//! packets: 1,001 probes of a tick arrived and the rest were dropped (drop
//! reason `CPU_BACKLOG`, `/proc/net/softnet_stat` column 2). A socket whose
//! three probes were all dropped was aborted (`TCPAbortOnTimeout`,
//! `tcp_send_reset` reason `TCP_KEEPALIVE_TIMEOUT`), and most of those
//! RSTs were dropped too, leaving the workers' sides ESTABLISHED (a NIC's
//! bounded queues could drop such a burst alike). The probes added nothing:
//! a worker heartbeats every `--heartbeat-ms`, a silent worker leaves
//! routing after `--event-silence-ms`, and a peer that vanished is closed
//! by the idle timeout. `server/tests/event_burst.rs` guards it;
//! `docs/benchmarks.md` has the measurement.
//!
//! Here: the connections' I/O (fair rounds of reads, close). Which new
//! connection is taken, and when, is in `listener/admission.rs`; what each
//! frame does in `listener/frames.rs`; the deadlines (handshake, idle,
//! silence, grace) in `listener/deadlines.rs`.
//!
//! [`HANDSHAKE_TIMEOUT`]: super::handshake::HANDSHAKE_TIMEOUT

mod admission;
mod deadlines;
mod frames;

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::io::{self, Read};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use loadgate::wire::{Frame, Nonce};
use loadgate::{WorkerId, WorkerMonitor};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

#[cfg(test)]
pub(super) use self::admission::ANSWER_SHARE;
use super::limits::PlaneLimits;
use super::ownership::Ownership;
use super::plane_log::PlaneLog;
use super::stats::PlaneStats;
use crate::directory::WorkerDirectory;
use crate::secret::Secrets;
use crate::throttle::LogThrottle;

/// How the event plane runs.
#[derive(Clone, Debug)]
pub struct PlaneConfig {
    /// How long a worker whose connection closed stays registered, waiting
    /// for it to register again.
    pub grace: Duration,
    /// The event secret; `None`: no handshake (bind loopback only).
    pub secrets: Option<Arc<Secrets>>,
    /// Bounds on what peers control.
    pub limits: PlaneLimits,
    /// How long an established connection may send nothing before its
    /// worker leaves routing (it rejoins with its next frame).
    pub silence: Duration,
    /// What the plane applied (for `/metrics`).
    pub stats: Arc<PlaneStats>,
}

/// Frontend side: one mio thread serving every worker connection on the
/// event port. Stops (and closes every connection) on drop.
#[derive(Debug)]
pub struct EventPlane {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    thread: Option<JoinHandle<()>>,
}

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const READ_CHUNK: usize = 4096;
/// Connections accepted per round; more wait for the next round, so a
/// connect flood cannot starve the open connections.
const ACCEPTS_PER_ROUND: usize = 64;
/// How long the accept loop waits after a failed accept (e.g. EMFILE).
const ACCEPT_RETRY: Duration = Duration::from_millis(50);
/// At most one accept-failure warning this often.
const ACCEPT_WARNING_EVERY: Duration = Duration::from_secs(5);

impl EventPlane {
    /// Serves `listener` on a new thread: Register frames register the worker
    /// in `monitor` and its address in `directory`; Load frames are applied as
    /// [`Publisher::Worker`] reports; Deregister frames (and a connection that
    /// stays closed for the grace) remove the worker from both.
    ///
    /// # Errors
    ///
    /// Creating the poller or the thread failed.
    ///
    /// [`Publisher::Worker`]: loadgate::monitor::Publisher::Worker
    pub fn start(
        listener: std::net::TcpListener,
        monitor: Arc<WorkerMonitor>,
        directory: Arc<WorkerDirectory>,
        config: PlaneConfig,
    ) -> io::Result<EventPlane> {
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let mut listener = TcpListener::from_std(listener);
        let poll = Poll::new()?;
        poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let stop = Arc::new(AtomicBool::new(false));
        let mut server = PlaneServer {
            poll,
            listener,
            listener_ready: true,
            conns: HashMap::new(),
            next_token: 2,
            ready: VecDeque::new(),
            pending: BTreeSet::new(),
            idle: BinaryHeap::new(),
            silence: BinaryHeap::new(),
            accept_retry: None,
            accept_warnings: LogThrottle::new(1, ACCEPT_WARNING_EVERY),
            ownership: Ownership::default(),
            monitor,
            directory,
            budget: config.limits.event_read_budget.max(1),
            config,
            log: PlaneLog::default(),
            stop: stop.clone(),
        };
        let thread = std::thread::Builder::new().name("event-plane".into()).spawn(move || server.run())?;
        Ok(EventPlane { addr, stop, waker, thread: Some(thread) })
    }

    /// The address the event port listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for EventPlane {
    fn drop(&mut self) {
        // Release: the thread's Acquire load after the wake sees it.
        self.stop.store(true, Ordering::Release);
        let _ = self.waker.wake();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Where a connection is in the handshake.
#[derive(Clone, Copy, Debug)]
enum Auth {
    /// Challenged with this nonce; nothing applies before a valid Proof.
    Challenged(Nonce),
    /// The frontend has no secret and this connection has not registered
    /// yet: only a Register applies.
    Unregistered,
    /// Authenticated (or registered, without a secret): frames apply.
    Open,
}

impl Auth {
    /// Still in the handshake: bounded in time and in number, evictable.
    fn pending(self) -> bool {
        !matches!(self, Auth::Open)
    }
}

/// One worker connection.
struct Conn {
    stream: TcpStream,
    peer: SocketAddr,
    buf: BytesMut,
    auth: Auth,
    /// When it was accepted (the handshake deadline counts from here).
    opened: Instant,
    /// When bytes last arrived (the idle timeout counts from here).
    last_read: Instant,
    /// The worker (and incarnation) this connection registered, if any.
    worker: Option<(WorkerId, u64)>,
    /// Its last applied Register: the same one again changes nothing.
    last_register: Option<Frame>,
    /// In the ready list.
    queued: bool,
    /// Silent past [`PlaneConfig::silence`]: its worker is out of routing
    /// until bytes arrive.
    silent: bool,
}

/// Why a connection is closed.
enum Close {
    /// The peer closed it cleanly.
    Eof,
    /// Refused: before or at authentication, or a Register refused.
    Refused(String),
    /// A frame it may not send, a socket error, or silence.
    Bad(String),
    /// Evicted while pending, to make room (logged as a limit hit).
    Evicted,
}

/// How a connection's read in one round ended.
enum Round {
    /// Read everything available: wait for readiness.
    Drained,
    /// Read its budget: more may be there, serve it next round.
    Budget,
}

/// The event-plane thread's state.
struct PlaneServer {
    poll: Poll,
    listener: TcpListener,
    /// Accepts may be pending (edge-triggered: until WouldBlock).
    listener_ready: bool,
    conns: HashMap<Token, Conn>,
    next_token: usize,
    /// Connections with bytes to read, served round-robin.
    ready: VecDeque<Token>,
    /// Connections still in the handshake. Tokens grow in accept order and
    /// the handshake timeout and the answer share are constant, so the first
    /// is the oldest: the first past its share (evicted first) and the first
    /// to time out.
    pending: BTreeSet<Token>,
    /// Idle deadlines of established connections, earliest first; an entry
    /// is checked against the connection's `last_read` when it comes due
    /// (and pushed again if bytes came since), or dropped if it closed.
    idle: BinaryHeap<Reverse<(Instant, Token)>>,
    /// Silence deadlines of established connections, checked like `idle`;
    /// a connection marked silent has none until bytes arrive.
    silence: BinaryHeap<Reverse<(Instant, Token)>>,
    /// After a failed accept: when to try again.
    accept_retry: Option<Instant>,
    accept_warnings: LogThrottle,
    ownership: Ownership,
    monitor: Arc<WorkerMonitor>,
    directory: Arc<WorkerDirectory>,
    config: PlaneConfig,
    budget: usize,
    /// The rate-limited warn lines.
    log: PlaneLog,
    stop: Arc<AtomicBool>,
}

impl PlaneServer {
    fn run(&mut self) {
        let mut events = Events::with_capacity(256);
        let mut chunk = vec![0u8; READ_CHUNK];
        loop {
            let now = Instant::now();
            let accept_at = self.next_accept(now);
            let timeout = if accept_at.is_some_and(|at| at <= now) || !self.ready.is_empty() {
                Some(Duration::ZERO)
            } else {
                let next = [
                    self.ownership.next_deadline(),
                    self.next_handshake_deadline(),
                    self.next_idle_deadline(),
                    self.silence.peek().map(|Reverse((at, _))| *at),
                    self.accept_retry,
                    accept_at,
                ];
                next.into_iter().flatten().min().map(|at| at.saturating_duration_since(now))
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::error!(error = %e, "event plane poll failed; stopping");
                return;
            }
            // Acquire: pairs with the Release store in `EventPlane::drop`.
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            for event in events.iter() {
                match event.token() {
                    LISTENER => self.listener_ready = true,
                    WAKER => {}
                    token => self.mark_ready(token),
                }
            }
            if self.accept_retry.is_some_and(|at| at <= Instant::now()) {
                self.accept_retry = None;
                self.listener_ready = true;
            }
            // Read first: a pending connection whose Proof (or Register) has
            // arrived is established (out of reach of eviction, and its place
            // free) before new connections are taken.
            self.round(&mut chunk);
            if self.listener_ready {
                self.accept();
            }
            self.expire();
        }
    }

    fn mark_ready(&mut self, token: Token) {
        if let Some(conn) = self.conns.get_mut(&token) {
            if !conn.queued {
                conn.queued = true;
                self.ready.push_back(token);
            }
        }
    }

    /// Serves each connection that was ready at the round's start once, up
    /// to its budget; those that read their budget go to the back.
    fn round(&mut self, chunk: &mut [u8]) {
        for _ in 0..self.ready.len() {
            let Some(token) = self.ready.pop_front() else { break };
            let Some(mut conn) = self.conns.remove(&token) else { continue };
            conn.queued = false;
            let served = self.serve(token, &mut conn, chunk);
            if conn.silent && conn.last_read.elapsed() < self.config.silence {
                self.speaks_again(token, &mut conn);
            }
            match served {
                Ok(Round::Drained) => {
                    self.conns.insert(token, conn);
                }
                Ok(Round::Budget) => {
                    conn.queued = true;
                    self.ready.push_back(token);
                    self.conns.insert(token, conn);
                }
                Err(close) => self.close(token, conn, close),
            }
        }
    }

    /// Reads up to the budget from one connection, applying each complete
    /// frame as it arrives (so its buffer stays under two frames).
    fn serve(&mut self, token: Token, conn: &mut Conn, chunk: &mut [u8]) -> Result<Round, Close> {
        let mut left = self.budget;
        while left > 0 {
            let want = left.min(chunk.len());
            match conn.stream.read(&mut chunk[..want]) {
                Ok(0) if conn.buf.is_empty() => return Err(Close::Eof),
                Ok(0) => {
                    return Err(Close::Bad(format!("connection closed inside a frame ({} bytes)", conn.buf.len())))
                }
                Ok(n) => {
                    left -= n;
                    conn.last_read = Instant::now();
                    conn.buf.extend_from_slice(&chunk[..n]);
                    self.drain(token, conn)?;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Round::Drained),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Close::Bad(e.to_string())),
            }
        }
        Ok(Round::Budget)
    }

    fn close(&mut self, token: Token, mut conn: Conn, close: Close) {
        let (peer, worker) = (conn.peer, conn.worker.map(|(w, _)| w));
        let pending = conn.auth.pending();
        if pending {
            self.pending.remove(&token);
        }
        match close {
            // Anyone who reaches the port can cause it: the unauthenticated bucket.
            Close::Eof if pending => {
                if let Some(suppressed) = self.log.connection_line(false) {
                    tracing::info!(%peer, suppressed, "event connection closed before the handshake")
                }
            }
            // A worker may connect and leave in a loop: the authenticated bucket.
            Close::Eof => {
                if let Some(suppressed) = self.log.connection_line(true) {
                    tracing::info!(%peer, ?worker, suppressed, "event connection closed")
                }
            }
            Close::Evicted => tracing::debug!(%peer, "pending event connection evicted"),
            Close::Refused(reason) => {
                if let Some(suppressed) = self.log.connection_line(!pending) {
                    tracing::warn!(%peer, ?worker, suppressed, "event connection refused: {reason}")
                }
            }
            Close::Bad(reason) => {
                if let Some(suppressed) = self.log.connection_line(!pending) {
                    tracing::warn!(%peer, ?worker, suppressed, "closing event connection: {reason}")
                }
            }
        }
        let _ = self.poll.registry().deregister(&mut conn.stream);
        if let Some((worker, incarnation)) = conn.worker {
            // Out of routing while orphaned: nothing reports its load, and
            // its process is likely gone (a new Register brings it back).
            self.set_silent(worker, incarnation, true);
            self.ownership.release(worker, token, Instant::now() + self.config.grace);
        }
    }

    /// Marks `worker` silent (out of routing) or speaking again, unless the
    /// monitor now holds another life of it than `incarnation`, the one
    /// this plane registered: another plane (NATS) registered it since,
    /// and its routing is that plane's to judge. Returns whether it changed.
    fn set_silent(&self, worker: WorkerId, incarnation: u64, silent: bool) -> bool {
        self.monitor.incarnation(worker) == Some(incarnation) && self.directory.set_silent(worker, silent)
    }
}
