//! An engine that flaps: its scrapes fail and answer in turn. With
//! `--engine-scrape-failures 1` each failure takes the sidecar out of
//! routing (a Deregister) and the next answer brings it back (a new
//! publisher, a Register): one cycle every two scrapes, as an engine that
//! fails `K` scrapes in every `K + 1` does at the default `K`.

use std::time::{Duration, Instant};

use super::common::metrics_text;
use super::routed_sidecar_scraping;

/// The flaps the test waits for: 100 cycles of leaving and rejoining.
const SCRAPES: usize = 200;

/// Found by a review: every cycle logged a warning (leaving routing) and
/// an info line (rejoining), one line a scrape of the engine, for as long
/// as it flaps: 25 a second at a 20 ms interval. Now the sidecar's
/// transitions pass one throttle (10 lines per 10 s, the suppressed ones
/// counted in the next), and it still rejoins once the engine steadies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_flaps_does_not_flood_the_sidecars_log() {
    let (frontend, engine, worker) = routed_sidecar_scraping("20", "1", &[("RUST_LOG", "info")]).await;
    let before = worker_series(&metrics_text(&frontend.client, &frontend.http).await);
    let rss_before = frontend.mem().rss_mib();
    let started = Instant::now();
    engine.set_metrics_flap(true);
    assert!(engine.wait_scrapes(SCRAPES, Duration::from_secs(60)).await, "{SCRAPES} scrapes within 60 s");
    engine.set_metrics_flap(false);
    let elapsed = started.elapsed().as_secs();
    frontend.wait_workers(1, Duration::from_secs(10)).await;
    let stderr = worker.proc.stderr();
    let left = stderr.matches("leaving routing").count();
    let back = stderr.matches("rejoining routing").count();
    let after = worker_series(&metrics_text(&frontend.client, &frontend.http).await);
    eprintln!(
        "{SCRAPES} flapping scrapes in {elapsed} s: {left} lines leaving, {back} rejoining; frontend /metrics \
         {before} -> {after} series of workers, RSS {rss_before:.1} -> {:.1} MiB",
        frontend.mem().rss_mib()
    );
    assert!(left >= 1, "the first flap is logged");
    // 10 lines a window of 10 s, and the windows started meanwhile.
    let bound = 10 * (elapsed as usize / 10 + 2);
    assert!(left + back <= bound, "{left} + {back} lines in {elapsed} s (at most {bound})");
    // The same id and incarnation rejoin: their series are reused, not added.
    assert_eq!(before, after, "the frontend's series of workers grew");
}

/// The lines of `/metrics` about a worker.
fn worker_series(text: &str) -> usize {
    text.lines().filter(|line| line.contains("worker_id=")).count()
}
