//! Scraping an engine's load: [`scrape_once`] fetches `/metrics` (and, for
//! llama.cpp, `/slots`) and maps it with `loadgate::engines`;
//! [`spawn_scraper`] does it every interval and hands each outcome, with
//! the count of failures in a row, to its caller. What a failure means (out
//! of routing after K, an unhealthy worker) is the caller's business.
//! The caller logs an engine's transitions through [`transitions_log`].

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use loadgate::engines::{self, EngineKind, EngineSnapshot, MAX_DOCUMENT_BYTES};
use reqwest::StatusCode;
use tokio::sync::Notify;

use crate::engines::fetch::get_text;
use crate::engines::models::list_models;
use crate::throttle::LogThrottle;

/// Documents above this are mapped on tokio's blocking pool (a large vLLM
/// exposition takes long enough to hold up the runtime thread).
const INLINE_MAP_LIMIT: usize = 1 << 20;

/// The least time between a scrape and one a notification asks for ([`spawn_scraper`]):
/// at most 100 such scrapes a second, however fast requests end.
pub const WAKE_SPACING: Duration = Duration::from_millis(10);

/// How often, how patiently and how forgivingly engines are scraped.
#[derive(Clone, Debug, clap::Args)]
pub struct ScrapeArgs {
    /// Milliseconds between two scrapes of an engine (a slow scrape delays the next; never two at once).
    #[arg(long, env = "LOADGATE_ENGINE_SCRAPE_INTERVAL_MS", value_name = "MS", default_value_t = 50, value_parser = crate::flag_limits::ms(1))]
    pub engine_scrape_interval_ms: u64,
    /// Milliseconds one scrape (all its requests) may take; past it, it counts as failed.
    #[arg(long, env = "LOADGATE_ENGINE_SCRAPE_TIMEOUT_MS", value_name = "MS", default_value_t = 500, value_parser = crate::flag_limits::ms(1))]
    pub engine_scrape_timeout_ms: u64,
    /// Failed scrapes in a row that take an engine out of routing (the next success brings it back).
    #[arg(long, env = "LOADGATE_ENGINE_SCRAPE_FAILURES", value_name = "K", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub engine_scrape_failures: u32,
    /// Count a llama.cpp slot free once its request is at most this many tokens from its output
    /// limit (`/slots`' `n_remain`): a request sent then waits in llama-server's queue and starts
    /// as the slot frees, instead of the slot idling until a scrape shows it free. 0 (the
    /// default) is off; other engines report no slots and ignore it.
    #[arg(long, env = "LOADGATE_ENGINE_DISPATCH_AHEAD_TOKENS", value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=4096))]
    pub engine_dispatch_ahead_tokens: u32,
}

/// [`ScrapeArgs`] as durations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScrapeConfig {
    /// Between two scrapes.
    pub interval: Duration,
    /// For one whole scrape.
    pub timeout: Duration,
    /// Failures in a row that take the engine out of routing.
    pub failures_to_leave: u32,
    /// A llama.cpp slot this many tokens from its output limit counts free (0: off).
    pub ahead_tokens: u32,
}

impl ScrapeArgs {
    /// The durations and count these flags name.
    pub fn config(&self) -> ScrapeConfig {
        ScrapeConfig {
            interval: Duration::from_millis(self.engine_scrape_interval_ms),
            timeout: Duration::from_millis(self.engine_scrape_timeout_ms),
            failures_to_leave: self.engine_scrape_failures,
            ahead_tokens: self.engine_dispatch_ahead_tokens,
        }
    }
}

/// The most lines one engine's transitions (out of routing, back, another
/// rank count, models missing) log per [`TRANSITION_LINES_PER`]: every
/// transition of an engine that changes now and then, a handful from one
/// that flaps at every scrape (20 a second at the default interval).
pub const TRANSITION_LINES: u32 = 10;

/// See [`TRANSITION_LINES`].
pub const TRANSITION_LINES_PER: Duration = Duration::from_secs(10);

/// The throttle of one engine's transition lines, in the frontend's
/// `--engine` scraping and in a sidecar alike: [`TRANSITION_LINES`] per
/// [`TRANSITION_LINES_PER`], the next line that passes counting those held
/// back (an engine may flap at every scrape).
pub(crate) fn transitions_log() -> LogThrottle {
    LogThrottle::new(TRANSITION_LINES, TRANSITION_LINES_PER)
}

