//! The event plane end to end over real sockets: a publisher (or a raw
//! [`Peer`]) on one side, the frontend's listener (or a fake frontend) on
//! the other. One file per concept: the handshake, ownership, limits and
//! fair reading; the basics are here.

mod fairness;
mod handshake;
mod limits;
mod liveness;
mod ownership;
mod stall;

use std::io::{self, Read as _, Write as _};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use loadgate::wire::{self, Frame};
use loadgate::{MonitorConfig, RankLoad, WorkerId, WorkerMonitor};

use crate::directory::{WorkerDirectory, PROOF_REFUSAL_QUARANTINE};
use crate::events::listener::{EventPlane, PlaneConfig};
use crate::events::publisher::{EventPublisher, Registration};
use crate::events::{event_bind_host, PlaneLimits};
use crate::secret::Secrets;

/// The deregistration grace of these tests.
const GRACE: Duration = Duration::from_millis(100);

/// Polls `check` until it holds (bounded, generous: CI machines are slow).
fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
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

fn secrets(current: &str, previous: Option<&str>) -> Arc<Secrets> {
    Arc::new(Secrets::from_values(current.as_bytes(), previous.map(str::as_bytes)).unwrap())
}

/// A frontend's event plane on a free port with its monitor and directory.
struct Plane {
    monitor: Arc<WorkerMonitor>,
    directory: Arc<WorkerDirectory>,
    plane: EventPlane,
}

impl Plane {
    fn start(secrets: Option<Arc<Secrets>>, limits: PlaneLimits) -> Plane {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        Plane::on(listener, MonitorConfig::default(), secrets, limits)
    }

    fn on(
        listener: std::net::TcpListener,
        config: MonitorConfig,
        secrets: Option<Arc<Secrets>>,
        limits: PlaneLimits,
    ) -> Plane {
        Plane::silent_after(listener, config, secrets, limits, limits.event_idle_timeout)
    }

    /// As [`Plane::on`], with workers out of routing after `silence`.
    fn silent_after(
        listener: std::net::TcpListener,
        config: MonitorConfig,
        secrets: Option<Arc<Secrets>>,
        limits: PlaneLimits,
        silence: Duration,
    ) -> Plane {
        Plane::with_grace(listener, config, secrets, limits, (silence, GRACE))
    }

    /// As [`Plane::silent_after`], with its own deregistration grace:
    /// `(silence, grace)`.
    fn with_grace(
        listener: std::net::TcpListener,
        config: MonitorConfig,
        secrets: Option<Arc<Secrets>>,
        limits: PlaneLimits,
        (silence, grace): (Duration, Duration),
    ) -> Plane {
        let monitor = Arc::new(WorkerMonitor::new(config).unwrap());
        let directory = Arc::new(WorkerDirectory::new(monitor.clone()));
        let config = PlaneConfig { grace, secrets, limits, silence, stats: Default::default() };
        let plane = EventPlane::start(listener, monitor.clone(), directory.clone(), config).unwrap();
        Plane { monitor, directory, plane }
    }

    fn addr(&self) -> String {
        self.plane.local_addr().to_string()
    }

    /// A raw connection to it.
    fn peer(&self) -> Peer {
        Peer::connect(&self.addr())
    }

    fn registered(&self, worker: WorkerId) -> bool {
        self.monitor.incarnation(worker).is_some()
    }
}

/// A raw event-plane client (or, accepted, a fake frontend's end).
struct Peer {
    stream: TcpStream,
    buf: BytesMut,
}

impl Peer {
    fn connect(addr: &str) -> Peer {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_nodelay(true).unwrap();
        Peer { stream, buf: BytesMut::new() }
    }

    fn accepted(stream: TcpStream) -> Peer {
        stream.set_nonblocking(false).unwrap();
        stream.set_nodelay(true).unwrap();
        Peer { stream, buf: BytesMut::new() }
    }

    fn send(&mut self, frame: &Frame) -> io::Result<()> {
        let mut buf = BytesMut::new();
        wire::encode(frame, &mut buf).unwrap();
        self.stream.write_all(&buf)
    }

