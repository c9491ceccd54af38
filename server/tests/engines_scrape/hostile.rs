//! Engines that send what no engine should: documents valid but huge.

use super::*;

/// Found by a review: a llama.cpp `/slots` is read into memory whole (at
/// most 8 MiB), but each slot's `next_token` was parsed into a JSON tree,
/// about 16 times the size of its text: a valid 8 MiB `/slots` of
/// `next_token: [{"n_remain": -1}, 0, 0, ...]` took the frontend's RSS past
/// 150 MiB at each scrape, per engine. Now only `next_token[0].n_remain` is
/// kept: the load is read, and the peak stays near the bodies' own size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slots_document_of_padding_costs_no_more_than_its_size() {
    let _box = common::shared().await;
    let engine = FakeEngine::start(Kind::LlamaCpp, &[MODEL]);
    // Just under the 8 MiB cap: the one processing slot holds it all.
    engine.set(|l| (l.running, l.slots_padding) = (1, (8 << 20) - 4096));
    let fe = frontend(&[engine.spec(Some(MODEL))], &["--engine-scrape-interval-ms", "20"], &[]);
    fe.wait_metrics("the load of the padded /slots", |m| {
        sum_metric(m, "dynamo_frontend_worker_active_decode_blocks", &[]) == 512.0
    })
    .await;
    engine.wait_scrapes(5).await;
    let mem = fe.proc.mem();
    eprintln!("after padded scrapes: VmRSS {:.1} MiB, VmHWM {:.1} MiB", mem.rss_mib(), mem.hwm_mib());
    // The bodies (8 MiB, in a buffer that may have doubled) and the debug
    // build's idle tens of MiB stay well under it; the JSON tree did not.
    assert!(mem.hwm_mib() < 100.0, "peak RSS {:.1} MiB", mem.hwm_mib());
    assert_eq!(fe.complete(MODEL).await.0, 200);
}

/// Found by a review: each scrape of an engine whose rank count flaps
/// (1, 2, 1, ...) logged a warning (registered again), one line per
/// scrape: 20 a second at the default interval, for as long as the engine
/// likes. Now an engine's lines pass its own throttle (10 per 10 s, the
/// suppressed ones counted in the next): 100 flaps in a couple of seconds
/// log at most 10 lines a started 10 s, and the engine still serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_whose_rank_count_flaps_does_not_flood_the_log() {
    let _box = common::shared().await;
    let engine = FakeEngine::start(Kind::Vllm, &[MODEL]);
    engine.set(|l| l.vllm_ranks = vec![(0, 0.1), (0, 0.1)]);
    let fe = frontend(&[engine.spec(Some(MODEL))], &["--engine-scrape-interval-ms", "20"], &[]);
    let started = Instant::now();
    engine.set(|l| l.flap_ranks = true);
    engine.wait_scrapes(100).await;
    let line = "another number of data-parallel ranks";
    assert!(fe.proc.wait_log(line, SETTLE), "the first flap is logged");
    let elapsed = started.elapsed().as_secs();
    let logged = fe.proc.stderr().matches(line).count();
    eprintln!("100 flaps in {elapsed} s: {logged} lines");
    // 10 lines a window of 10 s, and the windows started meanwhile.
    assert!(logged as u64 <= 10 * (elapsed / 10 + 2), "{logged} lines in {elapsed} s");
    assert_eq!(fe.complete(MODEL).await.0, 200);
}
