//! Worker side of the event plane: [`EventPublisher`], a std thread with one
//! blocking connection per frontend. It reconnects with backoff, coalesces
//! reports (at most one per rank per millisecond), numbers them, and re-sends
//! every rank's latest state as a heartbeat.

use std::io::{self, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use loadgate::wire::{self, Frame};
use loadgate::{RankLoad, WorkerId};

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
