//! [`EngineReports`]: the sidecar's load reports. Every scrape of the engine
//! (`crate::engines::scrape::spawn_scraper`) becomes one report per rank
//! through the worker's [`EventPublisher`]: the engine's own load, with
//! `waiting_requests` = the engine's waiting requests + the requests queued
//! in the sidecar's hard cap (they wait for whichever rank frees first, so
//! every rank carries them; a worker is busy only when all its ranks are).
//! The queue is read at each successful scrape, so the frontend sees it
//! at most one scrape interval and one scrape's duration late; while
//! scrapes fail, neither the engine's load nor the queue is reported (the
//! heartbeats then carry no load, see `on_scrape`).
//!
//! # An engine that stops answering
//!
//! After `--engine-scrape-failures` (K) failed scrapes in a row the worker
//! is unhealthy (`/health` 503) and leaves routing: its publisher is
//! dropped, which sends a Deregister to every frontend and closes its event
//! connections. Only stopping the reports would not do: the publisher
//! re-sends the last load as a heartbeat, so the frontends' silence
//! detection would never fire; a Deregister takes the worker out at once,
//! instead of after `--event-silence-ms`, and no stale load stays behind.
//! The next successful scrape makes it healthy again and starts a new
//! publisher (the same id and incarnation), which registers anew with the
//! fresh load. A new publisher is only started once the old one has sent
//! its Deregisters and closed, so a frontend never sees the two overlap.
//! Requests already admitted keep being proxied meanwhile.
//!
//! These transitions are logged through one throttle
//! ([`transitions_log`]: 10 lines per 10 s, the next line that passes
//! counting those held back), as the frontend logs its `--engine`s': an
//! engine that flaps between failing and answering would otherwise write
//! two lines a cycle for as long as it flaps.
//!
//! # An engine back with another model
//!
//! An engine that comes back after failed scrapes may have been restarted
//! with another model on the same address (llama.cpp answers a request for
//! any model with its own). Unless the model was named (`--model` or
//! `model=`), the scraper then reads `/v1/models` again
//! ([`ScrapeEvent::Listed`]); while the worker's model is not listed, the
//! worker stays out of routing, unhealthy, and says why, and a request
//! that still reaches it is not sent to the engine (a 502 that a frontend
//! moves to another worker); it rejoins once the engine lists it again. A
//! list that cannot be read counts as a failed scrape: the worker does not
//! rejoin on a model nobody checked.
//!
//! # The seq survives a rejoin
//!
//! A Deregister can miss a frontend (its connection was down, or the write
//! timed out); that frontend still holds the worker through its grace, and
//! the new publisher's Register (same id, same incarnation) keeps the
//! worker's slots there (`Registered::Same`). Its reports must then be
//! numbered above the old publisher's, or the frontend drops them all as
//! stale and the worker stays frozen at its last load. So every publisher
//! of the sidecar draws from one [`ReportSeq`], made once per run.
//!
//! The rejoin keeps the incarnation rather than taking a new one: the
//! incarnation is this run of the worker process, which the frontends'
//! request proofs name (the worker refuses a proof for another one), and
//! which the router's tracking of the requests still in flight here is
//! keyed by (a new incarnation would reset it while those requests run).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loadgate::engines::EngineSnapshot;
use loadgate::{Admission, RankLoad};

use crate::engines::scrape::{transitions_log, ScrapeEvent};
use crate::events::{EventPublisher, Registration, ReportSeq};
use crate::nats::{NatsLink, NatsPublisher};
use crate::secret::Secrets;
use crate::throttle::LogThrottle;

/// Whether the engine answers its scrapes, for `/health`.
#[derive(Debug)]
pub(crate) struct EngineHealth {
    healthy: AtomicBool,
    /// Why it is unhealthy (the last scrape error).
    reason: Mutex<String>,
    /// The engine no longer lists the worker's model (the reason says
    /// what it lists): its requests are not sent to it.
    other_model: AtomicBool,
}

impl EngineHealth {
    /// Healthy (the sidecar starts after a successful scrape).
    pub(crate) fn new() -> Self {
        EngineHealth {
            healthy: AtomicBool::new(true),
            reason: Mutex::new(String::new()),
            other_model: AtomicBool::new(false),
        }
    }

