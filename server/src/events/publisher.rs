//! Worker side of the event plane: [`EventPublisher`], one std thread per
//! frontend, each with its own blocking connection. Each thread connects
//! (and, with the event secret, authenticates: see `handshake.rs`),
//! reconnects with backoff, coalesces reports (at most one per rank per
//! millisecond), numbers them, and re-sends every rank's latest state as a
//! heartbeat.
//!
//! A frontend that is slow to accept, to answer the handshake or to read
//! delays only its own thread: a write blocks at most 1 s, then the
//! connection is dropped and made again. Reports are state, not a stream
//! of events: a thread that was held up sends each changed rank's latest
//! load once, never a backlog.
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
/// port, each from a background thread of its own.
#[derive(Debug)]
pub struct EventPublisher {
    shared: Arc<Shared>,
    dp_size: u32,
    threads: Vec<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<PublishState>,
    /// Notified (all) at every change and at stop.
    wake: Condvar,
}

#[derive(Debug)]
struct PublishState {
    latest: Vec<Option<RankLoad>>,
    /// For each frontend (by index), the ranks changed since its thread
    /// last took them.
    dirty: Vec<Vec<bool>>,
    stop: bool,
    /// Threads that have finished (after their Deregister).
    finished: usize,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, PublishState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl EventPublisher {
    /// Starts one background std thread per `frontends` address
    /// (`HOST:PORT`) that connects (and keeps reconnecting, with backoff),
    /// sends the Registration on each (re)connect, then load reports: the
    /// latest [`RankLoad`] per rank, coalesced to at most one report per
    /// rank per millisecond, with increasing seq numbers, and re-sends
    /// every rank's latest state at least every `heartbeat` (held between
    /// a millisecond and [`MAX_SECS`](crate::flag_limits::MAX_SECS)) even
    /// when nothing changed.
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
    /// dp size is 0; a thread's spawn error otherwise.
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
                dirty: vec![vec![false; ranks]; frontends.len()],
                stop: false,
                finished: 0,
            }),
            wake: Condvar::new(),
        });
        let mut publisher =
            EventPublisher { shared: shared.clone(), dp_size: registration.dp_size, threads: Vec::new() };
        for (index, addr) in frontends.into_iter().enumerate() {
            let pump = Pump {
                shared: shared.clone(),
                index,
                link: Link::new(addr),
                register: register.clone(),
                worker: registration.worker,
                incarnation: registration.incarnation,
                // Per incarnation: a restart registers a new one, which
                // resets the frontend's slots; a publisher started again in
                // the same incarnation shares the count (see `ReportSeq`).
                seq: seq.clone(),
                // At most a day: a deadline past the clock's range panics.
                heartbeat: heartbeat.clamp(COALESCE, Duration::from_secs(crate::flag_limits::MAX_SECS)),
                secrets: secrets.clone(),
            };
            // A failed spawn drops `publisher`: the threads started stop.
            let thread = std::thread::Builder::new().name("event-publisher".into()).spawn(move || pump.run())?;
            publisher.threads.push(thread);
        }
        Ok(publisher)
    }

    /// Records rank `rank`'s latest load; never blocks on the network (cheap,
    /// callable from the engine loop). A rank outside the dp size is ignored.
    pub fn report(&self, rank: u32, load: RankLoad) {
        if rank >= self.dp_size {
            return;
        }
        let mut state = self.shared.lock();
        if state.latest[rank as usize] != Some(load) {
            state.latest[rank as usize] = Some(load);
            state.dirty.iter_mut().for_each(|dirty| dirty[rank as usize] = true);
            self.shared.wake.notify_all();
        }
    }

    /// Forgets every rank's latest load: heartbeats carry none until the
    /// next report (the Registration alone keeps the worker alive), so the
    /// frontends let the last one age out (`--load-staleness-ms`).
    pub fn forget_loads(&self) {
        let mut state = self.shared.lock();
        state.latest.iter_mut().for_each(|load| *load = None);
        state.dirty.iter_mut().flatten().for_each(|dirty| *dirty = false);
    }
}

/// The longest [`EventPublisher`]'s drop waits for its threads.
const STOP_WAIT: Duration = WRITE_TIMEOUT;

