//! `--engine KIND=URL[,model=NAME]`: real inference engines as upstreams,
//! without an event plane.
//!
//! At start, each engine must list its models (`GET /v1/models`, unless
//! `model=` names the one) and answer one scrape, within
//! `--engine-start-timeout-secs` (retried meanwhile). It is then registered as
//! one worker per model it serves: the id is the first 8 bytes of
//! SHA-256 over the base URL and the model name (stable across frontend
//! restarts, so dashboards keep their `worker_id`), the incarnation is the
//! frontend's start time (one per run), the dp size the ranks its scrape
//! reports. Each id is a static directory entry flagged as an engine: the
//! event plane may not take it, and the `--worker` health check skips it.
//!
//! One scraper per engine ([`crate::engines::scrape::spawn_scraper`]) then
//! applies every rank's load to each of its workers as the engine's own
//! report (the worker publisher, a new `seq` per scrape), measured from
//! when the scrape was sent (`WorkerMonitor::measuring`: the waiting line
//! keeps a worker it dispatched to meanwhile out of reach until a scrape
//! sent after that dispatch). A failed scrape
//! keeps the last load, which ages out after `--load-staleness-ms` when set;
//! `--engine-scrape-failures` failures in a row take the engine's workers
//! out of routing (the directory's silent flag), the next success brings
//! them back. An engine whose rank count changes (restarted with another
//! data-parallel size) is registered again under a new incarnation. An
//! engine back after failed scrapes whose models were not named with
//! `model=` has them read again (`ScrapeEvent::Listed`): while it does not
//! list every model it was registered with (restarted with another model
//! on the same address), all its workers stay out of routing; restarting
//! the frontend takes the new list.
//! Transitions are logged, at most
//! [`TRANSITION_LINES`](crate::engines::scrape::TRANSITION_LINES) lines per 10 s per
//! engine (one that flaps at every scrape would write one a scrape; a line
//! that passes counts those held back); `/metrics` counts failed scrapes in
//! `loadgate_frontend_engine_scrape_failures_total` and shows the workers
//! out of routing.

use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use loadgate::engines::EngineSnapshot;
use loadgate::monitor::Measuring;
use loadgate::{LoadReport, WorkerId};
use sha2::{Digest as _, Sha256};

use crate::engines::models::list_models;
use crate::engines::scrape::{scrape_once, spawn_scraper, transitions_log, ModelCheck, ScrapeConfig, ScrapeEvent};
use crate::engines::spec::EngineSpec;
use crate::events::{PlaneLimits, Registration};
use crate::frontend::state::Frontend;
use crate::throttle::LogThrottle;

/// Between two tries while an engine is not ready.
const START_RETRY: Duration = Duration::from_millis(250);

/// The shortest wait for `/v1/models` (the scrape timeout when longer).
const MIN_LIST_TIMEOUT: Duration = Duration::from_secs(2);

/// One registered engine and what its scraper keeps.
#[derive(Debug)]
pub(crate) struct Engine {
    spec: EngineSpec,
    /// One worker per model it serves.
    workers: Vec<(WorkerId, String)>,
    dp_size: u32,
    incarnation: u64,
    /// The `seq` of the last report applied.
    seq: u64,
    /// Where each worker's waiting line stood when the scrape in flight was
    /// sent (by the place in `workers`).
    measuring: Vec<Option<Measuring>>,
    /// Out of routing (too many failed scrapes, too many ranks, or models
    /// missing).
    out: bool,
    /// It no longer lists every model it was registered with: kept out of
    /// routing until it does.
    models_missing: bool,
    /// `--max-dp-size`: a rank count it may change to.
    max_dp_size: u32,
    /// Its lines ([`transitions_log`]: an engine may flap at every scrape).
    log: LogThrottle,
}

/// The worker id of `model` on the engine at `base_url`.
pub(crate) fn engine_worker_id(base_url: &str, model: &str) -> WorkerId {
    let digest = Sha256::new()
        .chain_update(b"loadgate-engine\0")
        .chain_update(base_url.as_bytes())
        .chain_update([0])
        .chain_update(model.as_bytes())
        .finalize();
    let mut id = [0u8; 8];
    id.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(id)
}