/// Between two looks at an engine's models while some it served are not
/// listed (or the list could not be read).
pub const RELIST_EVERY: Duration = Duration::from_secs(1);

/// The models a scraper checks the engine still lists once it answers
/// again after failed scrapes (an engine restarted on the same address
/// may serve another model: llama.cpp answers any `model` with its own).
#[derive(Clone, Debug)]
pub struct ModelCheck {
    /// The models served from this engine, as it listed them at start.
    pub models: Vec<String>,
    /// For one `GET /v1/models`.
    pub timeout: Duration,
}

/// The outcome of one scrape, as [`spawn_scraper`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScrapeEvent {
    /// A scrape is about to be sent (before each one): what the engine
    /// answers shows no dispatch made from now on.
    Sending,
    /// The engine's load now (one entry per data-parallel rank).
    Loaded(EngineSnapshot),
    /// This scrape failed; `consecutive` counts the failures in a row, this one included.
    Failed {
        /// Failures since the last success (at least 1).
        consecutive: u32,
        /// What failed, one line.
        error: String,
    },
    /// With a [`ModelCheck`]: the engine's models, read after it answered
    /// again (before that scrape's `Loaded`), and then every
    /// [`RELIST_EVERY`] while some are missing. A list that cannot be read
    /// makes that scrape `Failed` (its load is not known to be the checked
    /// models'), and is read again at the next scrape.
    Listed {
        /// The checked models it no longer lists (empty: all there).
        missing: Vec<String>,
        /// What it lists now.
        listed: Vec<String>,
    },
}

/// One scrape: GET /metrics (and /slots for llamacpp) within `timeout` in all, bodies capped
/// at MAX_DOCUMENT_BYTES (read incrementally; refuse larger), mapped by loadgate::engines
/// (a llama.cpp slot `ahead` tokens from its limit counted free, `engines::snapshot_ahead`).
///
/// # Errors
///
/// One line: the timeout, a failed request or status, a body too large or
/// not UTF-8, or what the mapper refused.
pub async fn scrape_once(
    client: &reqwest::Client,
    kind: EngineKind,
    base_url: &str,
    timeout: Duration,
    ahead: u32,
) -> Result<EngineSnapshot, String> {
    let metrics_url = format!("{base_url}/metrics");
    let slots_url = format!("{base_url}/slots");
    let documents = async {
        let metrics = get_text(client, &metrics_url, MAX_DOCUMENT_BYTES);
        if kind.needs_slots() {
            let slots = get_text(client, &slots_url, MAX_DOCUMENT_BYTES);
            let (metrics, slots) = futures_util::future::join(metrics, slots).await;
            let metrics = metrics.map_err(|e| e.to_string())?;
            // llama-server answers 501 on /slots when started with --no-slots.
            let slots = slots.map_err(|e| match e.status {
                Some(StatusCode::NOT_IMPLEMENTED | StatusCode::NOT_FOUND) => {
                    format!("{e} (the engine needs /slots: start llama-server without --no-slots)")
                }
                _ => e.to_string(),
            })?;
            Ok::<_, String>((metrics, Some(slots)))
        } else {
            Ok((metrics.await.map_err(|e| e.to_string())?, None))
        }
    };
    let (metrics, slots) = tokio::time::timeout(timeout, documents)
        .await
        .map_err(|_| format!("scrape of {base_url} took over {timeout:?} (--engine-scrape-timeout-ms)"))??;
    let size = metrics.len() + slots.as_ref().map_or(0, String::len);
    let mapped = if size <= INLINE_MAP_LIMIT {
        engines::snapshot_ahead(kind, &metrics, slots.as_deref(), ahead)
    } else {
        tokio::task::spawn_blocking(move || engines::snapshot_ahead(kind, &metrics, slots.as_deref(), ahead))
            .await
            .map_err(|e| format!("mapping the load of {base_url}: {e}"))?
    };
    mapped.map_err(|e| format!("{kind} load of {base_url}: {e}"))
}

