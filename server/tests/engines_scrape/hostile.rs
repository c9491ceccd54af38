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
