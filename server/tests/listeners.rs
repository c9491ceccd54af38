//! Listeners, TLS, environment variables and the admin API, end to end:
//! real `loadgate` processes on 127.0.0.1 (free ports), killed on drop,
//! every wait bounded.
//!
//! - TLS on the inference port with a certificate generated here (rcgen):
//!   https works, plain HTTP on the TLS port fails cleanly, a stalled
//!   handshake blocks nobody, and bad TLS flags are refused clearly.
//! - Environment: `DYN_*` / `LOADGATE_*` variables take effect, a flag beats
//!   its variable, booleans accept 1/true/yes/on and 0/false/no/off,
//!   repeatable flags take comma-separated variables.
//! - `--router-mode power-of-two` (and `DYN_ROUTER_MODE`); Dynamo's `direct`
//!   is refused with a clear message.
//! - The admin listener: `/busy_threshold` is 404 on the inference port and
//!   served on the admin one, behind the bearer token when there is one;
//!   `--disable-admin-api` leaves no listener (`admin=off`).
//! - The worker announces `--advertise-addr`; an unspecified bind address
//!   without it is refused.

mod common;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::{field, spawn, FakeWorker, Proc, IMPOSTOR_MARK};

const MODEL: &str = "listener-model";
/// How long a process that must refuse to start may take to exit.
const EXIT_WAIT: Duration = Duration::from_secs(20);
const SETTLE: Duration = Duration::from_secs(15);

/// The base flags of a test frontend: every listener on 127.0.0.1, free ports.
const FRONTEND: &[&str] =
    &["frontend", "--http-host", "127.0.0.1", "--http-port", "0", "--event-port", "0", "--admin-port", "0"];

fn args<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    base.iter().chain(extra).copied().collect()
}

/// A free 127.0.0.1 port (bound and released; good enough for a test).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// The `key=` address of a listening line.
fn addr(line: &str, key: &str) -> SocketAddr {
    let value = field(line, key).unwrap_or_else(|| panic!("no {key}= in {line:?}"));
    value.parse().unwrap_or_else(|e| panic!("{key}={value}: {e}"))
}

/// Runs `loadgate <args>` with `env`, which must exit (bounded) with an
/// error; returns its stderr.
fn refused(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut command = Command::new(common::bin());
    command.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for var in ["LOADGATE_EVENT_SECRET", "LOADGATE_EVENT_SECRET_PREVIOUS", "LOADGATE_ADMIN_TOKEN"] {
        command.env_remove(var);
    }
    command.envs(env.iter().copied());
    let mut child = command.spawn().expect("spawn loadgate");
    let deadline = Instant::now() + EXIT_WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for loadgate") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("loadgate {args:?} did not exit within {EXIT_WAIT:?}; it should refuse to start");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let (mut stdout, mut stderr) = (String::new(), String::new());
    let _ = child.stdout.take().expect("piped").read_to_string(&mut stdout);
    let _ = child.stderr.take().expect("piped").read_to_string(&mut stderr);
    assert!(!status.success(), "loadgate {args:?} must refuse to start; stdout {stdout:?}");
    assert!(!stdout.contains("listening"), "loadgate {args:?} must not listen: {stdout:?}");
    stderr
}

/// A simulated worker for `model` on 127.0.0.1 pushing to `events`.
fn worker(events: SocketAddr, extra: &[&str], env: &[(&str, &str)]) -> (Proc, String) {
    let events = events.to_string();
    let mut args =
        vec!["worker", "--http-host", "127.0.0.1", "--http-port", "0", "--model", MODEL, "--decode-step-ms", "1"];
    args.extend(["--frontend", events.as_str()]);
    args.extend_from_slice(extra);
    spawn("worker", &args, env)
}

/// Waits (bounded) until `GET {base}/health` reports `n` workers.
async fn wait_workers(client: &reqwest::Client, base: &str, n: u64) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let seen = match client.get(format!("{base}/health")).send().await {
            Ok(response) => response.json::<Value>().await.ok().and_then(|v| v["workers"].as_u64()),
            Err(_) => None,
        };
        if seen == Some(n) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {n} workers at {base} (last seen {seen:?})");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn completion(client: &reqwest::Client, base: &str) -> reqwest::Result<(u16, String)> {
    let body = json!({"model": MODEL, "prompt": "hello world", "max_tokens": 2});
    let response = client.post(format!("{base}/v1/completions")).json(&body).send().await?;
    let status = response.status().as_u16();
    Ok((status, response.text().await?))
}