/// Waits (bounded) for every engine's models and first scrape, then
/// registers them all (see the module docs).
///
/// # Errors
///
/// An engine that did not answer within `start_timeout`, the same
/// engine and model twice (or an id another `--worker` holds), or a
/// registration the event-plane limits refuse.
pub(crate) async fn register_engines(
    frontend: &Frontend,
    specs: &[EngineSpec],
    config: ScrapeConfig,
    start_timeout: Duration,
    limits: &PlaneLimits,
) -> anyhow::Result<Vec<Engine>> {
    let contacts = specs.iter().map(|spec| first_contact(&frontend.client, spec, config, start_timeout));
    let answers = futures_util::future::join_all(contacts).await;
    let incarnation = Registration::new_incarnation();
    let mut engines = Vec::with_capacity(specs.len());
    for (spec, answer) in specs.iter().zip(answers) {
        let (models, snapshot) = answer?;
        let dp_size = ranks(&snapshot);
        let mut engine = Engine {
            spec: spec.clone(),
            workers: Vec::new(),
            dp_size,
            incarnation,
            seq: 0,
            measuring: Vec::new(),
            out: false,
            models_missing: false,
            max_dp_size: limits.max_dp_size,
            log: transitions_log(),
        };
        for model in models {
            let worker = engine_worker_id(&spec.base_url, &model);
            if frontend.directory.contains(worker) {
                anyhow::bail!("--engine {spec}: model {model} of {} is given twice", spec.base_url);
            }
            limits
                .check_register(&frontend.monitor, &frontend.directory, worker, &model, Some(&spec.base_url), dp_size)
                .map_err(|refusal| anyhow::anyhow!("--engine {spec} refused: {refusal}"))?;
            // The address first: the router may pick the worker as soon as
            // the monitor has it.
            frontend.directory.insert_engine(worker, &spec.base_url, dp_size, spec.kind.assembles());
            if let Err(e) = frontend.monitor.register(worker, &model, dp_size, incarnation) {
                frontend.directory.remove(worker);
                anyhow::bail!("--engine {spec} refused: {e}");
            }
            frontend.directory.sync(worker);
            tracing::info!(worker, ?model, dp_size, kind = %spec.kind, url = %spec.base_url, "engine registered");
            engine.workers.push((worker, model));
        }
        engine.apply(frontend, &snapshot);
        engines.push(engine);
    }
    Ok(engines)
}

/// The engine's models (its `/v1/models` ids, or `model=`) and a first
/// scrape, retried until both answer or `start_timeout` passes.
async fn first_contact(
    client: &reqwest::Client,
    spec: &EngineSpec,
    config: ScrapeConfig,
    start_timeout: Duration,
) -> anyhow::Result<(Vec<String>, EngineSnapshot)> {
    let deadline = tokio::time::Instant::now() + start_timeout;
    let list_timeout = config.timeout.max(MIN_LIST_TIMEOUT);
    let mut attempt: u32 = 0;
    loop {
        attempt = attempt.saturating_add(1);
        let answer = async {
            let models = match &spec.model {
                Some(model) => vec![model.clone()],
                None => list_models(client, &spec.base_url, list_timeout).await?,
            };
            let snapshot = scrape_once(client, spec.kind, &spec.base_url, config.timeout, config.ahead_tokens)
                .await
                .map_err(anyhow::Error::msg)?;
            anyhow::Ok((models, snapshot))
        };
        let error = match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(found)) => return Ok(found),
            Ok(Err(error)) => format!("{error:#}"),
            Err(_) => "no answer in time".to_owned(),
        };
        if tokio::time::Instant::now() + START_RETRY >= deadline {
            anyhow::bail!("--engine {spec}: not ready within {start_timeout:?} (--engine-start-timeout-secs): {error}");
        }
        // The first failure and then one in 20 (every 5 s).
        if attempt % 20 == 1 {
            tracing::info!(engine = %spec, %error, "engine not ready; retrying");
        }
        tokio::time::sleep(START_RETRY).await;
    }
}

/// The rank count of a snapshot (never 0: the mapper returns at least one,
/// and at most `loadgate::engines::MAX_RANKS`).
fn ranks(snapshot: &EngineSnapshot) -> u32 {
    u32::try_from(snapshot.ranks.len()).unwrap_or(u32::MAX).max(1)
}