    /// The next frame, if one comes within `timeout` (`None` on EOF too).
    fn recv(&mut self, timeout: Duration) -> Option<Frame> {
        let deadline = Instant::now() + timeout;
        let mut chunk = [0u8; 512];
        loop {
            if let Some(frame) = wire::decode(&mut self.buf).unwrap() {
                return Some(frame);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.stream.set_read_timeout(Some(left)).unwrap();
            match self.stream.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Whether the other end closes the connection within `timeout`
    /// (whatever it sends before is discarded).
    fn closed_within(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut chunk = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.stream.set_read_timeout(Some(left)).unwrap();
            match self.stream.read(&mut chunk) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return true,
            }
        }
    }

    /// Answers the frontend's Challenge with a Proof under `secrets`;
    /// returns the Proof sent and the frontend's Welcome (if any).
    fn authenticate(&mut self, secrets: &Secrets) -> (Frame, Option<Frame>) {
        let Some(Frame::Challenge { nonce: challenge }) = self.recv(Duration::from_secs(5)) else {
            panic!("no challenge from the frontend");
        };
        let nonce: [u8; 32] = std::array::from_fn(|_| fastrand::u8(..));
        let proof = Frame::Proof { nonce, mac: secrets.event_proof(&challenge, &nonce) };
        self.send(&proof).unwrap();
        (proof, self.recv(Duration::from_secs(5)))
    }
}

fn register_frame(worker: WorkerId, incarnation: u64) -> Frame {
    Frame::Register { worker, incarnation, dp_size: 1, model: "m".into(), http_addr: "127.0.0.1:1".into() }
}

fn load_frame(worker: WorkerId, incarnation: u64, seq: u64, blocks: u32) -> Frame {
    Frame::Load { worker, incarnation, rank: 0, seq, load: load(blocks) }
}

#[test]
fn publisher_registers_reports_latest_and_deregisters_on_drop() {
    let plane = Plane::start(None, PlaneLimits::default());
    let publisher =
        EventPublisher::start(vec![plane.addr()], registration(5), Duration::from_millis(50), None).unwrap();
    for blocks in 0..50 {
        publisher.report(1, load(blocks));
    }
    publisher.report(0, load(7));
    publisher.report(9, load(1)); // out of range: ignored
    eventually("the latest load of both ranks", || {
        reported(&plane.monitor, 5, 1) == Some(load(49)) && reported(&plane.monitor, 5, 0) == Some(load(7))
    });
    assert_eq!(plane.directory.get(5).unwrap().base_url.as_ref(), "http://127.0.0.1:1");
    assert_eq!(plane.directory.get(5).unwrap().dp_size, 2);
    drop(publisher); // sends Deregister: no grace period needed
    eventually("deregistration", || plane.monitor.workers().is_empty() && plane.directory.get(5).is_none());
}

#[test]
fn publisher_reconnects_when_the_frontend_comes_up_later() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let publisher =
        EventPublisher::start(vec![format!("127.0.0.1:{port}")], registration(6), Duration::from_millis(20), None)
            .unwrap();
    publisher.report(0, load(3));
    std::thread::sleep(Duration::from_millis(100)); // a few refused connects
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let plane = Plane::on(listener, MonitorConfig::default(), None, PlaneLimits::default());
    eventually("registration and the state reported before the connection", || {
        reported(&plane.monitor, 6, 0) == Some(load(3))
    });
}

#[test]
fn heartbeats_keep_a_steady_load_fresh() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config = MonitorConfig { staleness: Some(Duration::from_millis(300)), ..Default::default() };
    let plane = Plane::on(listener, config, None, PlaneLimits::default());
    let publisher =
        EventPublisher::start(vec![plane.addr()], registration(8), Duration::from_millis(20), None).unwrap();
    publisher.report(0, load(1));
    eventually("the first report", || reported(&plane.monitor, 8, 0).is_some());
    // Three staleness windows without a change: heartbeats keep it fresh.
    std::thread::sleep(Duration::from_millis(900));
    assert_eq!(reported(&plane.monitor, 8, 0), Some(load(1)));
}

#[test]
fn closed_connection_deregisters_after_grace_unless_reconnected() {
    let plane = Plane::start(None, PlaneLimits::default());
    // Reconnect within the grace period: stays registered.
    let mut first = plane.peer();
    first.send(&register_frame(9, 1)).unwrap();
    eventually("registration", || plane.registered(9));
    drop(first);
    let mut second = plane.peer();
    second.send(&register_frame(9, 1)).unwrap();
    std::thread::sleep(GRACE * 3);
    assert!(plane.registered(9), "reconnected within the grace period");
    // Gone for good: deregistered.
    drop(second);
    eventually("deregistration after the grace period", || !plane.registered(9));
}

/// A worker's event connection made again (the same incarnation) keeps
/// the directory's count of its proof refusals in a row (and its
/// quarantine): reconnecting does not start its backoff over. A restart
/// (a new incarnation) does.
#[test]
fn a_reconnect_keeps_the_workers_refusals_and_a_restart_clears_them() {
    let plane = Plane::start(None, PlaneLimits::default());
    // Registered, and a load applied: every frame before it was handled.
    // (The Register is refused while the plane has not yet seen the last
    // connection close: then again, on a new connection.)
    let registered = |incarnation: u64, seq: u64| {
        for _ in 0..50 {
            let mut peer = plane.peer();
            peer.send(&register_frame(19, incarnation)).unwrap();
            peer.send(&load_frame(19, incarnation, seq, seq as u32)).unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && !peer.closed_within(Duration::from_millis(5)) {
                if reported(&plane.monitor, 19, 0) == Some(load(seq as u32)) {
                    return peer;
                }
            }
        }
        panic!("never registered");
    };
    let first = registered(1, 1);
    let refused = |n: u32| plane.directory.proof_refused(19) == Some(PROOF_REFUSAL_QUARANTINE * n);
    assert!(refused(1) && refused(2));
    drop(first);
    let again = registered(1, 2);
    assert!(refused(4), "a reconnect started the refusals over");
    drop(again);
    let _restarted = registered(2, 3);
    assert!(refused(1), "a restart keeps the old life's refusals");
}

#[test]
fn without_a_secret_the_event_listener_stays_on_loopback() {
    assert_eq!(event_bind_host("0.0.0.0", false), "127.0.0.1");
    assert_eq!(event_bind_host("10.1.2.3", false), "127.0.0.1");
    assert_eq!(event_bind_host("::", false), "127.0.0.1");
    for loopback in ["127.0.0.1", "127.0.0.2", "::1", "localhost"] {
        assert_eq!(event_bind_host(loopback, false), loopback);
    }
    assert_eq!(event_bind_host("0.0.0.0", true), "0.0.0.0");
}