// ---------------------------------------------------------------------------
// TLS

/// A self-signed certificate for 127.0.0.1 and localhost, written to a
/// fresh directory; removed on drop.
struct TestCert {
    dir: PathBuf,
    cert_pem: String,
}

impl TestCert {
    fn new() -> TestCert {
        let generated = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .expect("generate a certificate");
        let dir = std::env::temp_dir().join(format!("loadgate-tls-{}-{}", std::process::id(), fastrand::u64(..)));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let cert_pem = generated.cert.pem();
        std::fs::write(dir.join("cert.pem"), &cert_pem).expect("write cert");
        std::fs::write(dir.join("key.pem"), generated.key_pair.serialize_pem()).expect("write key");
        TestCert { dir, cert_pem }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    /// An HTTPS client that trusts only this certificate.
    fn client(&self) -> reqwest::Client {
        let cert = reqwest::Certificate::from_pem(self.cert_pem.as_bytes()).expect("parse the test certificate");
        reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(cert)
            .timeout(Duration::from_secs(15))
            .connect_timeout(Duration::from_secs(2))
            .build()
            .expect("https client")
    }
}

impl Drop for TestCert {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_https_and_drops_plain_http() {
    let cert = TestCert::new();
    let (cert_path, key_path) = (cert.path("cert.pem"), cert.path("key.pem"));
    let (_frontend, line) =
        spawn("frontend", &args(FRONTEND, &["--tls-cert-path", &cert_path, "--tls-key-path", &key_path]), &[]);
    let http = addr(&line, "http");
    let (_worker, _) = worker(addr(&line, "events"), &[], &[]);
    let https = format!("https://{http}");
    let client = cert.client();
    wait_workers(&client, &https, 1).await;
    let (status, body) = completion(&client, &https).await.expect("a completion over https");
    assert_eq!(status, 200, "completion over https: {body}");

