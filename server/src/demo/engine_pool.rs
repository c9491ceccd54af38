//! Two real `llama-server`s behind a frontend that scrapes them directly
//! (`frontend --engine llamacpp=URL,model=NAME`, no sidecar), all on
//! 127.0.0.1; stopped when dropped.

use std::time::{Duration, Instant};

use crate::demo::args::{Args, LLAMA_MODEL};
use crate::demo::child::{field, frontend_args, random_secret, spawn_loadgate, Pooled, Process};
use crate::demo::install::LlamaInstall;
use crate::demo::llama_server::LlamaServer;
use crate::demo::modes::Mode;

/// Engines in the pool.
pub(crate) const SERVERS: usize = 2;

/// How long the frontend may take to have every engine in routing (it
/// retries an engine's first scrape for up to 60 s itself).
const REGISTRATION_WAIT: Duration = Duration::from_secs(70);

/// The frontend flags of the shedding modes: a server is busy when none of
/// its slots is free (`args.threshold` of its slots in use), when requests
/// wait for a slot, or while a request sent to it awaits its first token.
pub(crate) fn shedding_flags(args: &Args) -> [String; 6] {
    [
        "--active-decode-blocks-threshold".to_owned(),
        args.threshold.to_string(),
        "--active-waiting-requests-threshold".to_owned(),
        args.waiting_threshold.to_string(),
        "--active-prefill-tokens-threshold".to_owned(),
        args.prefill_threshold.to_string(),
    ]
}

/// A frontend and its engines, stopped when dropped (the frontend first).
#[derive(Debug)]
pub(crate) struct EnginePool {
    /// The frontend's inference address, `127.0.0.1:PORT`.
    pub(crate) http: String,
    frontend: Process,
    servers: Vec<LlamaServer>,
}

impl Pooled for EnginePool {
    fn check_alive(&mut self) -> anyhow::Result<()> {
        self.frontend.check_alive("the frontend")?;
        for (i, server) in self.servers.iter_mut().enumerate() {
            server.process.check_alive(&format!("llama-server {}", i + 1))?;
        }
        Ok(())
    }
}

impl EnginePool {
    /// Starts [`SERVERS`] servers (at once) and a frontend in front of
    /// them in `mode`: unless [`Mode::Off`], the frontend sheds with
    /// [`shedding_flags`].
    ///
    /// # Errors
    ///
    /// A server or the frontend does not start, or the engines are not in
    /// routing within [`REGISTRATION_WAIT`].
    pub(crate) fn start(install: &LlamaInstall, args: &Args, mode: Mode) -> anyhow::Result<Self> {
        let servers = std::thread::scope(|s| {
            let starting: Vec<_> = (0..SERVERS).map(|_| s.spawn(|| LlamaServer::start(install, LLAMA_MODEL))).collect();
            starting
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a llama-server start panicked"))))
                .collect::<anyhow::Result<Vec<_>>>()
        })?;
        let mut frontend_args = frontend_args(&args.router_mode());
        frontend_args.extend(["--engine-scrape-interval-ms".to_owned(), args.scrape_interval_ms.to_string()]);
        // A slot a request frees is seen within one scrape, not up to an interval later.
        frontend_args.push("--engine-scrape-on-end".to_owned());
        for server in &servers {
            frontend_args.extend(["--engine".to_owned(), format!("llamacpp={},model={LLAMA_MODEL}", server.url)]);
        }
        if mode.sheds() {
            frontend_args.extend(shedding_flags(args));
        }
        frontend_args.extend(mode.line_flags(args));
        let (frontend, line) = spawn_loadgate(&frontend_args, &random_secret()?)?;
        let pool = EnginePool { http: field(&line, "http")?, frontend, servers };
        pool.wait_for_engines()?;
        Ok(pool)
    }

    /// Polls the frontend's `/health` until every engine is in routing.
    fn wait_for_engines(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + REGISTRATION_WAIT;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(async {
            // Its own children on 127.0.0.1: never through a proxy the environment names.
            let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).no_proxy().build()?;
            loop {
                if let Ok(resp) = client.get(format!("http://{}/health", self.http)).send().await {
                    let v: serde_json::Value = resp.json().await.unwrap_or_default();
                    if v["live_workers"].as_u64() == Some(SERVERS as u64) {
                        return Ok(());
                    }
                }
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "the frontend did not have both llama-servers in routing within {REGISTRATION_WAIT:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    }
}