/// Scrapes every `interval` (missed ticks delayed, never two at once) and hands each result
/// to `on_event` until it returns `ControlFlow::Break(())` or the task is aborted. With
/// `wake`, a notification scrapes at once (after the scrape in flight, if any, and at least
/// [`WAKE_SPACING`] or the interval, the shorter, after the last scrape was sent; notifications
/// meanwhile make one scrape) and the next periodic one comes an interval after it.
pub fn spawn_scraper(
    client: reqwest::Client,
    kind: EngineKind,
    base_url: String,
    config: ScrapeConfig,
    wake: Option<Arc<Notify>>,
    check: Option<ModelCheck>,
    mut on_event: impl FnMut(ScrapeEvent) -> ControlFlow<()> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(config.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut consecutive: u32 = 0;
        let mut sent = tokio::time::Instant::now();
        // When the models are to be read again (with a check: after a
        // failure, and while some are missing).
        let mut relist: Option<tokio::time::Instant> = None;
        loop {
            match &wake {
                Some(wake) => tokio::select! {
                    _ = ticks.tick() => {}
                    () = wake.notified() => {
                        // Requests that end faster than scrapes answer do not scrape back to back.
                        tokio::time::sleep_until(sent + config.interval.min(WAKE_SPACING)).await;
                        ticks.reset();
                    }
                },
                None => {
                    ticks.tick().await;
                }
            }
            if on_event(ScrapeEvent::Sending).is_break() {
                return;
            }
            sent = tokio::time::Instant::now();
            let event = match scrape_once(&client, kind, &base_url, config.timeout, config.ahead_tokens).await {
                Ok(snapshot) => {
                    // With a check due, the load counts only once the models are read.
                    let mut unchecked = None;
                    if let Some(check) = check.as_ref().filter(|_| relist.is_some_and(|at| sent >= at)) {
                        let (next, listed) = list_again(&client, &base_url, check).await;
                        relist = next;
                        match listed {
                            Ok(listed) => {
                                if on_event(listed).is_break() {
                                    return;
                                }
                            }
                            Err(error) => unchecked = Some(error),
                        }
                    }
                    match unchecked {
                        None => {
                            consecutive = 0;
                            ScrapeEvent::Loaded(snapshot)
                        }
                        // Not known to serve its models: a failed scrape, the list read again next time.
                        Some(error) => {
                            consecutive = consecutive.saturating_add(1);
                            ScrapeEvent::Failed { consecutive, error }
                        }
                    }
                }
                Err(error) => {
                    consecutive = consecutive.saturating_add(1);
                    relist = Some(sent);
                    ScrapeEvent::Failed { consecutive, error }
                }
            };
            if on_event(event).is_break() {
                return;
            }
        }
    })
}

