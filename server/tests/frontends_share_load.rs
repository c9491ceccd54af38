//! Many frontends, one fleet (issue 26), end to end: a real `nats-server`,
//! three real `loadgate frontend` processes on the NATS plane, and two
//! workers this test plays (sealed Registers and Loads on NATS, whose loads
//! report no prefill at all, and an HTTP endpoint that holds every request
//! 1.5 s and records how many it held at once). Each frontend is sent 60
//! requests of 100 prompt tokens at once; the prefill threshold is 1,000
//! tokens, so a worker's load is its held requests × 100.
//!
//! - without sharing (`--share-load false`) each frontend fills each worker
//!   to the threshold by itself: about 3× it;
//! - sharing with the lease (the default): within the stated bound,
//!   threshold + k requests (k = 3 frontends: 1,300 tokens, 13 requests).
//!   The bound holds however late a busy frontend applies another's
//!   frames (a frontend's reference is what the others acknowledged
//!   applying: see `loadgate::monitor` `lease`), so the assertion is the
//!   bound itself. Until the acknowledgements the reference was a
//!   frontend's own frame back from NATS, and a CI run on a busy 2-core
//!   machine measured 1.70x; the figure is printed.
//!
//! `#[ignore]` in plain `cargo test` (they need `nats-server`); `.ci/run`
//! runs them (release). Every wait is bounded.

#[path = "common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::{frontend, metric, metrics_text, unix_ms, FakeWorker, Frontend, Nats, SECRET};
use loadgate::wire::envelope::seal;
use loadgate::wire::Frame;
use loadgate::RankLoad;
use serde_json::json;

const MODEL: &str = "shared-model";
/// The prefill threshold, and each request's prompt (whitespace words).
const THRESHOLD: u32 = 1000;
const PROMPT_TOKENS: u32 = 100;
/// How long a worker holds each request.
const HOLD: Duration = Duration::from_millis(1500);
/// The frontends' beat (their default): a dead frontend's load stops
/// counting three beats after its last frame.
const BEAT: Duration = Duration::from_millis(200);