/// Starts one scraper per engine; each ends when the frontend is dropped
/// (or when its handle is aborted). With `on_end`, the end of a request an
/// engine's worker was sent scrapes that engine at once
/// (`InFlight::scrape_on_end`).
pub(crate) fn spawn_scrapers(
    frontend: &Arc<Frontend>,
    engines: Vec<Engine>,
    config: ScrapeConfig,
    on_end: bool,
) -> Vec<tokio::task::JoinHandle<()>> {
    let wakes: Vec<Arc<Notify>> = engines.iter().map(|_| Arc::new(Notify::new())).collect();
    if on_end {
        let ends = engines
            .iter()
            .zip(&wakes)
            .flat_map(|(engine, wake)| engine.workers.iter().map(move |(worker, _)| (*worker, wake.clone())))
            .collect();
        frontend.inflight.scrape_on_end(ends);
    }
    engines
        .into_iter()
        .zip(wakes)
        .map(|(mut engine, wake)| {
            let weak: Weak<Frontend> = Arc::downgrade(frontend);
            let (kind, base_url) = (engine.spec.kind, engine.spec.base_url.clone());
            let check = engine.spec.model.is_none().then(|| ModelCheck {
                models: engine.workers.iter().map(|(_, model)| model.clone()).collect(),
                timeout: config.timeout.max(MIN_LIST_TIMEOUT),
            });
            let wake = on_end.then_some(wake);
            spawn_scraper(frontend.client.clone(), kind, base_url, config, wake, check, move |event| {
                let Some(frontend) = weak.upgrade() else { return ControlFlow::Break(()) };
                match event {
                    ScrapeEvent::Sending => engine.sending(&frontend),
                    ScrapeEvent::Loaded(snapshot) => engine.loaded(&frontend, &snapshot),
                    ScrapeEvent::Failed { consecutive, error } => {
                        engine.failed(&frontend, consecutive, &error, config.failures_to_leave)
                    }
                    ScrapeEvent::Listed { missing, listed } => engine.listed(&frontend, &missing, &listed),
                }
                ControlFlow::Continue(())
            })
        })
        .collect()
}

impl Engine {
    /// A scrape is about to be sent: where each worker's line stands, so
    /// that its answer frees a worker only from the dispatches made before
    /// (`WorkerMonitor::apply_measured`).
    fn sending(&mut self, frontend: &Frontend) {
        self.measuring.clear();
        self.measuring.extend(self.workers.iter().map(|(worker, _)| frontend.monitor.measuring(*worker)));
    }

    /// A successful scrape: registered again if its rank count changed, its
    /// load applied, back in routing if it was out.
    fn loaded(&mut self, frontend: &Frontend, snapshot: &EngineSnapshot) {
        let ranks = ranks(snapshot);
        if ranks > self.max_dp_size {
            if !self.out {
                self.leave(frontend);
                if let Some(suppressed) = self.log.admit() {
                    tracing::warn!(
                        engine = %self.spec,
                        ranks,
                        max = self.max_dp_size,
                        suppressed,
                        "engine reports more data-parallel ranks than --max-dp-size: out of routing"
                    );
                }
            }
            return;
        }
        if self.models_missing {
            return;
        }
        if ranks != self.dp_size && !self.reregister(frontend, ranks) {
            return;
        }
        self.apply(frontend, snapshot);
        if self.out {
            self.out = false;
            for (worker, _) in &self.workers {
                frontend.directory.set_silent(*worker, false);
            }
            if let Some(suppressed) = self.log.admit() {
                tracing::info!(engine = %self.spec, suppressed, "engine scraped again: back in routing");
            }
        }
    }

    /// Applies each rank's load to every worker of this engine.
    fn apply(&mut self, frontend: &Frontend, snapshot: &EngineSnapshot) {
        self.seq += 1;
        for (place, (worker, _)) in self.workers.iter().enumerate() {
            let measuring = self.measuring.get(place).copied().flatten();
            for (rank, sample) in (0..self.dp_size).zip(&snapshot.ranks) {
                let report = LoadReport {
                    worker: *worker,
                    incarnation: self.incarnation,
                    rank,
                    seq: self.seq,
                    load: sample.load,
                    // The publisher's default: the engine's own report
                    // (`Publisher::Worker`), never the router's tracking.
                    ..Default::default()
                };
                // Only an unregistered worker or a rank out of range fails,
                // and neither can happen to an engine's own ids.
                let _ = match measuring {
                    Some(measuring) => frontend.monitor.apply_measured(&report, measuring),
                    None => frontend.monitor.apply(&report),
                };
            }
        }
    }

