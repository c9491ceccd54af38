//! A `loadgate frontend` and simulated `loadgate worker`s on free
//! 127.0.0.1 ports, and bounded HTTP clients for them.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{field, legacy, spawn, Mem, Proc, IMPOSTOR_MARK, PROOF_HEADER, SECRET};

/// An HTTP client whose every request is bounded.
pub fn client() -> reqwest::Client {
    client_within(Duration::from_secs(15))
}

/// How long a [`long_client`] request may take: longer than any test's
/// longest stream.
pub const LONG_REQUEST: Duration = Duration::from_secs(60);

/// An HTTP client for tests that hold long streams: every request is
/// bounded by [`LONG_REQUEST`].
pub fn long_client() -> reqwest::Client {
    client_within(LONG_REQUEST)
}

/// An HTTP client whose every request is bounded by `timeout` (and every
/// connect by 2 s).
pub fn client_within(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder().timeout(timeout).connect_timeout(Duration::from_secs(2)).build().expect("reqwest client")
}

/// A `loadgate frontend` process and its three addresses.
pub struct Frontend {
    pub proc: Proc,
    /// `http://HOST:PORT` of the inference port.
    pub http: String,
    /// The event-plane address.
    pub events: SocketAddr,
    /// `http://HOST:PORT` of the admin listener (`None`: off; a legacy
    /// build serves admin routes on the inference port).
    pub admin: Option<String>,
    pub client: reqwest::Client,
}

/// The env that hands `secret` to a process (none: no secret).
pub fn secret_env(secret: Option<&str>) -> Vec<(&'static str, String)> {
    secret.map(|s| vec![("LOADGATE_EVENT_SECRET", s.to_owned())]).unwrap_or_default()
}

impl Frontend {
    /// A frontend on free 127.0.0.1 ports with `secret` (from
    /// `LOADGATE_EVENT_SECRET`) and `extra` flags.
    pub fn start(secret: Option<&str>, extra: &[&str]) -> Frontend {
        let env = secret_env(secret);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Frontend::start_with_env(&env, extra)
    }

    /// A frontend on free 127.0.0.1 ports with `env` and `extra` flags.
    pub fn start_with_env(env: &[(&str, &str)], extra: &[&str]) -> Frontend {
        let mut args =
            vec!["frontend", "--http-host", "127.0.0.1", "--http-port", "0", "--event-port", "0", "--admin-port", "0"];
        args.extend_from_slice(extra);
        let (proc, line) = spawn("frontend", &args, env);
        let http = field(&line, "http").unwrap_or_else(|| panic!("no http= in {line:?}"));
        let events = field(&line, "events").unwrap_or_else(|| panic!("no events= in {line:?}"));
        let admin = match field(&line, "admin") {
            Some(a) if a == "off" => None,
            Some(a) => Some(format!("http://{a}")),
            None if legacy() => Some(format!("http://{http}")),
            None => panic!("no admin= in {line:?}"),
        };
        Frontend {
            proc,
            http: format!("http://{http}"),
            events: events.parse().unwrap_or_else(|e| panic!("events={events}: {e}")),
            admin,
            client: client(),
        }
    }

    /// The suite's usual frontend: the secret, and `extra`.
    pub fn secured(extra: &[&str]) -> Frontend {
        Frontend::start(Some(SECRET), extra)
    }

    /// `GET /health`'s `workers` (None when it did not answer JSON: 200
    /// with workers, 503 with none).
    pub async fn workers(&self) -> Option<u64> {
        let response = self.client.get(format!("{}/health", self.http)).send().await.ok()?;
        if !matches!(response.status().as_u16(), 200 | 503) {
            return None;
        }
        response.json::<Value>().await.ok()?["workers"].as_u64()
    }

