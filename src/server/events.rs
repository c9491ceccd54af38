//! The load event plane: workers push their registration and per-rank load
//! to every frontend over TCP, in [`crate::wire`] frames.
//!
//! - Worker side: [`EventPublisher`], a std thread with one blocking
//!   connection per frontend; reconnects with backoff, coalesces reports
//!   (at most one per rank per millisecond), numbers them, and re-sends every
//!   rank's latest state as a heartbeat.
//! - Frontend side: [`EventPlane`], ONE mio thread that serves every worker
//!   connection and applies frames straight to the [`WorkerMonitor`]. A bad
//!   frame closes only its own connection; a worker whose last connection
//!   closes is deregistered after a grace period unless it reconnects.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token, Waker};

use crate::server::directory::WorkerDirectory;
use crate::sync::{Arc, AtomicBool, Ordering};
use crate::wire::{self, Frame};
use crate::{Applied, LoadReport, Publisher, RankLoad, Registered, WorkerId, WorkerMonitor};

/// What a worker announces about itself to every frontend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    /// The worker's id (unique among the frontend's workers).
    pub worker: WorkerId,
    /// This run of the worker: picked at start, different after a restart
    /// (see [`Registration::new_incarnation`]).
    pub incarnation: u64,
    /// The model it serves.
    pub model: String,
    /// Its data-parallel size.
    pub dp_size: u32,
    /// Where its HTTP server listens, `127.0.0.1:PORT`.
    pub http_addr: String,
}

impl Registration {
    /// An incarnation for a worker starting now: the wall clock in
    /// nanoseconds, so a restarted worker that keeps its id gets a new one.
    pub fn new_incarnation() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
}

/// Minimum time between two reports of the same rank.
const COALESCE: Duration = Duration::from_millis(1);
/// First reconnect delay; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Worker side: pushes registration + per-rank load to every frontend event
/// port from a background thread.
#[derive(Debug)]
pub struct EventPublisher {
    shared: Arc<Shared>,
    dp_size: u32,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<PublishState>,
    wake: Condvar,
}

#[derive(Debug)]
struct PublishState {
    latest: Vec<Option<RankLoad>>,
    dirty: Vec<bool>,
    stop: bool,
}

impl EventPublisher {
    /// Starts a background std thread that connects (and keeps reconnecting,
    /// with backoff) to every `frontends` address (`HOST:PORT`), sends the
    /// Registration on each (re)connect, then load reports: the latest
    /// [`RankLoad`] per rank, coalesced to at most one report per rank per
    /// millisecond, with increasing seq numbers, and re-sends every rank's
    /// latest state at least every `heartbeat` even when nothing changed.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when the registration does not fit in a frame or its
    /// dp size is 0; the thread's spawn error otherwise.
    pub fn start(
        frontends: Vec<String>,
        registration: Registration,
        heartbeat: Duration,
    ) -> io::Result<EventPublisher> {
        if registration.dp_size == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "dp_size must be at least 1"));
        }
        let register = Frame::Register {
            worker: registration.worker,
            incarnation: registration.incarnation,
            dp_size: registration.dp_size,
            model: registration.model.clone(),
            http_addr: registration.http_addr.clone(),
        };
        wire::encode(&register, &mut BytesMut::new()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let ranks = registration.dp_size as usize;
        let shared = Arc::new(Shared {
            state: Mutex::new(PublishState { latest: vec![None; ranks], dirty: vec![false; ranks], stop: false }),
            wake: Condvar::new(),
        });
        let links = frontends.into_iter().map(Link::new).collect();
        let mut pump = Pump {
            shared: shared.clone(),
            links,
            register,
            worker: registration.worker,
            incarnation: registration.incarnation,
            // Per incarnation: a restart registers a new one, which resets
            // the frontend's slots, so counting from 0 is never stale.
            seq: 0,
            heartbeat: heartbeat.max(COALESCE),
        };
        let thread = std::thread::Builder::new().name("event-publisher".into()).spawn(move || pump.run())?;
        Ok(EventPublisher { shared, dp_size: registration.dp_size, thread: Some(thread) })
    }

    /// Records rank `rank`'s latest load; never blocks on the network (cheap,
    /// callable from the engine loop). A rank outside the dp size is ignored.
    pub fn report(&self, rank: u32, load: RankLoad) {
        if rank >= self.dp_size {
            return;
        }
        let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.latest[rank as usize] != Some(load) {
            state.latest[rank as usize] = Some(load);
            state.dirty[rank as usize] = true;
            self.shared.wake.notify_one();
        }
    }
}

