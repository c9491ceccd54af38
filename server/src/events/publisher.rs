//! Worker side of the event plane: [`EventPublisher`], a std thread with one
//! blocking connection per frontend. It reconnects with backoff, coalesces
//! reports (at most one per rank per millisecond), numbers them, and re-sends
//! every rank's latest state as a heartbeat.
//!
//! Each connection is made (and, with the event secret, authenticated: see
//! `handshake.rs`) on a short-lived thread of its own, so a frontend that is
//! slow to accept or to answer the handshake never delays the reports to
//! the others. Sending is not: the one publisher thread writes to each
//! connection in turn with a blocking write (timeout 1 s, then the
//! connection is dropped and made again), so a frontend that stops reading
//! delays the others' reports by up to 1 s per batch until its send buffer
//! is drained or its connection dropped.
//!
//! A heartbeat goes out even before any rank has reported: the
//! Registration again (a no-op for the frontend), so the frontend's idle
//! timeout (`--event-idle-timeout-ms`) never closes a live worker.
//!
//! Reports are numbered from a [`ReportSeq`]: one per incarnation, shared by
//! every publisher of it, so a publisher started again in the same
//! incarnation (a sidecar rejoining routing) numbers on from the last one.
//!
//! A frontend that refuses the Register because another connection holds
//! the worker id answers with the holder's registration before it closes;
//! the publisher reads it when its next write fails and says so in its log.

