//! A frontend and its simulated workers as child processes of this binary,
//! over real sockets on 127.0.0.1; stopped when dropped. They share a random
//! event secret, so the demo runs with an authenticated event plane. With
//! `--event-plane nats`, a nats-server of the pool's own carries it, and
//! `--frontends K` frontends share the workers (and their load).

use std::time::{Duration, Instant};

use crate::demo::args::{Args, MODEL};
use crate::demo::child::{field, frontend_args, random_secret, spawn_loadgate, Pooled, Process};
use crate::demo::modes::Mode;
use crate::demo::nats_server::NatsServer;
use crate::nats::EventPlaneKind;

/// Frontends and their workers, stopped when dropped.
pub(crate) struct Pool {
    /// The frontends' inference addresses, `127.0.0.1:PORT`, comma-separated.
    pub(crate) http: String,
    frontends: Vec<Process>,
    workers: Vec<Process>,
    nats: Option<NatsServer>,
}

impl Pooled for Pool {
    fn check_alive(&mut self) -> anyhow::Result<()> {
        for (i, frontend) in self.frontends.iter_mut().enumerate() {
            frontend.check_alive(&format!("frontend {}", i + 1))?;
        }
        for (i, worker) in self.workers.iter_mut().enumerate() {
            worker.check_alive(&format!("worker {}", i + 1))?;
        }
        self.nats.as_mut().map_or(Ok(()), |nats| nats.process.check_alive("nats-server"))
    }
}

impl Pool {
    /// Starts a frontend in `mode` (shedding at `--active-decode-blocks-threshold args.threshold`
    /// unless [`Mode::Off`]) and `args.workers` workers, and waits until every worker has
    /// registered.
    pub(crate) fn start(args: &Args, mode: Mode) -> anyhow::Result<Pool> {
        let secret = random_secret()?;
        let nats = match args.event_plane {
            EventPlaneKind::Nats => Some(NatsServer::start()?),
            EventPlaneKind::Tcp => None,
        };
        anyhow::ensure!(
            args.frontends == 1 || nats.is_some(),
            "--frontends {} count their load together over NATS: add --event-plane nats",
            args.frontends
        );
        let plane: Vec<String> = match &nats {
            Some(n) => ["--event-plane", "nats", "--nats-url", n.url.as_str()].map(str::to_owned).into(),
            None => Vec::new(),
        };
        let mut frontend_args = frontend_args(&args.router_mode());
        if mode.sheds() {
            frontend_args.extend(["--active-decode-blocks-threshold".to_owned(), args.threshold.to_string()]);
        }
        frontend_args.extend(mode.line_flags(args));
        frontend_args.extend(plane.iter().cloned());
        let mut frontends = Vec::new();
        let mut https = Vec::new();
        let mut events = String::new();
        for _ in 0..args.frontends {
            let (frontend, line) = spawn_loadgate(&frontend_args, &secret)?;
            https.push(field(&line, "http")?);
            events = field(&line, "events")?;
            frontends.push(frontend);
        }
        let workers = (0..args.workers)
            .map(|i| {
                let worker_args = [
                    "worker".to_owned(),
                    "--model".to_owned(),
                    MODEL.to_owned(),
                    "--http-host".to_owned(),
                    "127.0.0.1".to_owned(),
                    "--http-port".to_owned(),
                    "0".to_owned(),
                    "--worker-id".to_owned(),
                    (i + 1).to_string(),
                    "--kv-total-blocks".to_owned(),
                    args.kv_total_blocks.to_string(),
                    "--max-num-batched-tokens".to_owned(),
                    args.max_num_batched_tokens.to_string(),
                    "--decode-step-ms".to_owned(),
                    args.decode_step_ms.to_string(),
                ];
                let mut worker_args = worker_args.to_vec();
                match &nats {
                    Some(_) => worker_args.extend(plane.iter().cloned()),
                    None => worker_args.extend(["--frontend".to_owned(), events.clone()]),
                }
                spawn_loadgate(&worker_args, &secret).map(|(p, _)| p)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let pool = Pool { http: https.join(","), frontends, workers, nats };
        for http in &https {
            pool.wait_for_workers(http, args.workers)?;
        }
        Ok(pool)
    }

    /// Polls a frontend's `/health` until every worker has registered.
    fn wait_for_workers(&self, http: &str, n: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(async {
            // Its own children on 127.0.0.1: never through a proxy the environment names.
            let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).no_proxy().build()?;
            loop {
                let health = client.get(format!("http://{http}/health")).send().await;
                if let Ok(resp) = health {
                    let v: serde_json::Value = resp.json().await.unwrap_or_default();
                    if v["workers"].as_u64() == Some(n as u64) {
                        return Ok(());
                    }
                }
                anyhow::ensure!(Instant::now() < deadline, "workers did not register with the frontend in time");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    }
}