impl Drop for EventPublisher {
    fn drop(&mut self) {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One frontend connection of the publisher.
struct Link {
    addr: String,
    stream: Option<TcpStream>,
    retry_at: Instant,
    backoff: Duration,
}

impl Link {
    fn new(addr: String) -> Self {
        Link { addr, stream: None, retry_at: Instant::now(), backoff: MIN_BACKOFF }
    }

    fn connect(&mut self) -> io::Result<TcpStream> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "address resolved to nothing");
        for addr in self.addr.to_socket_addrs()? {
            match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
                Ok(stream) => {
                    stream.set_nodelay(true)?;
                    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
                    return Ok(stream);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn failed(&mut self, now: Instant, error: &io::Error) {
        if self.stream.take().is_some() || self.backoff == MIN_BACKOFF {
            tracing::warn!(frontend = %self.addr, %error, "event plane connection lost; reconnecting");
        }
        self.retry_at = now + self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }
}

/// The publisher thread.
struct Pump {
    shared: Arc<Shared>,
    links: Vec<Link>,
    register: Frame,
    worker: WorkerId,
    incarnation: u64,
    seq: u64,
    heartbeat: Duration,
}

impl Pump {
    fn run(&mut self) {
        let mut last_send = Instant::now() - COALESCE;
        let mut last_full = Instant::now();
        loop {
            let (changed, latest, stop) = self.wait(last_send, last_full);
            if stop {
                break;
            }
            let now = Instant::now();
            // Reconnect due links; a new connection gets the full state.
            for i in 0..self.links.len() {
                if self.links[i].stream.is_none() && now >= self.links[i].retry_at {
                    match self.links[i].connect() {
                        Ok(stream) => {
                            self.links[i].stream = Some(stream);
                            self.links[i].backoff = MIN_BACKOFF;
                            let mut buf = BytesMut::new();
                            // Checked at start: the registration fits.
                            let _ = wire::encode(&self.register, &mut buf);
                            self.encode_loads(&latest, |_| true, &mut buf);
                            self.send(i, &buf, now);
                        }
                        Err(e) => self.links[i].failed(now, &e),
                    }
                }
            }
            let heartbeat_due = now.duration_since(last_full) >= self.heartbeat;
            if heartbeat_due {
                last_full = now;
            }
            let mut buf = BytesMut::new();
            self.encode_loads(&latest, |rank| heartbeat_due || changed[rank], &mut buf);
            if !buf.is_empty() {
                for i in 0..self.links.len() {
                    self.send(i, &buf, now);
                }
                last_send = now;
            }
        }
        let mut bye = BytesMut::new();
        let _ = wire::encode(&Frame::Deregister { worker: self.worker, incarnation: self.incarnation }, &mut bye);
        for link in &mut self.links {
            if let Some(stream) = link.stream.as_mut() {
                let _ = stream.write_all(&bye);
            }
        }
    }

    /// Waits until a rank changed (and the coalescing window has passed), a
    /// heartbeat or reconnect is due, or stop; returns which ranks changed,
    /// every rank's latest state, and whether to stop.
    fn wait(&self, last_send: Instant, last_full: Instant) -> (Vec<bool>, Vec<Option<RankLoad>>, bool) {
        let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if state.stop {
                return (Vec::new(), Vec::new(), true);
            }
            let now = Instant::now();
            let coalesced = now.duration_since(last_send) >= COALESCE;
            let mut deadline = last_full + self.heartbeat;
            for link in self.links.iter().filter(|l| l.stream.is_none()) {
                deadline = deadline.min(link.retry_at);
            }
            let dirty = state.dirty.iter().any(|d| *d);
            if (dirty && coalesced) || now >= deadline {
                let ranks = state.latest.len();
                let changed = std::mem::replace(&mut state.dirty, vec![false; ranks]);
                return (changed, state.latest.clone(), false);
            }
            if dirty {
                deadline = deadline.min(last_send + COALESCE);
            }
            let wait = deadline.saturating_duration_since(now);
            state = self.shared.wake.wait_timeout(state, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    fn encode_loads(&mut self, latest: &[Option<RankLoad>], pick: impl Fn(usize) -> bool, buf: &mut BytesMut) {
        for (rank, load) in latest.iter().enumerate() {
            if let Some(load) = load.filter(|_| pick(rank)) {
                self.seq += 1;
                let frame = Frame::Load {
                    worker: self.worker,
                    incarnation: self.incarnation,
                    rank: rank as u32,
                    seq: self.seq,
                    load,
                };
                // A Load frame always fits.
                let _ = wire::encode(&frame, buf);
            }
        }
    }

    fn send(&mut self, i: usize, buf: &[u8], now: Instant) {
        let link = &mut self.links[i];
        if let Some(stream) = link.stream.as_mut() {
            if let Err(e) = stream.write_all(buf) {
                link.failed(now, &e);
            }
        }
    }
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

impl EventPlane {
    /// Serves `listener` on a new thread: Register frames register the worker
    /// in `monitor` and its address in `directory`; Load frames are applied as
    /// [`Publisher::Worker`] reports; Deregister frames (and a connection that
    /// stays closed for `grace`) remove the worker from both.
    ///
    /// # Errors
    ///
    /// Creating the poller or the thread failed.
    pub fn start(
        listener: std::net::TcpListener,
        monitor: Arc<WorkerMonitor>,
        directory: Arc<WorkerDirectory>,
        grace: Duration,
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
            conns: HashMap::new(),
            next_token: 2,
            live: HashMap::new(),
            pending: Vec::new(),
            monitor,
            directory,
            grace,
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

/// One worker connection.
struct Conn {
    stream: mio::net::TcpStream,
    peer: SocketAddr,
    buf: BytesMut,
    /// The worker (and incarnation) this connection registered, if any.
    worker: Option<(WorkerId, u64)>,
}

/// The event-plane thread's state.
struct PlaneServer {
    poll: Poll,
    listener: TcpListener,
    conns: HashMap<Token, Conn>,
    next_token: usize,
    /// Open connections per registered worker.
    live: HashMap<(WorkerId, u64), usize>,
    /// Workers whose last connection closed: deregister at the deadline
    /// unless they reconnected.
    pending: Vec<(Instant, WorkerId, u64)>,
    monitor: Arc<WorkerMonitor>,
    directory: Arc<WorkerDirectory>,
    grace: Duration,
    stop: Arc<AtomicBool>,
}

impl PlaneServer {
    fn run(&mut self) {
        let mut events = Events::with_capacity(256);
        loop {
            let timeout = self.pending.iter().map(|(at, ..)| at.saturating_duration_since(Instant::now())).min();
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
                    LISTENER => self.accept(),
                    WAKER => {}
                    token => self.serve(token),
                }
            }
            self.expire();
        }
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, peer)) => {
                    let token = Token(self.next_token);
                    self.next_token += 1;
                    if let Err(e) = self.poll.registry().register(&mut stream, token, Interest::READABLE) {
                        tracing::warn!(%peer, error = %e, "could not watch event connection");
                        continue;
                    }
                    tracing::debug!(%peer, "event connection opened");
                    self.conns.insert(token, Conn { stream, peer, buf: BytesMut::new(), worker: None });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!(error = %e, "event port accept failed");
                    return;
                }
            }
        }
    }

    /// Reads everything available on one connection (edge-triggered: until
    /// WouldBlock), applying each complete frame; closes it on EOF or error.
    fn serve(&mut self, token: Token) {
        let Some(mut conn) = self.conns.remove(&token) else { return };
        let mut chunk = [0u8; READ_CHUNK];
        let outcome = loop {
            match conn.stream.read(&mut chunk) {
                Ok(0) if conn.buf.is_empty() => break Err(None),
                Ok(0) => break Err(Some(format!("connection closed inside a frame ({} bytes)", conn.buf.len()))),
                Ok(n) => {
                    conn.buf.extend_from_slice(&chunk[..n]);
                    if let Err(e) = self.drain(&mut conn) {
                        break Err(Some(e));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(Some(e.to_string())),
            }
        };
        match outcome {
            Ok(()) => {
                self.conns.insert(token, conn);
            }
            Err(reason) => {
                match reason {
                    Some(reason) => {
                        tracing::warn!(peer = %conn.peer, worker = ?conn.worker, %reason, "closing event connection")
                    }
                    None => tracing::info!(peer = %conn.peer, worker = ?conn.worker, "event connection closed"),
                }
                self.close(conn);
            }
        }
    }

    /// Decodes and applies every complete frame in the buffer.
    fn drain(&mut self, conn: &mut Conn) -> Result<(), String> {
        while let Some(frame) = wire::decode(&mut conn.buf).map_err(|e| e.to_string())? {
            self.apply(conn, frame)?;
        }
        Ok(())
    }

    fn apply(&mut self, conn: &mut Conn, frame: Frame) -> Result<(), String> {
        match frame {
            Frame::Register { worker, incarnation, dp_size, model, http_addr } => {
                if conn.worker.is_some_and(|(w, i)| (w, i) != (worker, incarnation)) {
                    return Err(format!("connection already registered another worker, got {worker}"));
                }
                let outcome = self.monitor.register(worker, &model, dp_size, incarnation).map_err(|e| e.to_string())?;
                self.directory.insert(worker, &http_addr, dp_size);
                if conn.worker.is_none() {
                    conn.worker = Some((worker, incarnation));
                    *self.live.entry((worker, incarnation)).or_default() += 1;
                }
                match outcome {
                    Registered::New => {
                        tracing::info!(worker, incarnation, %model, dp_size, %http_addr, "worker registered")
                    }
                    Registered::Restarted => {
                        tracing::info!(worker, incarnation, %model, dp_size, %http_addr, "worker restarted; load reset")
                    }
                    Registered::Same => {}
                }
                Ok(())
            }
            Frame::Load { worker, incarnation, rank, seq, load } => {
                if conn.worker != Some((worker, incarnation)) {
                    return Err(format!("load for worker {worker} on a connection that did not register it"));
                }
                let report = LoadReport { worker, incarnation, rank, publisher: Publisher::Worker, seq, load };
                match self.monitor.apply(&report) {
                    Ok(Applied::OtherIncarnation) => {
                        tracing::debug!(worker, incarnation, "load of a replaced incarnation dropped");
                        Ok(())
                    }
                    Ok(_) => Ok(()),
                    Err(e) => Err(e.to_string()),
                }
            }
            Frame::Deregister { worker, incarnation } => {
                if conn.worker != Some((worker, incarnation)) {
                    return Err(format!("deregister for worker {worker} on a connection that did not register it"));
                }
                conn.worker = None;
                self.forget_connection(worker, incarnation);
                self.remove(worker, incarnation);
                Ok(())
            }
        }
    }

    fn close(&mut self, mut conn: Conn) {
        let _ = self.poll.registry().deregister(&mut conn.stream);
        if let Some((worker, incarnation)) = conn.worker {
            if self.forget_connection(worker, incarnation) == 0 {
                self.pending.push((Instant::now() + self.grace, worker, incarnation));
            }
        }
    }

    /// One connection of this incarnation of `worker` is gone; returns how
    /// many remain. Counted per incarnation: during a rolling restart the
    /// old and the new life are connected at once, and each must leave when
    /// its own last connection does.
    fn forget_connection(&mut self, worker: WorkerId, incarnation: u64) -> usize {
        let key = (worker, incarnation);
        let left = self.live.get(&key).map_or(0, |n| n.saturating_sub(1));
        if left == 0 {
            self.live.remove(&key);
        } else {
            self.live.insert(key, left);
        }
        left
    }

    /// Deregisters workers whose grace period passed without a reconnect.
    fn expire(&mut self) {
        let now = Instant::now();
        let mut due = Vec::new();
        self.pending.retain(|&(at, worker, incarnation)| {
            if at <= now {
                due.push((worker, incarnation));
                false
            } else {
                true
            }
        });
        for (worker, incarnation) in due {
            if !self.live.contains_key(&(worker, incarnation)) {
                self.remove(worker, incarnation);
            }
        }
    }

    /// Deregisters `worker` if `incarnation` is still its current one (a
    /// restarted worker that registered anew stays).
    fn remove(&mut self, worker: WorkerId, incarnation: u64) {
        if self.monitor.deregister_incarnation(worker, incarnation) {
            self.directory.remove(worker);
            tracing::info!(worker, incarnation, "worker deregistered");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MonitorConfig;

    /// Polls `check` until it holds (bounded, generous: CI machines are slow).
    fn eventually(what: &str, check: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !check() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn registration(worker: WorkerId) -> Registration {
        Registration { worker, incarnation: 1, model: "m".into(), dp_size: 2, http_addr: "127.0.0.1:1".into() }
    }

    fn load(blocks: u32) -> RankLoad {
        RankLoad { active_decode_blocks: blocks, kv_total_blocks: 100, ..Default::default() }
    }

    fn reported(monitor: &WorkerMonitor, worker: WorkerId, rank: u32) -> Option<RankLoad> {
        monitor.rank_snapshots().into_iter().find(|s| s.worker == worker && s.rank == rank).and_then(|s| s.reported)
    }

    fn plane(
        listener: std::net::TcpListener,
        config: MonitorConfig,
    ) -> (Arc<WorkerMonitor>, Arc<WorkerDirectory>, EventPlane) {
        let monitor = Arc::new(WorkerMonitor::new(config).unwrap());
        let directory = Arc::new(WorkerDirectory::default());
        let plane =
            EventPlane::start(listener, monitor.clone(), directory.clone(), Duration::from_millis(100)).unwrap();
        (monitor, directory, plane)
    }

    #[test]
    fn publisher_registers_reports_latest_and_deregisters_on_drop() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (monitor, directory, plane) = plane(listener, MonitorConfig::default());
        let publisher =
            EventPublisher::start(vec![plane.local_addr().to_string()], registration(5), Duration::from_millis(50))
                .unwrap();
        for blocks in 0..50 {
            publisher.report(1, load(blocks));
        }
        publisher.report(0, load(7));
        publisher.report(9, load(1)); // out of range: ignored
        eventually("the latest load of both ranks", || {
            reported(&monitor, 5, 1) == Some(load(49)) && reported(&monitor, 5, 0) == Some(load(7))
        });
        assert_eq!(directory.get(5).unwrap().base_url.as_ref(), "http://127.0.0.1:1");
        assert_eq!(directory.get(5).unwrap().dp_size, 2);
        drop(publisher); // sends Deregister: no grace period needed
        eventually("deregistration", || monitor.workers().is_empty() && directory.get(5).is_none());
    }

    #[test]
    fn publisher_reconnects_when_the_frontend_comes_up_later() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let publisher =
            EventPublisher::start(vec![format!("127.0.0.1:{port}")], registration(6), Duration::from_millis(20))
                .unwrap();
        publisher.report(0, load(3));
        std::thread::sleep(Duration::from_millis(100)); // a few refused connects
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        let (monitor, _directory, _plane) = plane(listener, MonitorConfig::default());
        eventually("registration and the state reported before the connection", || {
            reported(&monitor, 6, 0) == Some(load(3))
        });
    }

    #[test]
    fn heartbeats_keep_a_steady_load_fresh() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let config = MonitorConfig { staleness: Some(Duration::from_millis(300)), ..Default::default() };
        let (monitor, _directory, plane) = plane(listener, config);
        let publisher =
            EventPublisher::start(vec![plane.local_addr().to_string()], registration(8), Duration::from_millis(20))
                .unwrap();
        publisher.report(0, load(1));
        eventually("the first report", || reported(&monitor, 8, 0).is_some());
        // Three staleness windows without a change: heartbeats keep it fresh.
        std::thread::sleep(Duration::from_millis(900));
        assert_eq!(reported(&monitor, 8, 0), Some(load(1)));
    }

    /// A rolling restart: the new life registers while the old one is still
    /// connected; the new one crashes, then the old one leaves. The worker
    /// must not stay registered with no connection (found by review).
    #[test]
    fn each_incarnation_leaves_with_its_own_last_connection() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (monitor, directory, plane) = plane(listener, MonitorConfig::default());
        let frame = |f: Frame| {
            let mut buf = BytesMut::new();
            wire::encode(&f, &mut buf).unwrap();
            buf
        };
        let register = |incarnation| Frame::Register {
            worker: 7,
            incarnation,
            dp_size: 1,
            model: "m".into(),
            http_addr: "127.0.0.1:1".into(),
        };
        let mut old = TcpStream::connect(plane.local_addr()).unwrap();
        old.write_all(&frame(register(1))).unwrap();
        eventually("the old life", || monitor.incarnation(7) == Some(1));
        let mut new = TcpStream::connect(plane.local_addr()).unwrap();
        new.write_all(&frame(register(2))).unwrap();
        eventually("the new life", || monitor.incarnation(7) == Some(2));
        drop(new); // crashes
        old.write_all(&frame(Frame::Deregister { worker: 7, incarnation: 1 })).unwrap();
        eventually("the crashed new life deregistered after its grace", || {
            monitor.workers().is_empty() && directory.get(7).is_none()
        });
    }

    #[test]
    fn closed_connection_deregisters_after_grace_unless_reconnected() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (monitor, _directory, plane) = plane(listener, MonitorConfig::default());
        let mut frame = BytesMut::new();
        let register = Frame::Register {
            worker: 9,
            incarnation: 1,
            dp_size: 1,
            model: "m".into(),
            http_addr: "127.0.0.1:1".into(),
        };
        wire::encode(&register, &mut frame).unwrap();
        // Reconnect within the grace period: stays registered.
        let mut first = TcpStream::connect(plane.local_addr()).unwrap();
        first.write_all(&frame).unwrap();
        eventually("registration", || monitor.workers().len() == 1);
        drop(first);
        let mut second = TcpStream::connect(plane.local_addr()).unwrap();
        second.write_all(&frame).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(monitor.workers().len(), 1, "reconnected within the grace period");
        // Gone for good: deregistered.
        drop(second);
        eventually("deregistration after the grace period", || monitor.workers().is_empty());
    }
}
