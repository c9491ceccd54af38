//! An engine whose rank numbers do not start at 0.

use super::*;

/// vLLM labels its ranks by their global number, so one behind an external
/// balancer (`--data-parallel-rank 3`) shows rank 3 alone. That rank
/// saturated, the engine is busy: the numbers below it are no ranks of it
/// (taken as idle ranks, they kept the worker free and its requests went
/// on to the engine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_showing_rank_3_alone_is_busy_when_rank_3_is() {
    let _box = common::shared().await;
    let engine = FakeEngine::start(Kind::Vllm, &[MODEL]);
    engine.set(|l| (l.vllm_ranks, l.vllm_first_rank) = (vec![(0, 0.1)], 3));
    let fe = frontend(
        &[engine.spec(None)],
        &["--engine-scrape-interval-ms", "20", "--active-waiting-requests-threshold", "2"],
        &[],
    );
    let id = format!("worker_id=\"{}\"", engine_worker_id(&engine.url(), MODEL));
    let text = fe.metrics().await;
    assert!(!text.contains(&format!("{id},dp_rank=\"1\"")), "one rank:\n{text}");
    assert_eq!(fe.complete(MODEL).await.0, 200);
    engine.set(|l| l.vllm_ranks = vec![(50, 0.99)]);
    let busy = |m: &str| sum_metric(m, "loadgate_frontend_worker_busy", &[]);
    fe.wait_metrics("the engine busy", |m| busy(m) == 1.0).await;
    let served = engine.received().len();
    for _ in 0..3 {
        assert_eq!(fe.complete(MODEL).await.0, 529);
    }
    assert_eq!(engine.received().len(), served, "a shed request reaches no engine");
}
