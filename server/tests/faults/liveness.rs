//! Liveness: a frozen worker (SIGSTOP: its process and its event connection
//! go silent, but its kernel still accepts connections, like a host that
//! vanished without a FIN) leaves routing within the silence bound, its
//! in-flight requests end at the upstream timeout (504), it is
//! deregistered after the idle timeout and the grace, and it rejoins when it
//! runs again.

use std::time::{Duration, Instant};

use crate::common::{self, Frontend};

/// The frontend's first-byte timeout in these tests.
const FIRST_BYTE_SECS: u64 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_worker_gets_no_new_request_two_seconds_after_it_froze_and_rejoins_when_it_runs_again() {
    let _serial = common::exclusive().await;
    let first_byte = FIRST_BYTE_SECS.to_string();
    let frontend = Frontend::start(None, &["--upstream-first-byte-timeout-secs", &first_byte]);
    let mut frozen = common::worker(Some(frontend.events), "m", None, &[]);
    let other = common::worker(Some(frontend.events), "m", None, &[]);
    frontend.wait_workers(2, Duration::from_secs(10)).await;

    common::signal(frozen.proc.pid(), "STOP");
    let froze = Instant::now();
    // A request every 20 ms for 4 s (open loop), round robin: those sent to
    // the frozen worker before it left routing end at the first-byte
    // timeout with 504 (not run again elsewhere: the worker took them).
    let timeout = Duration::from_secs(FIRST_BYTE_SECS + 5);
    let seen = open_loop(&frontend.http, Duration::from_millis(20), Duration::from_secs(4), timeout).await;
    let slow: Vec<_> = seen.iter().filter(|o| o.took >= Duration::from_secs(2)).collect();
    let late: Vec<_> = seen.iter().filter(|o| o.sent >= Duration::from_secs(2)).collect();
    let last_slow = slow.iter().map(|o| o.sent).max();
    eprintln!(
        "frozen worker: {} requests in 4 s (one per 20 ms), {} waited for the first-byte timeout (the last sent \
         {last_slow:?} after the freeze), {} sent after 2 s; statuses {:?}",
        seen.len(),
        slow.len(),
        late.len(),
        common::by_status(&seen)
    );
    assert!(!slow.is_empty(), "some request reached the frozen worker");
    for o in &seen {
        let expected = if o.took >= Duration::from_secs(2) { 504 } else { 200 };
        assert_eq!(o.status, expected, "{o:?}");
    }
    for o in &slow {
        assert!(o.sent < Duration::from_secs(2), "a request sent {:?} after the freeze hit the frozen worker", o.sent);
        let bound = Duration::from_secs(FIRST_BYTE_SECS);
        assert!(o.took >= bound - Duration::from_millis(100), "it ended at the first-byte timeout: {:?}", o.took);
    }
    assert!(!late.is_empty(), "requests were sent after the bound");
    assert!(late.iter().all(|o| o.took < Duration::from_secs(1)), "late requests waited");

    // Silent past the idle timeout (2 s) and the grace: deregistered.
    frontend.wait_workers(1, Duration::from_secs(5)).await;
    let gone = froze.elapsed();
    eprintln!("frozen worker deregistered within {gone:?} of the freeze (checked after the load)");

    // Running again: it reconnects, registers and takes traffic.
    common::signal(frozen.proc.pid(), "CONT");
    let resumed = Instant::now();
    frontend.wait_workers(2, Duration::from_secs(10)).await;
    eprintln!("resumed worker registered again {:?} after SIGCONT", resumed.elapsed());
    let text = common::metrics_text(&frontend.client, &frontend.http).await;
    assert_eq!(common::metric(&text, "loadgate_frontend_workers_out_of_routing"), Some(0.0), "{text}");
    assert!(common::metric(&text, "loadgate_frontend_workers_silenced_total").unwrap_or(0.0) >= 1.0, "{text}");
    assert!(common::metric(&text, "loadgate_frontend_upstream_failures_total").unwrap_or(0.0) >= slow.len() as f64);
    // The resumed worker serves: with the other one frozen past the
    // silence bound, every request still succeeds at once.
    common::signal(other.proc.pid(), "STOP");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let outcomes = common::load(&frontend.http, "m", 2, Duration::from_secs(1), 50, Duration::from_secs(5)).await;
    common::signal(other.proc.pid(), "CONT");
    eprintln!("with the other worker frozen: {:?}", common::by_status(&outcomes));
    assert!(!outcomes.is_empty());
    assert!(outcomes.iter().all(|o| o.status == 200 && o.took < Duration::from_secs(1)), "{outcomes:?}");
    frozen.proc.kill();
}

/// Sends one small completion every `every` for `run_for` (each bounded by
/// `timeout`), whatever the earlier ones do; returns every outcome.
async fn open_loop(base: &str, every: Duration, run_for: Duration, timeout: Duration) -> Vec<common::Outcome> {
    let client = common::client_within(timeout);
    let started = Instant::now();
    let mut tasks = Vec::new();
    let mut ticks = tokio::time::interval(every);
    while started.elapsed() < run_for {
        ticks.tick().await;
        let (client, base) = (client.clone(), base.to_owned());
        tasks.push(tokio::spawn(async move {
            let sent = started.elapsed();
            let t = Instant::now();
            let (status, body) = common::complete(&client, &base, "m", None).await;
            common::Outcome { sent, took: t.elapsed(), status, body }
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.push(task.await.expect("a request task panicked"));
    }
    all
}

/// A `--worker URL` worker has no event connection: its active health
/// checks take it out of routing when it freezes and bring it back after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_static_worker_fails_its_health_checks_and_comes_back() {
    let _serial = common::exclusive().await;
    let worker = common::worker(None, "m", None, &[]);
    let frontend = Frontend::start(
        None,
        &["--worker", &worker.http, "--worker-health-check-ms", "200", "--upstream-first-byte-timeout-secs", "5"],
    );
    let client = common::client_within(Duration::from_secs(10));
    assert_eq!(common::complete(&client, &frontend.http, "m", None).await.0, 200);
    common::signal(worker.proc.pid(), "STOP");
    let froze = Instant::now();
    // Out of routing within two failed checks (each bounded by 200 ms).
    let mut answered = None;
    while froze.elapsed() < Duration::from_secs(4) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let text = common::metrics_text(&frontend.client, &frontend.http).await;
        if common::metric(&text, "loadgate_frontend_workers_out_of_routing") == Some(1.0) {
            answered = Some(froze.elapsed());
            break;
        }
    }
    let out_after = answered.expect("the frozen worker left routing");
    let t = Instant::now();
    let (status, body) = common::complete(&client, &frontend.http, "m", None).await;
    let took = t.elapsed();
    eprintln!("static worker: out of routing {out_after:?} after the freeze; a request then: {status} in {took:?}");
    assert!(out_after < Duration::from_millis(1500), "{out_after:?}");
    assert_eq!(status, 503, "no live worker: {body}");
    assert!(took < Duration::from_secs(1), "answered at once, not at the upstream timeout: {took:?}");
    common::signal(worker.proc.pid(), "CONT");
    let resumed = Instant::now();
    loop {
        let (status, _) = common::complete(&client, &frontend.http, "m", None).await;
        if status == 200 {
            break;
        }
        assert!(resumed.elapsed() < Duration::from_secs(3), "the resumed worker did not come back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("static worker back in routing {:?} after SIGCONT", resumed.elapsed());
}
