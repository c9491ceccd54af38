//! A frontend and its simulated workers as child processes of this binary,
//! over real sockets on 127.0.0.1; stopped when dropped. They share a random
//! event secret, so the demo runs with an authenticated event plane.

use std::time::{Duration, Instant};

use crate::demo::args::{Args, MODEL};
use crate::demo::child::{field, frontend_args, random_secret, spawn_loadgate, Process};
use crate::demo::modes::Mode;

/// A frontend and its workers, stopped when dropped.
pub(crate) struct Pool {
    /// The frontend's inference address, `127.0.0.1:PORT`.
    pub(crate) http: String,
    _frontend: Process,
    _workers: Vec<Process>,
}

impl Pool {
    /// Starts a frontend in `mode` (shedding at `--active-decode-blocks-threshold args.threshold`
    /// unless [`Mode::Off`]) and `args.workers` workers, and waits until every worker has
    /// registered.
    pub(crate) fn start(args: &Args, mode: Mode) -> anyhow::Result<Pool> {
        let secret = random_secret()?;
        let mut frontend_args = frontend_args(&args.router_mode());
        if mode.sheds() {
            frontend_args.extend(["--active-decode-blocks-threshold".to_owned(), args.threshold.to_string()]);
        }
        frontend_args.extend(mode.line_flags(args));
        let (frontend, line) = spawn_loadgate(&frontend_args, &secret)?;
        let http = field(&line, "http")?;
        let events = field(&line, "events")?;
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
                    "--frontend".to_owned(),
                    events.clone(),
                    "--worker-id".to_owned(),
                    (i + 1).to_string(),
                    "--kv-total-blocks".to_owned(),
                    args.kv_total_blocks.to_string(),
                    "--max-num-batched-tokens".to_owned(),
                    args.max_num_batched_tokens.to_string(),
                    "--decode-step-ms".to_owned(),
                    args.decode_step_ms.to_string(),
                ];
                spawn_loadgate(&worker_args, &secret).map(|(p, _)| p)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let pool = Pool { http, _frontend: frontend, _workers: workers };
        pool.wait_for_workers(args.workers)?;
        Ok(pool)
    }

    /// Polls the frontend's `/health` until every worker has registered.
    fn wait_for_workers(&self, n: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(async {
            let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
            loop {
                let health = client.get(format!("http://{}/health", self.http)).send().await;
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