impl Drop for EventPublisher {
    /// Stops every thread; each connected one sends a Deregister first.
    /// Waits for them up to [`STOP_WAIT`]: a thread still in a connection
    /// attempt or a blocked write then finishes on its own, and sends its
    /// Deregister when that write goes through (a successor publisher of
    /// the same worker may then see it deregistered once more, briefly).
    fn drop(&mut self) {
        let deadline = Instant::now() + STOP_WAIT;
        let mut state = self.shared.lock();
        state.stop = true;
        self.shared.wake.notify_all();
        while state.finished < self.threads.len() {
            let wait = deadline.saturating_duration_since(Instant::now());
            if wait.is_zero() {
                break;
            }
            state = self.shared.wake.wait_timeout(state, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
        drop(state);
        for thread in self.threads.drain(..).filter(JoinHandle::is_finished) {
            let _ = thread.join();
        }
    }
}

/// One frontend connection of the publisher.
struct Link {
    addr: String,
    stream: Option<TcpStream>,
    /// When the current stream was established.
    since: Instant,
    /// The Registration went out on the current stream.
    registered: bool,
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
        Link { addr, stream: None, since: now, registered: false, retry_at: now, backoff: MIN_BACKOFF }
    }

    fn connected(&mut self, stream: TcpStream, now: Instant) {
        self.stream = Some(stream);
        self.since = now;
        self.registered = false;
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

/// Connects to `addr` and, with `secrets`, does the handshake. Blocking.
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

/// What a frontend's thread woke up for.
struct Wake {
    /// Which ranks changed since it last took them.
    changed: Vec<bool>,
    /// Every rank's latest state.
    latest: Vec<Option<RankLoad>>,
}

/// The thread of one frontend.
struct Pump {
    shared: Arc<Shared>,
    /// The frontend's index in the publisher's state.
    index: usize,
    link: Link,
    register: Frame,
    worker: WorkerId,
    incarnation: u64,
    seq: ReportSeq,
    heartbeat: Duration,
    secrets: Option<Arc<Secrets>>,
}

impl Pump {
    fn run(mut self) {
        while self.sleep_until(self.link.retry_at) {
            match connect(&self.link.addr, self.secrets.as_deref()) {
                Ok(stream) => self.link.connected(stream, Instant::now()),
                Err(e) => {
                    self.link.failed(Instant::now(), &e);
                    continue;
                }
            }
            if !self.serve() {
                break;
            }
        }
        // A connection made while the publisher stopped never registered:
        // nothing to take back on it.
        if let Some(stream) = self.link.stream.as_mut().filter(|_| self.link.registered) {
            let mut bye = BytesMut::new();
            let _ = wire::encode(&Frame::Deregister { worker: self.worker, incarnation: self.incarnation }, &mut bye);
            let _ = stream.write_all(&bye);
        }
        self.shared.lock().finished += 1;
        self.shared.wake.notify_all();
    }

    /// Waits until `at` (true), or until the publisher stops (false).
    fn sleep_until(&self, at: Instant) -> bool {
        let mut state = self.shared.lock();
        loop {
            if state.stop {
                return false;
            }
            let wait = at.saturating_duration_since(Instant::now());
            if wait.is_zero() {
                return true;
            }
            state = self.shared.wake.wait_timeout(state, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// On a new connection: the Registration and every rank's state, then
    /// the changes and heartbeats until the connection fails (true) or the
    /// publisher stops (false, the connection kept for the Deregister).
    fn serve(&mut self) -> bool {
        let mut last_full = Instant::now();
        let mut last_send = last_full;
        let mut full = true;
        loop {
            let Some(Wake { changed, latest }) = self.wait(last_send, last_full, full) else {
                return false;
            };
            let now = Instant::now();
            let heartbeat_due = full || now.duration_since(last_full) >= self.heartbeat;
            if heartbeat_due {
                last_full = now;
            }
            let mut buf = BytesMut::new();
            if full {
                // Checked at start: the registration fits.
                let _ = wire::encode(&self.register, &mut buf);
            }
            self.encode_loads(&latest, |rank| heartbeat_due || changed[rank], &mut buf);
            if heartbeat_due && buf.is_empty() {
                // No rank has reported yet: the Registration is the heartbeat.
                // Checked at start: it fits.
                let _ = wire::encode(&self.register, &mut buf);
            }
            full = false;
            if !buf.is_empty() {
                if !self.send(&buf, now) {
                    return true;
                }
                self.link.registered = true;
                last_send = now;
            }
        }
    }

    /// Waits until a rank changed (and the coalescing window has passed),
    /// a heartbeat is due, or at once with `now`; takes the changes.
    /// `None`: the publisher stops.
    fn wait(&self, last_send: Instant, last_full: Instant, now: bool) -> Option<Wake> {
        let mut state = self.shared.lock();
        loop {
            if state.stop {
                return None;
            }
            let at = Instant::now();
            let coalesced = at.duration_since(last_send) >= COALESCE;
            let mut deadline = last_full + self.heartbeat;
            let dirty = state.dirty[self.index].iter().any(|d| *d);
            if now || (dirty && coalesced) || at >= deadline {
                let ranks = state.latest.len();
                let changed = std::mem::replace(&mut state.dirty[self.index], vec![false; ranks]);
                return Some(Wake { changed, latest: state.latest.clone() });
            }
            if dirty {
                deadline = deadline.min(last_send + COALESCE);
            }
            let wait = deadline.saturating_duration_since(at);
            state = self.shared.wake.wait_timeout(state, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    fn encode_loads(&self, latest: &[Option<RankLoad>], pick: impl Fn(usize) -> bool, buf: &mut BytesMut) {
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

    /// Writes `buf`; false (the connection dropped, its retry set) if it
    /// failed.
    fn send(&mut self, buf: &[u8], now: Instant) -> bool {
        let link = &mut self.link;
        let Some(stream) = link.stream.as_mut() else { return false };
        let Err(e) = stream.write_all(buf) else { return true };
        match last_word(stream, self.worker) {
            LastWord::Holder(holder) => link.held(now, &holder),
            LastWord::Challenge => link.failed(now, &io::Error::new(io::ErrorKind::PermissionDenied, NO_SECRET)),
            LastWord::Nothing => link.failed(now, &e),
        }
        false
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
