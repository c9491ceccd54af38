//! `loadgate worker --engine KIND=URL`: the worker as a sidecar in front of
//! a real engine. [`Sidecar::start`] waits for the engine (its model from
//! `/v1/models` unless named, and a first successful scrape, which gives its
//! data-parallel size), then builds the request path ([`EngineProxy`]) and
//! the load path ([`EngineReports`], fed by the scraper every
//! `--engine-scrape-interval-ms`).

use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use loadgate::engines::EngineSnapshot;
use loadgate::Admission;

mod forward;
mod reports;

pub(crate) use self::forward::{other_model, EngineProxy};
pub(crate) use self::reports::{with_queue, EngineHealth};

pub(crate) use self::reports::Publishers;
use self::reports::{EngineReports, PublisherConfig};
use super::Args;
use crate::engines::models::list_models;
use crate::engines::scrape::{scrape_once, spawn_scraper, ModelCheck};
use crate::engines::spec::EngineSpec;
use crate::events::Registration;
use crate::nats::NatsLink;
use crate::secret::Secrets;

/// Pause between two tries while the engine is not answering yet.
const START_RETRY: Duration = Duration::from_millis(250);

/// What the worker needs to register, the parts a sidecar learns from its
/// engine aside.
#[derive(Debug)]
pub(crate) struct Identity {
    /// `--worker-id` or random.
    pub(crate) worker: u64,
    /// This run.
    pub(crate) incarnation: u64,
    /// The address announced to frontends.
    pub(crate) http_addr: String,
}

/// A running sidecar's load path: the scraper and the reports it feeds.
#[derive(Debug)]
pub(crate) struct Sidecar {
    scraper: tokio::task::JoinHandle<()>,
    reports: Arc<Mutex<EngineReports>>,
}

/// What the worker serves with, once its engine answers.
#[derive(Debug)]
pub(crate) struct Started {
    /// The request path to the engine.
    pub(crate) proxy: EngineProxy,
    /// Whether its scrapes succeed (`/health`).
    pub(crate) health: Arc<EngineHealth>,
    /// The model the worker registers with.
    pub(crate) model: String,
    /// The engine's data-parallel size.
    pub(crate) dp_size: u32,
}

/// The engine's model and its first load, once it answers.
struct Engine {
    model: String,
    first: EngineSnapshot,
}

impl Sidecar {
    /// Waits (at most `--engine-start-timeout-secs`) for the engine, then starts
    /// proxying and reporting. Returns the backend, the model and dp size
    /// the worker registers with, and the load path.
    ///
    /// # Errors
    ///
    /// The engine did not answer in time, `--model` and `model=` disagree,
    /// or the HTTP client or the publisher cannot start.
    pub(crate) async fn start(
        args: &Args,
        spec: &EngineSpec,
        identity: Identity,
        admission: Option<Arc<Admission<()>>>,
        secrets: Option<Arc<Secrets>>,
        nats: Option<NatsLink>,
    ) -> anyhow::Result<(Started, Sidecar)> {
        let named = match (&args.model, &spec.model) {
            (Some(flag), Some(option)) if flag != option => {
                anyhow::bail!("--model {flag:?} and the --engine option model={option:?} disagree: give one")
            }
            (Some(model), _) | (None, Some(model)) => Some(model.clone()),
            (None, None) => None,
        };
        let timeouts = args.engine_timeouts();
        let client = crate::upstream::client(timeouts.connect).context("cannot build the HTTP client to the engine")?;
        let scrape = args.scrape.config();
        let named_by_engine = named.is_none();
        let wait = Duration::from_secs(args.engine_start_timeout_secs);
        let engine = wait_for_engine(&client, spec, named, scrape.timeout, wait).await?;
        let dp_size = u32::try_from(engine.first.ranks.len()).unwrap_or(u32::MAX).max(1);
        tracing::info!(engine = %spec, model = %engine.model, dp_size, "the engine answers");
        let health = Arc::new(EngineHealth::new());
        let registration = Registration {
            worker: identity.worker,
            incarnation: identity.incarnation,
            model: engine.model.clone(),
            dp_size,
            http_addr: identity.http_addr,
        };
        if let Some(link) = &nats {
            link.check(&registration)?;
        }
        let publishing = PublisherConfig {
            frontends: args.frontends.clone(),
            registration,
            heartbeat: Duration::from_millis(args.heartbeat_ms),
            secrets,
            nats,
        };
        let reports =
            EngineReports::start(publishing, admission, health.clone(), scrape.failures_to_leave, &engine.first)
                .context("cannot start the event publisher")?;
        let reports = Arc::new(Mutex::new(reports));
        let fed = reports.clone();
        // A model the engine named (not `model=`) is checked again when the
        // engine comes back after failures (`reports`' module docs).
        let check = named_by_engine.then(|| ModelCheck { models: vec![engine.model.clone()], timeout: scrape.timeout });
        let scraper =
            spawn_scraper(client.clone(), spec.kind, spec.base_url.clone(), scrape, None, check, move |event| {
                fed.lock().unwrap_or_else(|e| e.into_inner()).on_scrape(event);
                ControlFlow::Continue(())
            });
        let proxy = EngineProxy::new(client, spec.base_url.clone(), timeouts, spec.kind.assembles());
        Ok((Started { proxy, health, model: engine.model, dp_size }, Sidecar { scraper, reports }))
    }

    /// Stops scraping and hands over the publisher, if the worker is in
    /// routing (its drop sends the Deregisters).
    pub(crate) async fn stop(self) -> Option<Publishers> {
        self.scraper.abort();
        // Bounded: an aborted task ends at its next await point.
        let _ = tokio::time::timeout(Duration::from_secs(1), self.scraper).await;
        self.reports.lock().unwrap_or_else(|e| e.into_inner()).take_publisher()
    }
}

/// Retries until the engine names its model (unless `named`) and answers
/// a scrape, for at most `wait`.
async fn wait_for_engine(
    client: &reqwest::Client,
    spec: &EngineSpec,
    named: Option<String>,
    timeout: Duration,
    wait: Duration,
) -> anyhow::Result<Engine> {
    let deadline = Instant::now() + wait;
    let mut model = named;
    let mut tries = 0u32;
    loop {
        let error = match &model {
            None => match list_models(client, &spec.base_url, timeout).await {
                Ok(ids) => match ids.into_iter().next() {
                    Some(id) => {
                        model = Some(id);
                        continue;
                    }
                    None => format!("{}/v1/models lists no model", spec.base_url),
                },
                Err(error) => format!("{error:#}"),
            },
            // The first scrape only finds the engine; the scraper applies --engine-dispatch-ahead-tokens.
            Some(name) => match scrape_once(client, spec.kind, &spec.base_url, timeout, 0).await {
                Ok(first) => return Ok(Engine { model: name.clone(), first }),
                Err(error) => error,
            },
        };
        tries += 1;
        if Instant::now() + START_RETRY >= deadline {
            anyhow::bail!("the engine {spec} did not answer within {wait:?} (--engine-start-timeout-secs): {error}");
        }
        if tries == 1 {
            tracing::info!(engine = %spec, %error, "waiting for the engine");
        } else if tries % 20 == 0 {
            tracing::warn!(engine = %spec, %error, "still waiting for the engine");
        }
        tokio::time::sleep(START_RETRY).await;
    }
}