use std::io::{self, Read as _, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use loadgate::wire::{self, Frame};
use loadgate::{RankLoad, WorkerId};

use super::handshake::prove_to_frontend;
use crate::secret::Secrets;

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
    /// The address it advertises for its HTTP server (`--advertise-addr`,
    /// else the bound address), `HOST:PORT`.
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

/// The seq numbers of one incarnation's load reports. Every publisher of
/// the incarnation must draw from the same one: the frontend keeps a
/// worker's slots across a Register of the same id and incarnation
/// (`Registered::Same`), and drops as stale any report not numbered above
/// the last it applied. A clone shares the count.
#[derive(Clone, Debug, Default)]
pub struct ReportSeq(Arc<AtomicU64>);

impl ReportSeq {
    /// The next number (the first is 1).
    pub(crate) fn next(&self) -> u64 {
        // Relaxed: the read-modify-write alone makes every number unique
        // and increasing; nothing else is published through it.
        self.0.fetch_add(1, Ordering::Relaxed) + 1
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
    /// Connection attempts that finished, by link index.
    arrived: Vec<(usize, io::Result<TcpStream>)>,
}

impl EventPublisher {
    /// Starts a background std thread that connects (and keeps reconnecting,
    /// with backoff) to every `frontends` address (`HOST:PORT`), sends the
    /// Registration on each (re)connect, then load reports: the latest
    /// [`RankLoad`] per rank, coalesced to at most one report per rank per
    /// millisecond, with increasing seq numbers, and re-sends every rank's
    /// latest state at least every `heartbeat` even when nothing changed.
    ///
    /// With `secrets`, each connection first answers the frontend's
    /// Challenge and checks its Welcome; a frontend that sends no Challenge
    /// within `HANDSHAKE_TIMEOUT` (2 s), closes the
    /// connection, or whose Welcome does not verify is logged and retried
    /// with the backoff.
    ///
    /// Its reports are numbered from 1 (see [`EventPublisher::start_numbered`]
    /// for a publisher that follows another in the same incarnation).
    ///
    /// # Errors
    ///
    /// `InvalidInput` when the registration does not fit in a frame or its
    /// dp size is 0; the thread's spawn error otherwise.
    pub fn start(
        frontends: Vec<String>,
        registration: Registration,
        heartbeat: Duration,
        secrets: Option<Arc<Secrets>>,
    ) -> io::Result<EventPublisher> {
        EventPublisher::start_numbered(frontends, registration, heartbeat, secrets, ReportSeq::default())
    }

    /// As [`EventPublisher::start`], numbering its reports from `seq`: give
    /// every publisher of one incarnation the same [`ReportSeq`], so one
    /// started after another (with the same id and incarnation) is never
    /// stale at a frontend that kept the worker's slots.
    ///
    /// # Errors
    ///
    /// As [`EventPublisher::start`].
    pub fn start_numbered(
        frontends: Vec<String>,
        registration: Registration,
        heartbeat: Duration,
        secrets: Option<Arc<Secrets>>,
        seq: ReportSeq,
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
            state: Mutex::new(PublishState {
                latest: vec![None; ranks],
                dirty: vec![false; ranks],
                stop: false,
                arrived: Vec::new(),
            }),
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
            // the frontend's slots; a publisher started again in the same
            // incarnation shares the count (see `ReportSeq`).
            seq,
            heartbeat: heartbeat.max(COALESCE),
            secrets,
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

impl EventPublisher {
    /// Forgets every rank's latest load: heartbeats carry none until the
    /// next report (the Registration alone keeps the worker alive), so the
    /// frontends let the last one age out (`--load-staleness-ms`).
    pub fn forget_loads(&self) {
        let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        state.latest.iter_mut().for_each(|load| *load = None);
        state.dirty.iter_mut().for_each(|dirty| *dirty = false);
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
    /// A connection attempt is under way on its own thread.
    connecting: bool,
    /// When the current stream was established.
    since: Instant,
    retry_at: Instant,
    backoff: Duration,
}

/// A connection that lived this long resets the backoff when it fails; a
/// frontend that refuses each connection soon after it opens (a wrong
/// secret, an id held by another connection, a limit) is retried at an
/// ever slower pace instead.
const STABLE: Duration = MAX_BACKOFF;

impl Link {
    fn new(addr: String) -> Self {
        let now = Instant::now();
        Link { addr, stream: None, connecting: false, since: now, retry_at: now, backoff: MIN_BACKOFF }
    }

    fn connected(&mut self, stream: TcpStream, now: Instant) {
        self.stream = Some(stream);
        self.since = now;
    }

    fn failed(&mut self, now: Instant, error: &io::Error) {
        let lost = self.stream.take().is_some();
        if lost && now.duration_since(self.since) >= STABLE {
            self.backoff = MIN_BACKOFF;
        }
        if error.kind() == io::ErrorKind::PermissionDenied {
            // The handshake failed: say why, every time (a misconfiguration).
            tracing::warn!(frontend = %self.addr, backoff = ?self.backoff, "{error}; retrying");
        } else if lost || self.backoff == MIN_BACKOFF {
            tracing::warn!(frontend = %self.addr, %error, "event plane connection lost; reconnecting");
        }
        self.retry_at = now + self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    /// The frontend refused our Register: `holder` (its Register, as the
    /// frontend sent it back) holds the worker id on another connection.
    /// Logged every time (a misconfiguration, or an impostor), retried with
    /// the backoff.
    fn held(&mut self, now: Instant, holder: &Frame) {
        self.stream = None;
        if let Frame::Register { worker, incarnation, model, http_addr, .. } = holder {
            tracing::warn!(
                frontend = %self.addr,
                backoff = ?self.backoff,
                "worker id {worker} is held by another connection to this frontend, a worker announcing \
                 {http_addr} (model {model:?}, incarnation {incarnation}): another process runs with this \
                 --worker-id, or an old one has not closed yet; retrying"
            );
        }
        self.retry_at = now + self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }
}

/// Connects to `addr` and, with `secrets`, does the handshake. Blocking: runs
/// on a connection thread.
fn connect(addr: &str, secrets: Option<&Secrets>) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "address resolved to nothing");
    for addr in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(mut stream) => {
                stream.set_nodelay(true)?;
                stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
                if let Some(secrets) = secrets {
                    prove_to_frontend(&mut stream, secrets)?;
                }
                return Ok(stream);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// What the publisher thread woke up for.
struct Wake {
    /// Which ranks changed since the last wake.
    changed: Vec<bool>,
    /// Every rank's latest state.
    latest: Vec<Option<RankLoad>>,
    /// Finished connection attempts, by link index.
    arrived: Vec<(usize, io::Result<TcpStream>)>,
}

/// The publisher thread.
struct Pump {
    shared: Arc<Shared>,
    links: Vec<Link>,
    register: Frame,
    worker: WorkerId,
    incarnation: u64,
    seq: ReportSeq,
    heartbeat: Duration,
    secrets: Option<Arc<Secrets>>,
}

impl Pump {
    fn run(&mut self) {
        let mut last_send = Instant::now() - COALESCE;
        let mut last_full = Instant::now();
        loop {
            let Some(Wake { changed, latest, arrived }) = self.wait(last_send, last_full) else {
                break;
            };
            let now = Instant::now();
            // Links whose connection attempt finished; a new connection gets
            // the full state.
            for (i, result) in arrived {
                self.links[i].connecting = false;
                match result {
                    Ok(stream) => {
                        self.links[i].connected(stream, now);
                        let mut buf = BytesMut::new();
                        // Checked at start: the registration fits.
                        let _ = wire::encode(&self.register, &mut buf);
                        self.encode_loads(&latest, |_| true, &mut buf);
                        self.send(i, &buf, now);
                    }
                    Err(e) => self.links[i].failed(now, &e),
                }
            }
            // Start the due connection attempts.
            for i in 0..self.links.len() {
                let link = &self.links[i];
                if link.stream.is_none() && !link.connecting && now >= link.retry_at {
                    self.spawn_connect(i, now);
                }
            }
            let heartbeat_due = now.duration_since(last_full) >= self.heartbeat;
            if heartbeat_due {
                last_full = now;
            }
            let mut buf = BytesMut::new();
            self.encode_loads(&latest, |rank| heartbeat_due || changed[rank], &mut buf);
            if heartbeat_due && buf.is_empty() {
                // No rank has reported yet: the Registration is the heartbeat.
                // Checked at start: it fits.
                let _ = wire::encode(&self.register, &mut buf);
            }
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

    /// Starts a connection attempt for link `i` on its own thread; its
    /// result arrives through the shared state.
    fn spawn_connect(&mut self, i: usize, now: Instant) {
        let addr = self.links[i].addr.clone();
        let secrets = self.secrets.clone();
        let shared = self.shared.clone();
        let spawned = std::thread::Builder::new().name("event-connect".into()).spawn(move || {
            let result = connect(&addr, secrets.as_deref());
            shared.state.lock().unwrap_or_else(|e| e.into_inner()).arrived.push((i, result));
            shared.wake.notify_one();
        });
        match spawned {
            Ok(_) => self.links[i].connecting = true,
            Err(e) => self.links[i].failed(now, &e),
        }
    }

    /// Waits until a rank changed (and the coalescing window has passed), a
    /// heartbeat or reconnect is due, a connection attempt finished, or
    /// stop (`None`).
    fn wait(&self, last_send: Instant, last_full: Instant) -> Option<Wake> {
        let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if state.stop {
                return None;
            }
            let now = Instant::now();
            let coalesced = now.duration_since(last_send) >= COALESCE;
            let mut deadline = last_full + self.heartbeat;
            for link in self.links.iter().filter(|l| l.stream.is_none() && !l.connecting) {
                deadline = deadline.min(link.retry_at);
            }
            let dirty = state.dirty.iter().any(|d| *d);
            if (dirty && coalesced) || now >= deadline || !state.arrived.is_empty() {
                let ranks = state.latest.len();
                let changed = std::mem::replace(&mut state.dirty, vec![false; ranks]);
                let arrived = std::mem::take(&mut state.arrived);
                return Some(Wake { changed, latest: state.latest.clone(), arrived });
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
                let frame = Frame::Load {
                    worker: self.worker,
                    incarnation: self.incarnation,
                    rank: rank as u32,
                    seq: self.seq.next(),
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
                match last_word(stream, self.worker) {
                    LastWord::Holder(holder) => link.held(now, &holder),
                    LastWord::Challenge => {
                        link.failed(now, &io::Error::new(io::ErrorKind::PermissionDenied, NO_SECRET))
                    }
                    LastWord::Nothing => link.failed(now, &e),
                }
            }
        }
    }
}

/// The most bytes read from a failed connection for the frontend's last
/// word (a Register is at most one frame).
const LAST_WORD: usize = wire::MAX_FRAME;

/// Why a frontend that sent a Challenge to a worker without a secret
/// closed on it.
const NO_SECRET: &str = "the frontend expects an event secret (it sent a handshake challenge) and this worker has \
    none: give the worker the frontend's secret (LOADGATE_EVENT_SECRET or --event-secret-file)";

/// What the frontend said before it closed a connection.
enum LastWord {
    /// It refused our Register: this Register (sent back) holds the id.
    Holder(Frame),
    /// It sent a Challenge we never answered: it has a secret, we do not.
    Challenge,
    /// Nothing that explains the close.
    Nothing,
}

/// After a write to `stream` failed: the frontend's last word. Either the
/// registration it sent before it closed, when it refused our Register
/// because another connection holds `worker` (it answers with the holder's
/// Register), or a Challenge, when it asked for the secret this worker
/// does not have. Reads what is already there, at most [`LAST_WORD`]
/// bytes, never waits.
fn last_word(stream: &mut TcpStream, worker: WorkerId) -> LastWord {
    if stream.set_nonblocking(true).is_err() {
        return LastWord::Nothing;
    }
    let mut buf = BytesMut::new();
    let mut chunk = [0u8; 1024];
    while buf.len() < LAST_WORD {
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // WouldBlock (nothing more), a reset after the data: done.
            Err(_) => break,
        }
    }
    let mut word = LastWord::Nothing;
    while let Ok(Some(frame)) = wire::decode(&mut buf) {
        match frame {
            Frame::Register { worker: w, .. } if w == worker => return LastWord::Holder(frame),
            Frame::Challenge { .. } => word = LastWord::Challenge,
            _ => {}
        }
    }
    word
}