    // Plain HTTP on the TLS port: the request fails, nothing is served in clear.
    let plain = common::client();
    match completion(&plain, &format!("http://{http}")).await {
        Err(_) => {}
        Ok((status, body)) => panic!("plain HTTP on the TLS port got {status}: {body}"),
    }
    // Garbage, and a connection that never finishes its handshake: each only
    // costs its own connection.
    let mut garbage = TcpStream::connect_timeout(&http, Duration::from_secs(2)).expect("connect");
    garbage.write_all(b"\x16\x03\x01\x00\x05hello-not-tls\r\n\r\n").expect("write garbage");
    let _stalled = TcpStream::connect_timeout(&http, Duration::from_secs(2)).expect("connect");
    let started = Instant::now();
    let (status, body) = completion(&client, &https).await.expect("https still works");
    assert_eq!(status, 200, "completion over https after bad connections: {body}");
    assert!(started.elapsed() < Duration::from_secs(5), "a stalled handshake delayed another connection");
    garbage.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut buf = [0u8; 512];
    // The server answers garbage with an alert and/or a close, never HTTP.
    let mut seen = Vec::new();
    while let Ok(n @ 1..) = garbage.read(&mut buf) {
        seen.extend_from_slice(&buf[..n]);
        assert!(seen.len() < 64 * 1024, "the server kept talking to a garbage connection");
    }
    assert!(!String::from_utf8_lossy(&seen).contains("HTTP/"), "plain HTTP answer on the TLS port");
}

#[test]
fn tls_flags_are_checked() {
    let cert = TestCert::new();
    let (cert_path, key_path) = (cert.path("cert.pem"), cert.path("key.pem"));
    let stderr = refused(&args(FRONTEND, &["--tls-cert-path", &cert_path]), &[]);
    assert!(stderr.contains("--tls-key-path"), "a cert without a key: {stderr}");
    let stderr = refused(&args(FRONTEND, &[]), &[("DYN_TLS_KEY_PATH", &key_path)]);
    assert!(stderr.contains("--tls-cert-path"), "a key (from DYN_TLS_KEY_PATH) without a cert: {stderr}");
    let missing = cert.path("missing.pem");
    let stderr = refused(&args(FRONTEND, &["--tls-cert-path", &missing, "--tls-key-path", &key_path]), &[]);
    assert!(stderr.contains("cannot read --tls-cert-path"), "a missing cert file: {stderr}");
    let garbage = cert.path("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").expect("write");
    let stderr = refused(&args(FRONTEND, &["--tls-cert-path", &garbage, "--tls-key-path", &key_path]), &[]);
    assert!(stderr.contains("no PEM certificate"), "a cert file without a certificate: {stderr}");
    let stderr = refused(&args(FRONTEND, &["--tls-cert-path", &cert_path, "--tls-key-path", &garbage]), &[]);
    assert!(stderr.contains("--tls-key-path"), "a key file without a key: {stderr}");
    // A key that is not the certificate's.
    let other = rcgen::KeyPair::generate().expect("a key");
    let other_key = cert.path("other-key.pem");
    std::fs::write(&other_key, other.serialize_pem()).expect("write");
    let stderr = refused(&args(FRONTEND, &["--tls-cert-path", &cert_path, "--tls-key-path", &other_key]), &[]);
    assert!(stderr.contains("invalid TLS certificate/key pair"), "a key that does not match: {stderr}");
}

// ---------------------------------------------------------------------------
// Environment

#[test]
fn listening_line_names_every_bound_address() {
    let (_frontend, line) = spawn("frontend", FRONTEND, &[]);
    let words: Vec<&str> = line.split(' ').collect();
    assert_eq!(words.len(), 4, "{line:?}");
    assert_eq!(words[0], "listening");
    for (word, key) in words[1..].iter().zip(["http=", "events=", "admin="]) {
        let value = word.strip_prefix(key).unwrap_or_else(|| panic!("{key} in {line:?}"));
        let addr: SocketAddr = value.parse().unwrap_or_else(|e| panic!("{value}: {e}"));
        assert_eq!(addr.ip().to_string(), "127.0.0.1", "{line:?}");
        assert_ne!(addr.port(), 0, "{line:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_vars_take_effect_and_flags_beat_them() {
    let (env_port, flag_port) = (free_port(), free_port());
    let env_port_s = env_port.to_string();
    // Only variables: host, ports, kept models (comma-separated), a threshold.
    let env = [
        ("DYN_HTTP_HOST", "127.0.0.1"),
        ("DYN_HTTP_PORT", env_port_s.as_str()),
        ("LOADGATE_FRONTEND_EVENT_PORT", "0"),
        ("LOADGATE_FRONTEND_ADMIN_PORT", "0"),
        ("LOADGATE_FRONTEND_MODEL", "kept-a,kept-b"),
        ("DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD", "0.5"),
    ];
    let (_frontend, line) = spawn("frontend", &["frontend"], &env);
    assert_eq!(addr(&line, "http"), SocketAddr::from(([127, 0, 0, 1], env_port)), "DYN_HTTP_PORT: {line}");
    let admin = format!("http://{}", addr(&line, "admin"));
    let client = common::client();
    let all: Value = client.get(format!("{admin}/busy_threshold")).send().await.unwrap().json().await.unwrap();
    let mut models: Vec<(&str, f64)> = all["thresholds"]
        .as_array()
        .expect("thresholds")
        .iter()
        .map(|t| (t["model"].as_str().unwrap(), t["active_decode_blocks_threshold"].as_f64().unwrap()))
        .collect();
    models.sort_by(|a, b| a.0.cmp(b.0));
    assert_eq!(models, [("kept-a", 0.5), ("kept-b", 0.5)], "LOADGATE_FRONTEND_MODEL and the threshold variable");

    // A worker configured by its variables alone.
    let events = addr(&line, "events").to_string();
    let worker_env = [
        ("LOADGATE_WORKER_HTTP_HOST", "127.0.0.1"),
        ("LOADGATE_WORKER_HTTP_PORT", "0"),
        ("LOADGATE_WORKER_MODEL", MODEL),
        ("LOADGATE_WORKER_FRONTEND", events.as_str()),
        ("LOADGATE_WORKER_DECODE_STEP_MS", "1"),
    ];
    let (_worker, worker_line) = spawn("worker", &["worker"], &worker_env);
    assert!(worker_line.starts_with("listening http=127.0.0.1:"), "{worker_line}");
    let http = format!("http://{}", addr(&line, "http"));
    wait_workers(&client, &http, 1).await;
    let (status, body) = completion(&client, &http).await.expect("completion");
    assert_eq!(status, 200, "{body}");

    // A flag beats its variable.
    let flag_port_s = flag_port.to_string();
    let env = [("DYN_HTTP_PORT", env_port_s.as_str()), ("DYN_HTTP_HOST", "localhost")];
    let flags =
        ["frontend", "--http-host", "127.0.0.1", "--http-port", &flag_port_s, "--event-port", "0", "--admin-port", "0"];
    let (_beaten, line) = spawn("frontend", &flags, &env);
    assert_eq!(addr(&line, "http"), SocketAddr::from(([127, 0, 0, 1], flag_port)), "--http-port over DYN_HTTP_PORT");
}

#[test]
fn boolean_variables_accept_the_usual_spellings() {
    for value in ["1", "true", "YES", "On"] {
        let (_frontend, line) = spawn("frontend", FRONTEND, &[("DYN_DISABLE_FRONTEND_ADMIN_API", value)]);
        assert_eq!(field(&line, "admin").as_deref(), Some("off"), "DYN_DISABLE_FRONTEND_ADMIN_API={value}: {line}");
    }
    for value in ["0", "false", "No", "OFF"] {
        let (_frontend, line) = spawn("frontend", FRONTEND, &[("DYN_DISABLE_FRONTEND_ADMIN_API", value)]);
        let admin = field(&line, "admin");
        assert!(admin.is_some_and(|a| a != "off"), "DYN_DISABLE_FRONTEND_ADMIN_API={value}: {line}");
    }
    let stderr = refused(FRONTEND, &[("DYN_DISABLE_FRONTEND_ADMIN_API", "maybe")]);
    assert!(stderr.contains("DYN_DISABLE_FRONTEND_ADMIN_API") || stderr.contains("disable-admin-api"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_mode_takes_dynamo_spellings() {
    let client = common::client();
    for (extra, env) in [
        (&["--router-mode", "power-of-two"][..], &[][..]),
        (&[][..], &[("DYN_ROUTER_MODE", "power-of-two")][..]),
        (&[][..], &[("DYN_ROUTER_MODE", "p2c")][..]),
        // The flag beats a variable the frontend would refuse.
        (&["--router-mode", "kv"][..], &[("DYN_ROUTER_MODE", "direct")][..]),
    ] {
        let (_frontend, line) = spawn("frontend", &args(FRONTEND, extra), env);
        let (_worker, _) = worker(addr(&line, "events"), &[], &[]);
        let http = format!("http://{}", addr(&line, "http"));
        wait_workers(&client, &http, 1).await;
        let (status, body) = completion(&client, &http).await.expect("completion");
        assert_eq!(status, 200, "{extra:?} {env:?}: {body}");
    }
    for mode in ["direct", "device-aware-weighted"] {
        let stderr = refused(&args(FRONTEND, &["--router-mode", mode]), &[]);
        assert!(stderr.contains(&format!("router mode `{mode}`")) && stderr.contains("not supported"), "{stderr}");
        let stderr = refused(FRONTEND, &[("DYN_ROUTER_MODE", mode)]);
        assert!(stderr.contains("not supported"), "DYN_ROUTER_MODE={mode}: {stderr}");
    }
    let stderr = refused(&args(FRONTEND, &["--router-mode", "fastest"]), &[]);
    assert!(stderr.contains("unknown router mode"), "{stderr}");
}

// ---------------------------------------------------------------------------
// Admin listener

const TOKEN: &str = "admin-token-0123456789abcdef";

/// GET (or POST `body`) `/busy_threshold` at `base` with an optional
/// `Authorization` value: the status, `WWW-Authenticate` and the JSON body.
async fn threshold(
    client: &reqwest::Client,
    base: &str,
    body: Option<Value>,
    authorization: Option<&str>,
) -> (u16, Option<String>, Value) {
    let url = format!("{base}/busy_threshold");
    let mut request = match body {
        Some(body) => client.post(url).json(&body),
        None => client.get(url),
    };
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    let response = request.send().await.expect("/busy_threshold");
    let status = response.status().as_u16();
    let challenge = response.headers().get("www-authenticate").map(|v| v.to_str().unwrap_or("?").to_owned());
    (status, challenge, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_threshold_lives_on_the_admin_listener() {
    let client = common::client();
    let (_frontend, line) = spawn("frontend", &args(FRONTEND, &["--model", MODEL]), &[]);
    let (http, admin) = (format!("http://{}", addr(&line, "http")), format!("http://{}", addr(&line, "admin")));
    let set = json!({"model": MODEL, "active_decode_blocks_threshold": 0.25});
    assert_eq!(threshold(&client, &http, None, None).await.0, 404, "GET on the inference port");
    assert_eq!(threshold(&client, &http, Some(set.clone()), None).await.0, 404, "POST on the inference port");
    let (status, _, all) = threshold(&client, &admin, None, None).await;
    assert_eq!(status, 200, "GET on the admin port: {all}");
    assert_eq!(all["thresholds"][0]["model"], MODEL);
    let (status, _, one) = threshold(&client, &admin, Some(set), None).await;
    assert_eq!(status, 200, "POST on the admin port: {one}");
    assert_eq!(one["active_decode_blocks_threshold"], 0.25, "{one}");
    // The inference port serves no other admin path either.
    let response = client.post(format!("{admin}/v1/completions")).json(&json!({})).send().await.unwrap();
    assert_eq!(response.status(), 404, "the admin port serves only the admin API");
    // Its errors all have the admin API's shape, a wrong method's too.
    let body: Value = response.json().await.unwrap();
    assert!(body["error"].is_string(), "{body}");
    let response = client.put(format!("{admin}/busy_threshold")).json(&json!({})).send().await.unwrap();
    assert_eq!(response.status(), 405);
    assert_eq!(response.headers()["allow"], "GET, POST");
    let body: Value = response.json().await.unwrap();
    assert!(body["error"].is_string(), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_token_is_required_when_set() {
    let client = common::client();
    let dir = std::env::temp_dir().join(format!("loadgate-admin-{}-{}", std::process::id(), fastrand::u64(..)));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("\n  {TOKEN}  \n")).expect("write the token");
    let token_file = token_file.to_string_lossy().into_owned();
    let by_env = spawn("frontend", &args(FRONTEND, &["--model", MODEL]), &[("LOADGATE_ADMIN_TOKEN", TOKEN)]);
    let by_file = spawn("frontend", &args(FRONTEND, &["--model", MODEL, "--admin-token-file", &token_file]), &[]);
    for (name, (_proc, line)) in [("LOADGATE_ADMIN_TOKEN", &by_env), ("--admin-token-file", &by_file)] {
        let admin = format!("http://{}", addr(line, "admin"));
        for (authorization, what) in [
            (None, "no token"),
            (Some("Bearer wrong-token-0123456789abcdef"), "a wrong token"),
            (Some(&format!("Bearer {TOKEN}x")[..]), "a longer token"),
            (Some(&format!("Basic {TOKEN}")[..]), "another scheme"),
        ] {
            let (status, challenge, body) = threshold(&client, &admin, None, authorization).await;
            assert_eq!(status, 401, "{name}, {what}: {body}");
            assert_eq!(challenge.as_deref(), Some("Bearer"), "{name}, {what}: WWW-Authenticate");
            // The admin API's error shape, as its 400s and 404s.
            assert!(body["error"].as_str().is_some_and(|e| e.contains("Bearer")), "{name}, {what}: {body}");
            let set = json!({"model": MODEL, "active_decode_blocks_threshold": 0.0});
            assert_eq!(threshold(&client, &admin, Some(set), authorization).await.0, 401, "{name}, {what}: POST");
        }
        let bearer = format!("Bearer {TOKEN}");
        let (status, _, all) = threshold(&client, &admin, None, Some(&bearer)).await;
        assert_eq!(status, 200, "{name}, the right token: {all}");
        // Nothing changed while unauthorized.
        assert_eq!(all["thresholds"][0]["active_decode_blocks_threshold"], Value::Null, "{name}: {all}");
        let set = json!({"model": MODEL, "active_decode_blocks_threshold": 0.5});
        assert_eq!(threshold(&client, &admin, Some(set), Some(&bearer)).await.0, 200, "{name}: POST");
    }
    drop((by_env, by_file));

    let stderr = refused(FRONTEND, &[("LOADGATE_ADMIN_TOKEN", "short")]);
    assert!(stderr.contains("at least 16 bytes"), "a short token: {stderr}");
    let stderr = refused(&args(FRONTEND, &["--admin-token-file", &token_file]), &[("LOADGATE_ADMIN_TOKEN", TOKEN)]);
    assert!(stderr.contains("both"), "a file and the variable: {stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_admin_api_leaves_no_listener() {
    let port = free_port().to_string();
    for (extra, env) in
        [(&["--disable-admin-api"][..], &[][..]), (&[][..], &[("DYN_DISABLE_FRONTEND_ADMIN_API", "true")][..])]
    {
        let mut all = vec!["frontend", "--http-host", "127.0.0.1", "--http-port", "0", "--event-port", "0"];
        all.extend(["--admin-port", &port]);
        all.extend_from_slice(extra);
        let (_frontend, line) = spawn("frontend", &all, env);
        assert!(line.ends_with(" admin=off"), "{extra:?} {env:?}: {line}");
        let admin: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        assert!(TcpStream::connect_timeout(&admin, Duration::from_secs(1)).is_err(), "something listens on {admin}");
        // The inference port still has no admin routes.
        let http = format!("http://{}", addr(&line, "http"));
        assert_eq!(threshold(&common::client(), &http, None, None).await.0, 404);
    }
}

// ---------------------------------------------------------------------------
// Worker addresses

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_announces_its_advertise_addr() {
    let client = common::client();
    // The worker announces an address that is not its own: the frontend
    // routes to what it announced.
    let fake = FakeWorker::start();
    let (_frontend, line) = spawn("frontend", FRONTEND, &[]);
    let advertised = fake.addr.to_string();
    let (_worker, worker_line) = worker(addr(&line, "events"), &["--advertise-addr", &advertised], &[]);
    let bound = addr(&worker_line, "http");
    assert_eq!(bound.ip().to_string(), "127.0.0.1", "the listening line shows the bound address: {worker_line}");
    assert_ne!(bound, fake.addr);
    let http = format!("http://{}", addr(&line, "http"));
    wait_workers(&client, &http, 1).await;
    let (status, body) = completion(&client, &http).await.expect("completion");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(IMPOSTOR_MARK), "the request went to the bound address, not the advertised one: {body}");
    assert!(fake.requests() >= 1);
}

#[test]
fn worker_needs_advertise_addr_on_an_unspecified_address() {
    let base = ["worker", "--model", MODEL, "--http-port", "0"];
    for host in ["0.0.0.0", "::"] {
        let stderr = refused(&args(&base, &["--http-host", host]), &[]);
        assert!(stderr.contains("--advertise-addr"), "--http-host {host}: {stderr}");
        let stderr = refused(&base, &[("LOADGATE_WORKER_HTTP_HOST", host)]);
        assert!(stderr.contains("--advertise-addr"), "LOADGATE_WORKER_HTTP_HOST={host}: {stderr}");
    }
    for bad in ["nohost", ":8000", "host:", "host:99999", "host:0", "a b:80", "h/x?:80"] {
        let stderr = refused(&args(&base, &["--http-host", "127.0.0.1", "--advertise-addr", bad]), &[]);
        assert!(stderr.contains("invalid --advertise-addr"), "--advertise-addr {bad}: {stderr}");
    }
}
