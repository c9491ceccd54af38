//! Frontend side of the event plane: [`EventPlane`], ONE mio thread that
//! serves every worker connection and applies frames straight to the
//! [`WorkerMonitor`]. A bad frame closes only its own connection; a worker
//! whose last connection closes is deregistered after a grace period unless
//! it reconnects.

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use loadgate::wire::{self, Frame};
use loadgate::{
    monitor::{Applied, Publisher, Registered},
    LoadReport, WorkerId, WorkerMonitor,
};
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token, Waker};

use crate::directory::WorkerDirectory;

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