    /// The engine reports another number of ranks (it restarted with another
    /// data-parallel size): its workers start again with fresh slots. When
    /// the monitor refuses that, the engine leaves routing (a load it can no
    /// longer report must not stand) and false is returned; the next scrape
    /// tries again.
    fn reregister(&mut self, frontend: &Frontend, ranks: u32) -> bool {
        if let Some(suppressed) = self.log.admit() {
            tracing::warn!(
                engine = %self.spec,
                was = self.dp_size,
                now = ranks,
                suppressed,
                "engine reports another number of data-parallel ranks: registered again, load reset"
            );
        }
        let incarnation = self.incarnation.wrapping_add(1);
        for (worker, model) in &self.workers {
            let registered = frontend.monitor.register(*worker, model, ranks, incarnation);
            // A new incarnation starts in routing in the monitor: sync it
            // with the directory's flags (kept until `insert_engine` below).
            frontend.directory.sync(*worker);
            if let Err(error) = registered {
                if let Some(suppressed) = self.log.admit() {
                    tracing::warn!(
                        engine = %self.spec,
                        worker,
                        %error,
                        suppressed,
                        "engine could not be registered again: out of routing"
                    );
                }
                if !self.out {
                    self.leave(frontend);
                }
                return false;
            }
        }
        self.incarnation = incarnation;
        self.dp_size = ranks;
        for (worker, _) in &self.workers {
            // A replaced entry starts in routing; `loaded` logs the return.
            frontend.directory.insert_engine(*worker, &self.spec.base_url, ranks, self.spec.kind.assembles());
        }
        true
    }

    /// The engine's models, read again after it came back: out of routing
    /// while one it was registered with is `missing` (`loaded` brings it
    /// back once none is).
    fn listed(&mut self, frontend: &Frontend, missing: &[String], listed: &[String]) {
        match (missing.is_empty(), self.models_missing) {
            (true, true) => {
                self.models_missing = false;
                if let Some(suppressed) = self.log.admit() {
                    tracing::info!(engine = %self.spec, ?listed, suppressed, "engine lists its models again");
                }
            }
            (false, false) => {
                self.models_missing = true;
                if !self.out {
                    self.leave(frontend);
                }
                if let Some(suppressed) = self.log.admit() {
                    tracing::error!(
                        engine = %self.spec,
                        ?missing,
                        ?listed,
                        suppressed,
                        "engine came back without models it was registered with: out of routing \
                         (restart the frontend to serve its new models)"
                    );
                }
            }
            _ => {}
        }
    }

    /// Takes every worker of this engine out of routing.
    fn leave(&mut self, frontend: &Frontend) {
        self.out = true;
        for (worker, _) in &self.workers {
            frontend.directory.set_silent(*worker, true);
        }
    }

    /// A failed scrape: the last load stands; at `failures_to_leave` in a
    /// row the engine leaves routing.
    fn failed(&mut self, frontend: &Frontend, consecutive: u32, error: &str, failures_to_leave: u32) {
        // Relaxed: a counter.
        frontend.engine_scrape_failures.fetch_add(1, Ordering::Relaxed);
        if consecutive >= failures_to_leave && !self.out {
            self.leave(frontend);
            if let Some(suppressed) = self.log.admit() {
                tracing::warn!(
                    engine = %self.spec,
                    failures = consecutive,
                    %error,
                    suppressed,
                    "engine scrapes failing: out of routing"
                );
            }
        } else if consecutive == 1 {
            if let Some(suppressed) = self.log.admit() {
                tracing::info!(engine = %self.spec, %error, suppressed, "engine scrape failed; its last load stands");
            }
        } else {
            tracing::debug!(engine = %self.spec, failures = consecutive, %error, "engine scrape failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_depend_on_url_and_model_only() {
        let a = engine_worker_id("http://127.0.0.1:8080", "m");
        assert_eq!(a, engine_worker_id("http://127.0.0.1:8080", "m"), "stable");
        assert_ne!(a, engine_worker_id("http://127.0.0.1:8081", "m"));
        assert_ne!(a, engine_worker_id("http://127.0.0.1:8080", "n"));
        // The separator keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(engine_worker_id("ab", "c"), engine_worker_id("a", "bc"));
    }
}