    /// `Some(why)` while the engine serves another model than the worker's.
    pub(crate) fn other_model(&self) -> Option<String> {
        // Relaxed: a flag read on its own; the reason is read under its lock.
        if !self.other_model.load(Ordering::Relaxed) {
            return None;
        }
        Some(self.reason.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// `None` when healthy, else why not.
    pub(crate) fn problem(&self) -> Option<String> {
        // Relaxed: a flag read on its own; the reason is read under its lock.
        if self.healthy.load(Ordering::Relaxed) {
            return None;
        }
        Some(self.reason.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    fn set(&self, healthy: bool, reason: &str) {
        if !healthy {
            reason.clone_into(&mut self.reason.lock().unwrap_or_else(|e| e.into_inner()));
        }
        // Relaxed: `problem` reads the reason under the lock, not through this flag.
        self.healthy.store(healthy, Ordering::Relaxed);
    }
}

/// How to start the worker's publisher (again).
#[derive(Debug)]
pub(crate) struct PublisherConfig {
    /// The frontends' event ports (none: a standalone sidecar, nothing published).
    pub(crate) frontends: Vec<String>,
    /// What the worker registers as.
    pub(crate) registration: Registration,
    /// `--heartbeat-ms`.
    pub(crate) heartbeat: Duration,
    /// The event secret.
    pub(crate) secrets: Option<Arc<Secrets>>,
    /// `--event-plane nats`: the worker's connection to NATS.
    pub(crate) nats: Option<NatsLink>,
}

/// The worker's publishers: TCP to each `--frontend`, NATS, or both.
#[derive(Debug)]
pub(crate) struct Publishers {
    pub(crate) tcp: Option<EventPublisher>,
    pub(crate) nats: Option<NatsPublisher>,
}

impl Publishers {
    /// No load is re-sent as a heartbeat until the next report.
    fn forget_loads(&self) {
        if let Some(tcp) = &self.tcp {
            tcp.forget_loads();
        }
        if let Some(nats) = &self.nats {
            nats.forget_loads();
        }
    }

    fn report(&self, rank: u32, load: RankLoad) {
        if let Some(tcp) = &self.tcp {
            tcp.report(rank, load);
        }
        if let Some(nats) = &self.nats {
            nats.report(rank, load);
        }
    }
}

/// The load path of the sidecar (see the module docs).
#[derive(Debug)]
pub(crate) struct EngineReports {
    config: PublisherConfig,
    /// The numbering of this run's reports, shared by every publisher.
    seq: ReportSeq,
    /// `None` while out of routing (or standalone).
    publisher: Option<Publishers>,
    /// The previous publisher being dropped (its Deregisters going out).
    retiring: Option<tokio::task::JoinHandle<()>>,
    admission: Option<Arc<Admission<()>>>,
    health: Arc<EngineHealth>,
    failures_to_leave: u32,
    /// A rank count other than the registered dp size was logged.
    warned_ranks: bool,
    /// Why the engine's models no longer include the worker's (out of
    /// routing until they do again).
    model_gone: Option<String>,
    /// The transitions' lines (an engine may flap at every scrape).
    log: LogThrottle,
}

impl EngineReports {
    /// Starts publishing (unless standalone) and reports `first`, the
    /// scrape the sidecar started with.
    ///
    /// # Errors
    ///
    /// The publisher cannot start (an oversized registration, no thread).
    pub(crate) fn start(
        config: PublisherConfig,
        admission: Option<Arc<Admission<()>>>,
        health: Arc<EngineHealth>,
        failures_to_leave: u32,
        first: &EngineSnapshot,
    ) -> std::io::Result<EngineReports> {
        let mut reports = EngineReports {
            config,
            seq: ReportSeq::default(),
            publisher: None,
            retiring: None,
            admission,
            health,
            failures_to_leave: failures_to_leave.max(1),
            warned_ranks: false,
            model_gone: None,
            log: transitions_log(),
        };
        reports.publisher = reports.new_publisher()?;
        reports.report(first);
        Ok(reports)
    }

    fn new_publisher(&self) -> std::io::Result<Option<Publishers>> {
        let config = &self.config;
        let tcp = match config.frontends.is_empty() {
            true => None,
            false => Some(EventPublisher::start_numbered(
                config.frontends.clone(),
                config.registration.clone(),
                config.heartbeat,
                config.secrets.clone(),
                self.seq.clone(),
            )?),
        };
        // The worker refuses `--event-plane nats` without a secret.
        let nats = config.nats.as_ref().zip(config.secrets.as_ref()).map(|(link, secrets)| {
            NatsPublisher::start(link, config.registration.clone(), config.heartbeat, secrets.clone(), self.seq.clone())
        });
        Ok((tcp.is_some() || nats.is_some()).then_some(Publishers { tcp, nats }))
    }

    /// One scrape's outcome: report it, or count it towards leaving routing.
    pub(crate) fn on_scrape(&mut self, event: ScrapeEvent) {
        match event {
            // The frontends' lines count a report from when it arrives: they
            // cannot know when this scrape was sent.
            ScrapeEvent::Sending => {}
            ScrapeEvent::Loaded(snapshot) => {
                if self.health.problem().is_some() && (self.model_gone.is_some() || !self.rejoin()) {
                    return;
                }
                self.report(&snapshot);
            }
            ScrapeEvent::Failed { consecutive, error } => {
                if consecutive == 1 {
                    tracing::debug!(%error, "engine scrape failed");
                    // The heartbeats would re-send the last good load as
                    // fresh until the worker leaves routing: the frontends'
                    // `--load-staleness-ms` ages it out instead, as when
                    // they scrape the engine themselves.
                    if let Some(publisher) = &self.publisher {
                        publisher.forget_loads();
                    }
                }
                if consecutive >= self.failures_to_leave && self.health.problem().is_none() {
                    let reason = format!("{consecutive} engine scrapes failed in a row; the last: {error}");
                    if let Some(suppressed) = self.log.admit() {
                        tracing::warn!(
                            suppressed,
                            "{reason}: unhealthy, leaving routing (Deregister to every frontend)"
                        );
                    }
                    self.leave(&reason);
                }
            }
            ScrapeEvent::Listed { missing, listed } => match (missing.is_empty(), self.model_gone.take()) {
                (true, Some(_)) => {
                    // Relaxed: see `other_model`.
                    self.health.other_model.store(false, Ordering::Relaxed);
                    if let Some(suppressed) = self.log.admit() {
                        tracing::info!(?listed, suppressed, "the engine lists the worker's model again");
                    }
                }
                (true, None) => {}
                (false, gone) => {
                    let reason = format!(
                        "the engine came back serving {listed:?}, not {missing:?}: \
                         restart the worker to serve its new model"
                    );
                    if gone.is_none() {
                        if let Some(suppressed) = self.log.admit() {
                            tracing::error!(
                                suppressed,
                                "{reason}: unhealthy, leaving routing (Deregister to every frontend)"
                            );
                        }
                    }
                    // Relaxed: before the reason is written under its lock,
                    // so whoever reads that reason (`/health`) sees this too.
                    self.health.other_model.store(true, Ordering::Relaxed);
                    self.leave(&reason);
                    self.model_gone = Some(reason);
                }
            },
        }
    }

    /// Unhealthy for `reason`, and out of routing: the publisher is dropped
    /// (its Deregisters go out) if it still runs.
    fn leave(&mut self, reason: &str) {
        self.health.set(false, reason);
        if let Some(Publishers { tcp, nats }) = self.publisher.take() {
            self.retiring = Some(tokio::spawn(async move {
                // The NATS Deregister goes out (bounded) before a
                // rejoin's Register can.
                if let Some(nats) = nats {
                    nats.shutdown().await;
                }
                // Its drop sends the Deregisters (blocking writes, 1 s timeout each).
                if let Some(tcp) = tcp {
                    let _ = tokio::task::spawn_blocking(move || drop(tcp)).await;
                }
            }));
        }
    }

    /// Healthy again: a new publisher once the old one is gone. False when
    /// it must wait for the old one (the next success tries again).
    fn rejoin(&mut self) -> bool {
        if self.retiring.as_ref().is_some_and(|old| !old.is_finished()) {
            return false;
        }
        self.retiring = None;
        match self.new_publisher() {
            Ok(publisher) => self.publisher = publisher,
            Err(error) => {
                if let Some(suppressed) = self.log.admit() {
                    tracing::warn!(%error, suppressed, "cannot start the event publisher; retrying at the next scrape");
                }
                return false;
            }
        }
        self.health.set(true, "");
        if let Some(suppressed) = self.log.admit() {
            tracing::info!(suppressed, "the engine answers its scrapes again: healthy, rejoining routing");
        }
        true
    }

    /// Reports every rank of `snapshot`, each with the sidecar's queue
    /// added. A rank the engine no longer reports (fewer than at start)
    /// reports the field-wise maximum of those it does, so it never decides
    /// whether the worker is busy: the ranks the engine reports do (it is
    /// busy when they all are). Left as it was, its last load would be
    /// re-sent as fresh at every heartbeat.
    fn report(&mut self, snapshot: &EngineSnapshot) {
        let queued = self.admission.as_ref().map_or(0, |a| u32::try_from(a.queued()).unwrap_or(u32::MAX));
        let dp_size = self.config.registration.dp_size as usize;
        if snapshot.ranks.len() != dp_size && !self.warned_ranks {
            self.warned_ranks = true;
            tracing::warn!(
                ranks = snapshot.ranks.len(),
                dp_size,
                "the engine reports another number of ranks than at start: extra ones are not reported, \
                 missing ones report the busiest of the others (restart the worker to register the new count)"
            );
        }
        let Some(publisher) = &self.publisher else { return };
        let busiest = snapshot.ranks.iter().map(|sample| sample.load).reduce(|a, b| a.max_with(&b));
        for rank in 0..dp_size {
            let load = snapshot.ranks.get(rank).map(|sample| sample.load).or(busiest).unwrap_or_default();
            publisher.report(rank as u32, with_queue(load, queued));
        }
    }

    /// Stops reporting and hands over the publisher (for the shutdown's
    /// Deregister).
    pub(crate) fn take_publisher(&mut self) -> Option<Publishers> {
        self.publisher.take()
    }
}

/// `load` with the sidecar's `queued` requests added to its waiting ones.
pub(crate) fn with_queue(load: RankLoad, queued: u32) -> RankLoad {
    RankLoad { waiting_requests: load.waiting_requests.saturating_add(queued), ..load }
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;
    use std::net::{TcpListener, TcpStream};
    use std::time::Instant;

    use bytes::BytesMut;
    use loadgate::engines::RankSample;
    use loadgate::wire::{self, Frame};

    use super::*;

    /// A scrape of one rank with `waiting` requests.
    fn scrape(waiting: u32) -> EngineSnapshot {
        let load = RankLoad { waiting_requests: waiting, kv_total_blocks: 10, ..RankLoad::default() };
        EngineSnapshot { ranks: vec![RankSample { load, running_requests: 0 }] }
    }

    /// A fake frontend's end of one publisher connection (bounded waits).
    struct Accepted {
        stream: TcpStream,
        buf: BytesMut,
    }

    impl Accepted {
        fn from(listener: &TcpListener) -> Accepted {
            listener.set_nonblocking(true).unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match listener.accept() {
                    Ok((stream, _)) => {
                        stream.set_nonblocking(false).unwrap();
                        return Accepted { stream, buf: BytesMut::new() };
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        assert!(Instant::now() < deadline, "the publisher did not connect");
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            }
        }

        /// The next frame; `None` at EOF.
        fn next(&mut self) -> Option<Frame> {
            self.stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut chunk = [0u8; 1024];
            loop {
                if let Some(frame) = wire::decode(&mut self.buf).unwrap() {
                    return Some(frame);
                }
                match self.stream.read(&mut chunk) {
                    Ok(0) => return None,
                    Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                    Err(e) => panic!("no frame within 10 s: {e}"),
                }
            }
        }
    }

    /// A frontend that still holds the worker after the sidecar left routing
    /// (its Deregister lost) keeps its slots when the new publisher registers
    /// the same id and incarnation: the new publisher's reports must be
    /// numbered above every report of the old one, or they are all stale.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rejoin_numbers_its_reports_on_from_the_previous_publisher() {
        let frontend = TcpListener::bind("127.0.0.1:0").unwrap();
        let health = Arc::new(EngineHealth::new());
        let mut reports = EngineReports::start(config(&frontend, 1), None, health.clone(), 1, &scrape(1)).unwrap();
        let mut old = Accepted::from(&frontend);
        let mut last_old = 0;
        let mut loads = 0;
        while loads < 50 {
            match old.next() {
                Some(Frame::Load { seq, .. }) => {
                    assert!(seq > last_old, "seq {seq} after {last_old}");
                    last_old = seq;
                    loads += 1;
                }
                Some(_) => {}
                None => panic!("the first publisher closed"),
            }
        }
        // The engine stops answering: the publisher is dropped.
        reports.on_scrape(ScrapeEvent::Failed { consecutive: 1, error: "down".into() });
        assert!(health.problem().is_some());
        while let Some(frame) = old.next() {
            if let Frame::Load { seq, .. } = frame {
                last_old = last_old.max(seq);
            }
        }
        // It answers again: a new publisher, once the old one is gone.
        let deadline = Instant::now() + Duration::from_secs(10);
        while health.problem().is_some() {
            assert!(Instant::now() < deadline, "the sidecar did not rejoin");
            reports.on_scrape(ScrapeEvent::Loaded(scrape(7)));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut new = Accepted::from(&frontend);
        assert!(matches!(new.next(), Some(Frame::Register { worker: 3, incarnation: 9, .. })));
        let (seq, load) = loop {
            match new.next() {
                Some(Frame::Load { seq, load, .. }) => break (seq, load),
                Some(_) => {}
                None => panic!("the new publisher closed before its first report"),
            }
        };
        assert_eq!(load.waiting_requests, 7);
        assert!(seq > last_old, "the new publisher's first seq {seq} is not above the old one's last {last_old}");
    }

    /// A publisher to the fake frontend `frontend`: worker 3 with `dp_size`
    /// ranks, heartbeats every 5 ms.
    fn config(frontend: &TcpListener, dp_size: u32) -> PublisherConfig {
        let registration =
            Registration { worker: 3, incarnation: 9, model: "m".into(), dp_size, http_addr: "127.0.0.1:1".into() };
        PublisherConfig {
            frontends: vec![frontend.local_addr().unwrap().to_string()],
            registration,
            heartbeat: Duration::from_millis(5),
            secrets: None,
            nats: None,
        }
    }

    /// Reports to a fake frontend, leaving routing after `failures` failed
    /// scrapes.
    fn reporting(dp_size: u32, failures: u32, first: &EngineSnapshot) -> (EngineReports, Accepted) {
        let frontend = TcpListener::bind("127.0.0.1:0").unwrap();
        let health = Arc::new(EngineHealth::new());
        let reports = EngineReports::start(config(&frontend, dp_size), None, health, failures, first).unwrap();
        let accepted = Accepted::from(&frontend);
        (reports, accepted)
    }

    /// Reads frames (at most 2,000) until `wanted` returns true for one.
    fn until(frontend: &mut Accepted, what: &str, mut wanted: impl FnMut(&Frame) -> bool) {
        for _ in 0..2000 {
            match frontend.next() {
                Some(frame) if wanted(&frame) => return,
                Some(_) => {}
                None => panic!("closed before {what}"),
            }
        }
        panic!("2,000 frames without {what}");
    }

    /// While scrapes fail (fewer than it takes to leave routing), the
    /// heartbeats carry no load: the frontends' staleness ages the last one
    /// out, as when they scrape the engine themselves.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_scrape_stops_the_heartbeats_re_sending_the_last_load() {
        let (mut reports, mut frontend) = reporting(1, 5, &scrape(50));
        until(&mut frontend, "the first load", |f| matches!(f, Frame::Load { .. }));
        reports.on_scrape(ScrapeEvent::Failed { consecutive: 1, error: "timed out".into() });
        // Frames written before the failure may still come: from the third
        // bare heartbeat on, none carries a load.
        let mut bare = 0;
        until(&mut frontend, "three bare heartbeats", |f| {
            bare += u32::from(matches!(f, Frame::Register { .. }));
            bare == 3
        });
        for _ in 0..20 {
            let frame = frontend.next().expect("heartbeats go on");
            assert!(matches!(frame, Frame::Register { .. }), "a failed scrape's load re-sent: {frame:?}");
        }
        reports.on_scrape(ScrapeEvent::Loaded(scrape(4)));
        until(
            &mut frontend,
            "the next scrape's load",
            |f| matches!(f, Frame::Load { load, .. } if load.waiting_requests == 4),
        );
    }

    /// A rank the engine stops reporting reports the busiest of the others
    /// (it never keeps the worker free, nor is its last load re-sent).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rank_the_engine_stops_reporting_reports_the_busiest_of_the_others() {
        let two = EngineSnapshot { ranks: [scrape(1).ranks[0], scrape(2).ranks[0]].to_vec() };
        let (mut reports, mut frontend) = reporting(2, 5, &two);
        until(
            &mut frontend,
            "rank 1's first load",
            |f| matches!(f, Frame::Load { rank: 1, load, .. } if load.waiting_requests == 2),
        );
        reports.on_scrape(ScrapeEvent::Loaded(scrape(50)));
        until(
            &mut frontend,
            "rank 1 at rank 0's load",
            |f| matches!(f, Frame::Load { rank: 1, load, .. } if load.waiting_requests == 50),
        );
        for _ in 0..20 {
            if let Some(Frame::Load { load, .. }) = frontend.next() {
                assert_eq!(load.waiting_requests, 50, "the old load of rank 1 came back");
            }
        }
    }

    #[test]
    fn the_queue_adds_to_the_engines_waiting_requests() {
        let load = RankLoad { waiting_requests: 3, active_decode_blocks: 7, kv_total_blocks: 9, ..RankLoad::default() };
        assert_eq!(with_queue(load, 2), RankLoad { waiting_requests: 5, ..load });
        assert_eq!(with_queue(RankLoad { waiting_requests: u32::MAX, ..load }, 2).waiting_requests, u32::MAX);
    }
}