/// Reads the engine's models for `check`: the [`ScrapeEvent::Listed`] to
/// report, and when to read them again (none once every checked model is
/// listed); or, when the list could not be read, why (read again at the
/// next scrape).
async fn list_again(
    client: &reqwest::Client,
    base_url: &str,
    check: &ModelCheck,
) -> (Option<tokio::time::Instant>, Result<ScrapeEvent, String>) {
    let listed = list_models(client, base_url, check.timeout).await;
    let now = tokio::time::Instant::now();
    match listed {
        Ok(listed) => {
            let missing: Vec<String> = check.models.iter().filter(|m| !listed.contains(m)).cloned().collect();
            // From the answer: the next list starts a whole RELIST_EVERY after this one ended.
            let next = if missing.is_empty() { None } else { Some(now + RELIST_EVERY) };
            (next, Ok(ScrapeEvent::Listed { missing, listed }))
        }
        Err(error) => {
            let error = format!("the engine answers its scrapes again but its models could not be read: {error:#}");
            (Some(now), Err(error))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Arc;

    use axum::routing::get;

    use super::*;

    const LLAMA_METRICS: &str = "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 2\n\
        # TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 5\n";
    const LLAMA_SLOTS: &str = r#"[{"id":0,"n_ctx":512,"is_processing":true,"n_prompt_tokens":30},
        {"id":1,"n_ctx":512,"is_processing":false}]"#;

    /// A llama.cpp-like engine: `/metrics` after `metrics_delay`, 500 while
    /// `broken` is set; `/slots` only when `slots` is set.
    async fn engine_with(
        slots: bool,
        metrics_delay: Duration,
        broken: Arc<AtomicBool>,
    ) -> (String, tokio::task::JoinHandle<()>) {
        let mut app = axum::Router::new().route(
            "/metrics",
            get(move || async move {
                tokio::time::sleep(metrics_delay).await;
                // Relaxed: a flag the test flips; any scrape after it sees it.
                if broken.load(Ordering::Relaxed) {
                    Err(axum::http::StatusCode::INTERNAL_SERVER_ERROR)
                } else {
                    Ok(LLAMA_METRICS)
                }
            }),
        );
        if slots {
            app = app.route("/slots", get(|| async { LLAMA_SLOTS }));
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (format!("http://{addr}"), tokio::spawn(async move { axum::serve(listener, app).await.unwrap() }))
    }

    async fn engine(slots: bool, metrics_delay: Duration) -> (String, tokio::task::JoinHandle<()>) {
        engine_with(slots, metrics_delay, Arc::default()).await
    }

    #[tokio::test]
    async fn one_scrape_reads_metrics_and_slots() {
        let (base, _server) = engine(true, Duration::ZERO).await;
        let client = reqwest::Client::new();
        let snapshot = scrape_once(&client, EngineKind::LlamaCpp, &base, Duration::from_secs(5), 0).await.unwrap();
        assert_eq!(snapshot.ranks.len(), 1);
        let rank = snapshot.ranks[0];
        assert_eq!(rank.running_requests, 2);
        assert_eq!(rank.load.waiting_requests, 5);
        assert_eq!((rank.load.active_decode_blocks, rank.load.kv_total_blocks), (512, 1024));
        // The wrong kind: no vLLM metric in the document.
        let error = scrape_once(&client, EngineKind::Vllm, &base, Duration::from_secs(5), 0).await.unwrap_err();
        assert!(error.starts_with(&format!("vllm load of {base}: ")), "{error}");
    }

    #[tokio::test]
    async fn a_missing_slots_or_a_slow_engine_fails_the_scrape() {
        let client = reqwest::Client::new();
        let (base, _a) = engine(false, Duration::ZERO).await;
        let error = scrape_once(&client, EngineKind::LlamaCpp, &base, Duration::from_secs(5), 0).await.unwrap_err();
        assert!(error.contains("/slots: status 404") && error.contains("--no-slots"), "{error}");
        let (base, _b) = engine(true, Duration::from_secs(3)).await;
        let started = tokio::time::Instant::now();
        let error = scrape_once(&client, EngineKind::LlamaCpp, &base, Duration::from_millis(100), 0).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(2), "the timeout bounds the whole scrape");
        assert!(error.contains("took over 100ms"), "{error}");
    }

    /// [`ScrapeEvent::Sending`] in the events the test records.
    const SENDING: u32 = u32::MAX;

    #[tokio::test]
    async fn the_scraper_counts_failures_in_a_row_and_stops_on_break() {
        let broken = Arc::new(AtomicBool::new(false));
        let (base, _server) = engine_with(true, Duration::ZERO, broken.clone()).await;
        let config = ScrapeConfig {
            interval: Duration::from_millis(10),
            timeout: Duration::from_millis(500),
            failures_to_leave: 3,
            ahead_tokens: 0,
        };
        let events = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = events.clone();
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        let handle =
            spawn_scraper(reqwest::Client::new(), EngineKind::LlamaCpp, base, config, None, None, move |event| {
                let outcome = match event {
                    ScrapeEvent::Sending => {
                        seen.lock().unwrap().push(SENDING);
                        return ControlFlow::Continue(());
                    }
                    ScrapeEvent::Loaded(_) => 0,
                    ScrapeEvent::Failed { consecutive, .. } => consecutive,
                    ScrapeEvent::Listed { .. } => unreachable!("no model check"),
                };
                seen.lock().unwrap().push(outcome);
                // Relaxed: a counter, read after the task ended.
                let n = counted.fetch_add(1, Ordering::Relaxed) + 1;
                // Two good scrapes, three failed ones, a good one.
                // Relaxed: see `engine_with`.
                broken.store((2..5).contains(&n), Ordering::Relaxed);
                if n == 7 {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            });
        tokio::time::timeout(Duration::from_secs(10), handle).await.unwrap().unwrap();
        // Relaxed: the task has ended.
        assert_eq!(calls.load(Ordering::Relaxed), 7, "no event after Break");
        // Each scrape is told before it is sent.
        let each = [0, 0, 1, 2, 3, 0, 0].map(|outcome| [SENDING, outcome]);
        assert_eq!(*events.lock().unwrap(), each.as_flattened());
    }

    /// After failed scrapes the scraper reads the engine's models again,
    /// before the first good scrape's load, and again every
    /// [`RELIST_EVERY`] while one it serves is missing; never while the
    /// engine answers without a failure in between.
    #[tokio::test]
    async fn an_engine_back_after_failures_has_its_models_read_again() {
        let broken = Arc::new(AtomicBool::new(false));
        let served = Arc::new(std::sync::Mutex::new("a".to_owned()));
        // When each GET /v1/models was answered.
        let lists = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (failing, model, listed) = (broken.clone(), served.clone(), lists.clone());
        let app = axum::Router::new()
            .route(
                "/metrics",
                get(move || async move {
                    // Relaxed: a flag the test flips.
                    match failing.load(Ordering::Relaxed) {
                        true => Err(axum::http::StatusCode::INTERNAL_SERVER_ERROR),
                        false => Ok(LLAMA_METRICS),
                    }
                }),
            )
            .route("/slots", get(|| async { LLAMA_SLOTS }))
            .route(
                "/v1/models",
                get(move || async move {
                    listed.lock().unwrap().push(tokio::time::Instant::now());
                    let id = model.lock().unwrap().clone();
                    format!(r#"{{"data":[{{"id":"{id}"}}]}}"#)
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let _server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let config = ScrapeConfig {
            interval: Duration::from_millis(10),
            timeout: Duration::from_millis(500),
            failures_to_leave: 3,
            ahead_tokens: 0,
        };
        let check = ModelCheck { models: vec!["a".to_owned()], timeout: Duration::from_millis(500) };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let handle = spawn_scraper(
            reqwest::Client::new(),
            EngineKind::LlamaCpp,
            base,
            config,
            None,
            Some(check),
            move |event| {
                match event {
                    ScrapeEvent::Sending => {}
                    other => tx.send(other).unwrap(),
                }
                ControlFlow::Continue(())
            },
        );
        async fn recv(rx: &mut tokio::sync::mpsc::UnboundedReceiver<ScrapeEvent>) -> ScrapeEvent {
            tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("an event in time").unwrap()
        }
        let is_loaded = |e: &ScrapeEvent| matches!(e, ScrapeEvent::Loaded(_));
        for _ in 0..5 {
            assert!(is_loaded(&recv(&mut rx).await), "good scrapes, no list");
        }
        assert!(lists.lock().unwrap().is_empty(), "an engine that never failed is not listed");
        // The engine goes away and comes back serving another model.
        *served.lock().unwrap() = "b".to_owned();
        broken.store(true, Ordering::Relaxed);
        while !matches!(recv(&mut rx).await, ScrapeEvent::Failed { .. }) {}
        broken.store(false, Ordering::Relaxed);
        let mut event = recv(&mut rx).await;
        while matches!(event, ScrapeEvent::Failed { .. }) {
            event = recv(&mut rx).await;
        }
        assert_eq!(event, ScrapeEvent::Listed { missing: vec!["a".to_owned()], listed: vec!["b".to_owned()] });
        assert!(is_loaded(&recv(&mut rx).await), "the load after the list");
        // Missing: read again, RELIST_EVERY after the first list was answered.
        *served.lock().unwrap() = "a".to_owned();
        let mut event = recv(&mut rx).await;
        while is_loaded(&event) {
            event = recv(&mut rx).await;
        }
        assert_eq!(event, ScrapeEvent::Listed { missing: vec![], listed: vec!["a".to_owned()] });
        let times = lists.lock().unwrap().clone();
        assert_eq!(times.len(), 2);
        assert!(times[1] - times[0] >= RELIST_EVERY, "{:?}", times[1] - times[0]);
        // All there: no further list (more than RELIST_EVERY of good scrapes).
        tokio::time::sleep(RELIST_EVERY + RELIST_EVERY / 2).await;
        assert_eq!(lists.lock().unwrap().len(), 2, "no list once every model is there");
        handle.abort();
    }
}