    /// Waits (bounded) until `/health` reports `n` workers.
    pub async fn wait_workers(&self, n: u64, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let seen = self.workers().await;
            if seen == Some(n) {
                return;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {n} workers (last seen {seen:?})");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// `GET /v1/models`: the ids and the size of the answer in bytes.
    pub async fn models(&self) -> (Vec<String>, usize) {
        let response = self.client.get(format!("{}/v1/models", self.http)).send().await.expect("GET /v1/models");
        assert_eq!(response.status(), 200, "GET /v1/models");
        let text = response.text().await.expect("models body");
        let value: Value = serde_json::from_str(&text).expect("models JSON");
        let ids = value["data"]
            .as_array()
            .map(|a| a.iter().filter_map(|m| m["id"].as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        (ids, text.len())
    }

    /// One small completion for `model`: status and body.
    pub async fn complete(&self, model: &str) -> (u16, String) {
        complete(&self.client, &self.http, model, None).await
    }

    /// Its memory now.
    pub fn mem(&self) -> Mem {
        self.proc.mem()
    }

    /// The frontend still serves `model` (a normal request gets 200, not
    /// from the impostor) and its RSS is under `max_rss_mib`. Returns the RSS.
    pub async fn assert_still_serving(&self, model: &str, max_rss_mib: f64) -> Mem {
        let (status, body) = self.complete(model).await;
        assert_eq!(status, 200, "a normal request after the attack: {body}");
        assert!(!body.contains(IMPOSTOR_MARK), "a normal request was answered by the impostor: {body}");
        assert_eq!(self.workers().await.map(|_| ()), Some(()), "/health answers");
        let mem = self.mem();
        eprintln!("frontend after the attack: VmRSS {:.1} MiB, VmHWM {:.1} MiB", mem.rss_mib(), mem.hwm_mib());
        assert!(mem.rss_mib() < max_rss_mib, "frontend RSS {:.1} MiB >= {max_rss_mib} MiB", mem.rss_mib());
        mem
    }
}

/// A small completion request body.
pub fn small_request(model: &str) -> Value {
    json!({"model": model, "prompt": "hello world", "max_tokens": 2})
}

/// POSTs one small completion to `base` (`http://HOST:PORT`), with an optional
/// proof header value.
pub async fn complete(client: &reqwest::Client, base: &str, model: &str, proof: Option<&str>) -> (u16, String) {
    let mut request = client.post(format!("{base}/v1/completions")).json(&small_request(model));
    if let Some(proof) = proof {
        request = request.header(PROOF_HEADER, proof);
    }
    match request.send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            (status, response.text().await.unwrap_or_default())
        }
        Err(e) => (0, format!("request failed: {e}")),
    }
}

/// A `loadgate worker` process.
pub struct Worker {
    pub proc: Proc,
    /// `http://HOST:PORT`.
    pub http: String,
}

/// A simulated worker for `model` on a free 127.0.0.1 port, pushing to
/// `events` (none: standalone), with `secret` and `extra` flags.
pub fn worker(events: Option<SocketAddr>, model: &str, secret: Option<&str>, extra: &[&str]) -> Worker {
    let env = secret_env(secret);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    worker_with_env(events, model, &env, extra)
}

/// A simulated worker as [`worker`], with `env` instead of a secret.
pub fn worker_with_env(events: Option<SocketAddr>, model: &str, env: &[(&str, &str)], extra: &[&str]) -> Worker {
    let events = events.map(|e| e.to_string());
    let mut args = vec!["worker", "--http-host", "127.0.0.1", "--http-port", "0", "--model", model];
    // Fast steps unless the test names its own.
    if !extra.contains(&"--decode-step-ms") {
        args.extend(["--decode-step-ms", "1"]);
    }
    if let Some(events) = &events {
        args.extend(["--frontend", events.as_str()]);
    }
    args.extend_from_slice(extra);
    let (proc, line) = spawn("worker", &args, env);
    let http = field(&line, "http").unwrap_or_else(|| panic!("no http= in {line:?}"));
    Worker { proc, http: format!("http://{http}") }
}

/// Runs `loadgate frontend <args>` on free ports with no secret but `env`,
/// which must exit (bounded: 20 s) without listening; returns its stderr.
pub fn frontend_refuses(args: &[&str], env: &[(&str, &str)]) -> String {
    let ports = ["--http-host", "127.0.0.1", "--http-port", "0", "--event-port", "0", "--admin-port", "0"];
    refuses("frontend", &ports, args, env)
}

/// Runs `loadgate worker <args>` on a free port with no secret but `env`,
/// which must exit (bounded: 20 s) without listening; returns its stderr.
#[allow(dead_code, reason = "not every test binary starts a worker that must refuse")]
pub fn worker_refuses(args: &[&str], env: &[(&str, &str)]) -> String {
    refuses("worker", &["--http-host", "127.0.0.1", "--http-port", "0"], args, env)
}

/// Runs `loadgate <command> <ports> <args>` with no secret but `env`, which
/// must exit (bounded: 20 s) without listening; returns its stderr.
fn refuses(command: &str, ports: &[&str], args: &[&str], env: &[(&str, &str)]) -> String {
    let mut child = std::process::Command::new(super::bin())
        .arg(command)
        .args(ports)
        .args(args)
        .env_remove("LOADGATE_EVENT_SECRET")
        .env_remove("LOADGATE_EVENT_SECRET_PREVIOUS")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn loadgate");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            let out = child.wait_with_output().expect("output");
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(!status.success(), "the {command} started with {args:?}; stderr: {stderr}");
            assert!(!String::from_utf8_lossy(&out.stdout).contains("listening"), "{args:?} listened");
            return stderr;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the {command} with {args:?} neither started nor exited within 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