/// Two workers played by this test: registered on NATS with sealed frames
/// (again every 200 ms, with a load reporting no prefill) until dropped.
struct Workers {
    endpoints: Vec<FakeWorker>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn workers(nats: &Nats, hold: Duration) -> Workers {
    let endpoints: Vec<FakeWorker> = (0..2).map(|_| FakeWorker::holding(hold)).collect();
    let client = async_nats::connect(nats.url.as_str()).await.expect("the workers connect to NATS");
    let incarnation = unix_ms() * 1000;
    let registered: Vec<(u64, String)> =
        endpoints.iter().enumerate().map(|(i, e)| (51 + i as u64, e.addr.to_string())).collect();
    let task = tokio::spawn(async move {
        for seq in 1u64.. {
            for (worker, addr) in &registered {
                let subject = format!("loadgate.ev.{MODEL}.{worker}");
                let register = Frame::Register {
                    worker: *worker,
                    incarnation,
                    dp_size: 1,
                    model: MODEL.to_owned(),
                    http_addr: addr.clone(),
                };
                // Reports of prefill off: the engine's own KV only.
                let load = RankLoad { kv_total_blocks: 1000, ..Default::default() };
                let report = Frame::Load { worker: *worker, incarnation, rank: 0, seq, load };
                for frame in [register, report] {
                    let mut buf = BytesMut::new();
                    seal(SECRET.as_bytes(), &subject, unix_ms(), &frame, &mut buf).unwrap();
                    let _ = client.publish(subject.clone(), buf.freeze()).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    Workers { endpoints, task }
}

/// Three frontends in `kv` mode with the prefill threshold and `extra`,
/// each knowing both workers (and, sharing, all three frontends).
async fn frontends(nats: &Nats, extra: &[&str], sharing: bool) -> Vec<Frontend> {
    let threshold = THRESHOLD.to_string();
    let mut flags = vec!["--router-mode", "kv", "--active-prefill-tokens-threshold", &threshold];
    flags.extend_from_slice(extra);
    let fes: Vec<Frontend> = (0..3).map(|_| frontend(nats, &flags)).collect();
    for fe in &fes {
        fe.wait_workers(2, Duration::from_secs(10)).await;
    }
    if sharing {
        for fe in &fes {
            let heard = |text: &str| metric(text, "loadgate_frontend_shared_frontends") == Some(3.0);
            let what = "a frontend did not hear the other two";
            common::wait_for_metrics(&fe.client, &fe.http, Duration::from_secs(10), what, heard).await;
        }
    }
    fes
}

/// `n` requests sent to each frontend at once; the statuses.
async fn burst(fes: &[Frontend], n: usize) -> Vec<u16> {
    let client = Arc::new(common::client_within(Duration::from_secs(30)));
    let mut sent = Vec::new();
    for fe in fes {
        for _ in 0..n {
            sent.push(tokio::spawn(send(client.clone(), fe.http.clone())));
        }
    }
    let mut statuses = Vec::new();
    for s in sent {
        statuses.push(s.await.unwrap_or(0));
    }
    statuses
}

/// One request of [`PROMPT_TOKENS`] to the frontend at `http`: its status
/// (0: no answer within the client's timeout).
async fn send(client: Arc<reqwest::Client>, http: String) -> u16 {
    let body = json!({"model": MODEL, "prompt": "word ".repeat(PROMPT_TOKENS as usize), "max_tokens": 1});
    let answer = client.post(format!("{http}/v1/completions")).json(&body).send().await;
    answer.map_or(0, |r| r.status().as_u16())
}

/// One round: the most tokens either worker held at once, as a multiple of
/// the threshold, and the statuses.
async fn round(extra: &[&str], sharing: bool) -> (f64, Vec<u16>) {
    let nats = Nats::start(&[]);
    let workers = workers(&nats, HOLD).await;
    let fes = frontends(&nats, extra, sharing).await;
    let statuses = burst(&fes, 60).await;
    let peak = workers.endpoints.iter().map(FakeWorker::peak).max().unwrap_or(0);
    let ratio = f64::from(peak as u32 * PROMPT_TOKENS) / f64::from(THRESHOLD);
    (ratio, statuses)
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|&&s| s == status).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn three_frontends_admitting_at_once_stay_within_the_lease_bound_and_not_sharing_is_three_times() {
    let _box = common::exclusive().await;
    let (alone, statuses) = round(&["--share-load", "false"], false).await;
    eprintln!(
        "not sharing: peak {alone:.2} x the threshold; {} x 200, {} x 529",
        count(&statuses, 200),
        count(&statuses, 529)
    );
    let (sum, statuses) = round(&["--share-lease", "false"], true).await;
    eprintln!("sum, no lease: peak {sum:.2} x; {} x 200, {} x 529", count(&statuses, 200), count(&statuses, 529));
    let (leased, statuses) = round(&[], true).await;
    eprintln!("sum and lease: peak {leased:.2} x; {} x 200, {} x 529", count(&statuses, 200), count(&statuses, 529));
    assert!(statuses.iter().all(|s| [200, 529].contains(s)), "only 200 and 529: {statuses:?}");
    assert!(alone >= 2.5, "each frontend alone fills each worker: about 3x, got {alone:.2}");
    assert!(leased <= 1.3 + 1e-9, "within threshold + k requests (1.3x): {leased:.2}");
    // The fill the lease guarantees in a burst that ends before any
    // acknowledgement comes back (all 180 requests arrive at once), each
    // frontend seeing the others' load at once: per worker, the worst
    // interleaving admits 7 requests of 100 tokens. The first frontend
    // takes 3, the second 2 (seeing 300), the third 2 (seeing 500); then
    // each one's unseen growth times 3 is past the headroom it sees (900 >
    // 600, 600 > 500, 600 > 500). An exhaustive search of the orders finds
    // no fewer. Acknowledgements during the burst let more in (peaks of
    // 1.1-1.3x); one CI run admitted 18 (peak 0.9x).
    assert!(count(&statuses, 200) >= 14, "the lease still fills the workers: {} admitted", count(&statuses, 200));
}

/// Frontend A fills both workers (paced, so its echoes keep up); B and C
/// are refused. A is killed (-9): its load stops counting three beats after
/// its last frame (the expiry runs every 150 ms), and B takes the headroom.
/// Probes every 25 ms; one that gets no 529 within 300 ms was admitted
/// (the worker holds it 6 s). Margin: admitted within 3 beats + 150 ms +
/// 250 ms (a busy 2-core machine), not before the 3 beats less one beat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn a_killed_frontends_share_is_released_within_three_beats_and_the_others_take_it() {
    let _box = common::exclusive().await;
    let nats = Nats::start(&[]);
    let _workers = workers(&nats, Duration::from_secs(6)).await;
    let mut fes = frontends(&nats, &[], true).await;
    let long = Arc::new(common::client_within(Duration::from_secs(30)));
    let mut held = Vec::new();
    for _ in 0..40 {
        held.push(tokio::spawn(send(long.clone(), fes[0].http.clone())));
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    let probe = Arc::new(common::client_within(Duration::from_millis(300)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    for fe in &fes[1..] {
        assert_eq!(send(probe.clone(), fe.http.clone()).await, 529, "the workers are full of A's requests");
    }
    // A's load keeps counting while A lives (its beats renew it), well
    // past three beats after it last changed.
    tokio::time::sleep(BEAT * 5).await;
    for fe in &fes[1..] {
        assert_eq!(send(probe.clone(), fe.http.clone()).await, 529, "A is alive: its load still counts");
    }
    fes[0].proc.kill();
    let killed = Instant::now();
    let admitted = loop {
        let at = killed.elapsed();
        let status = send(probe.clone(), fes[1].http.clone()).await;
        if status != 529 {
            break at;
        }
        assert!(killed.elapsed() < Duration::from_secs(5), "B never took A's share");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    eprintln!("B admitted {admitted:?} after A was killed (3 beats = {:?})", 3 * BEAT);
    assert!(admitted >= 2 * BEAT, "A's load stopped counting before its 3 beats: {admitted:?}");
    assert!(admitted <= 3 * BEAT + Duration::from_millis(400), "not within 3 beats (+ margin): {admitted:?}");
    let text = metrics_text(&fes[2].client, &fes[2].http).await;
    assert_eq!(metric(&text, "loadgate_frontend_shared_frontends"), Some(2.0), "C counts B and itself");
    drop(held);
}

/// A storm against three frontends: 2 simulated workers on NATS (256 KV
/// blocks, 20 ms steps), three frontends in `kv` mode busy past half the
/// blocks, with `--retry-hint-scope scope`; 200 clients of `loadgate bench
/// --retry-storm` spread over the three (each retry to the next frontend,
/// as a load balancer would), honouring the hints. The bench's summary.
async fn storm(scope: &str) -> serde_json::Value {
    let nats = Nats::start(&[]);
    let flags = ["--kv-total-blocks", "256", "--decode-step-ms", "20"];
    let mut worker_flags = common::plane(&nats);
    worker_flags.extend(flags.iter().map(|s| (*s).to_owned()));
    let worker_flags: Vec<&str> = worker_flags.iter().map(String::as_str).collect();
    let _workers: Vec<common::Worker> =
        (0..2).map(|_| common::worker(None, "storm-model", Some(SECRET), &worker_flags)).collect();
    let fe_flags = ["--router-mode", "kv", "--active-decode-blocks-threshold", "0.5", "--retry-hint-scope", scope];
    let fes: Vec<Frontend> = (0..3).map(|_| frontend(&nats, &fe_flags)).collect();
    for fe in &fes {
        fe.wait_workers(2, Duration::from_secs(10)).await;
    }
    let urls: Vec<&str> = fes.iter().map(|fe| fe.http.as_str()).collect();
    // A client's window outlasts the longest hint (30 s) and its retry: each
    // frontend's own hint counts only its own requests in flight, so at a
    // moment when few are, the 67th client it refuses waits 67 short slots
    // (one run: 16 s), and an unlucky run would end with clients out of
    // time. A run ends when every client is done (2-4 s usually).
    let summary = common::retry_storm(&urls, "storm-model", "200", "35", Duration::from_secs(45));
    eprintln!("retry storm over three frontends, hint scope {scope}: {summary}");
    summary
}

/// The pool-wide hint against each frontend's own, same run: both end
/// with every client served; the figures go to docs/benchmarks.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server); run by .ci/run"]
async fn a_retry_storm_over_three_frontends_with_the_pool_hint_and_each_frontends() {
    let _box = common::exclusive().await;
    let num = |s: &serde_json::Value, key: &str| s[key].as_f64().unwrap_or_else(|| panic!("no {key} in {s}"));
    let mut rows = Vec::new();
    for scope in ["frontend", "pool"] {
        let s = storm(scope).await;
        assert_eq!(num(&s, "succeeded"), num(&s, "clients"), "{scope}: every client succeeds: {s}");
        assert_eq!(num(&s, "unhinted_refusals"), 0.0, "{scope}: every refusal carries a hint");
        let longest = s["retry_after_ms"]["max"].as_f64().unwrap_or(f64::NAN);
        // (The histogram keeps 3 significant digits: 0.1 % over at most.)
        assert!(longest <= 30_030.0, "{scope}: a hint past the 30 s cap: {longest} ms");
        let p50 = s["time_to_success_ms"]["p50"].as_f64().unwrap_or(f64::NAN);
        rows.push((scope, num(&s, "peak_retries_10ms"), num(&s, "retries"), num(&s, "goodput_rps"), p50));
    }
    for (scope, peak, retries, goodput, p50) in rows {
        eprintln!(
            "{scope}: peak {peak} retries / 10 ms, {retries} retries, goodput {goodput:.1} req/s, p50 {p50:.0} ms"
        );
    }
}

/// Found by a review: a frontend that forgets a worker the others keep
/// (its idle timeout shorter than theirs; a deregistration another missed)
/// never took back what it had added there, and its beats kept that
/// figure fresh at the others: they shed an idle worker for as long as it
/// lived. Here frontend B's request (100 prefill tokens, threshold 50) runs
/// while the worker goes silent for 2 s: B (idle timeout 800 ms) forgets
/// the worker, A (30 s) keeps it. The worker comes back and B's request
/// ends; A must admit again. (B now publishes a zero for what it forgets.)
/// NATS may lose that zero, so B sends it again at its rotation's next
/// visits: during the silence, at least two zeros for the worker (only B
/// publishes it a load), and never more than the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (scripts/prepare-nats-server)"]
async fn a_frontend_that_forgets_a_worker_takes_back_what_it_added_there() {
    const WORKER: u64 = 61;
    const FORGOTTEN: &str = "forgotten-model";
    let _box = common::exclusive().await;
    let nats = Nats::start(&[]);
    let endpoint = FakeWorker::holding(Duration::from_millis(3000));
    let paused = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Sealed Register and Load every 100 ms (no prefill reported), none
    // while `paused`.
    let frames = {
        let (url, addr, paused) = (nats.url.clone(), endpoint.addr.to_string(), paused.clone());
        tokio::spawn(async move {
            let client = async_nats::connect(url.as_str()).await.expect("the worker connects to NATS");
            let incarnation = unix_ms() * 1000;
            let subject = format!("loadgate.ev.{FORGOTTEN}.{WORKER}");
            for seq in 1u64.. {
                // Relaxed: a test switch.
                if !paused.load(std::sync::atomic::Ordering::Relaxed) {
                    let register = Frame::Register {
                        worker: WORKER,
                        incarnation,
                        dp_size: 1,
                        model: FORGOTTEN.to_owned(),
                        http_addr: addr.clone(),
                    };
                    let load = RankLoad { kv_total_blocks: 1000, ..Default::default() };
                    for frame in [register, Frame::Load { worker: WORKER, incarnation, rank: 0, seq, load }] {
                        let mut buf = BytesMut::new();
                        seal(SECRET.as_bytes(), &subject, unix_ms(), &frame, &mut buf).unwrap();
                        let _ = client.publish(subject.clone(), buf.freeze()).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let flags = |idle: &'static str| {
        let mut flags = vec!["--router-mode", "kv", "--active-prefill-tokens-threshold", "50"];
        flags.extend(["--event-silence-ms", "400", "--event-idle-timeout-ms", idle]);
        flags
    };
    let a = frontend(&nats, &flags("30000"));
    let b = frontend(&nats, &flags("800"));
    for fe in [&a, &b] {
        fe.wait_workers(1, Duration::from_secs(10)).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while metric(&metrics_text(&fe.client, &fe.http).await, "loadgate_frontend_shared_frontends") != Some(2.0) {
            assert!(Instant::now() < deadline, "the frontends did not hear each other within 10 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Every FrontendLoad for the worker, as (when, zero).
    let published = {
        let listener = async_nats::connect(nats.url.as_str()).await.expect("the listener connects to NATS");
        let mut frames = listener.subscribe("loadgate.fe.>").await.expect("subscribes");
        let published = Arc::new(std::sync::Mutex::new(Vec::new()));
        let into = published.clone();
        let task = tokio::spawn(async move {
            use futures_util::StreamExt;
            while let Some(message) = frames.next().await {
                let opened = loadgate::wire::envelope::open(&[SECRET.as_bytes()], &message.subject, &message.payload);
                if let Ok(loadgate::wire::envelope::Sealed {
                    frame: Frame::FrontendLoad { worker: WORKER, load, .. },
                    ..
                }) = opened
                {
                    let zero = load.active_prefill_tokens == 0 && load.active_decode_blocks == 0;
                    into.lock().unwrap().push((Instant::now(), zero));
                }
            }
        });
        (published, task)
    };
    let body = json!({"model": FORGOTTEN, "prompt": "word ".repeat(100), "max_tokens": 1});
    // 0: no answer within the probe's timeout (admitted, held).
    let probe = common::client_within(Duration::from_millis(800));
    let send = |fe: &Frontend| {
        let request = probe.post(format!("{}/v1/completions", fe.http)).json(&body).send();
        async move { request.await.map_or(0, |r| r.status().as_u16()) }
    };
    // B's request holds 100 prefill tokens for 3 s; A counts it.
    let held = {
        let long = common::client_within(Duration::from_secs(30));
        let request = long.post(format!("{}/v1/completions", b.http)).json(&body).send();
        tokio::spawn(async move { request.await.map_or(0, |r| r.status().as_u16()) })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(send(&a).await, 529, "A counts B's request");
    // Silent for 2 s: B forgets the worker, A does not.
    let silent = Instant::now();
    paused.store(true, std::sync::atomic::Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    paused.store(false, std::sync::atomic::Ordering::Relaxed);
    // B forgets the worker after 800 ms of silence (and its checks), so
    // the zeros have more than a second, five beats, in the silence.
    let zeros = published.0.lock().unwrap().iter().filter(|(at, zero)| *at > silent && *zero).count();
    assert!((2..=12).contains(&zeros), "B took its load back {zeros} times during the silence, not 2 to 12");
    assert_eq!(held.await.unwrap(), 200, "B's request was answered");
    b.wait_workers(1, Duration::from_secs(5)).await;
    // Nothing runs on the worker now: A admits within 5 s (B's zero goes
    // out with its rotation, within a beat or two).
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut statuses = Vec::new();
    loop {
        let status = send(&a).await;
        statuses.push(status);
        if status != 529 {
            break;
        }
        assert!(Instant::now() < deadline, "A refused an idle worker for 5 s: {statuses:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("A after B's request ended: {statuses:?}; B's zeros in the silence: {zeros}");
    frames.abort();
    published.1.abort();
}
