//! An engine restarted with another model on the same address.

use super::*;

/// The engine stops answering, then comes back listing another model: the
/// frontend keeps it out of routing (a request for the model it was
/// registered with would be answered by the new model) and says why; once
/// it lists the model again, it is back. An engine named with `model=` is
/// never listed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_back_with_another_model_stays_out_until_it_lists_its_model_again() {
    let _box = common::shared().await;
    let engine = FakeEngine::start(Kind::LlamaCpp, &[MODEL]);
    let fe = frontend(
        &[engine.spec(None)],
        &["--engine-scrape-interval-ms", "20", "--engine-scrape-timeout-ms", "200", "--engine-scrape-failures", "3"],
        &[],
    );
    let out = |m: &str| sum_metric(m, "loadgate_frontend_workers_out_of_routing", &[]);
    assert_eq!(fe.complete(MODEL).await.0, 200);
    let lists = FakeEngine::count(&engine.shared.model_lists);
    engine.wait_scrapes(10).await;
    assert_eq!(FakeEngine::count(&engine.shared.model_lists), lists, "an engine that answers is not listed again");

    *engine.shared.models.lock().unwrap() = vec!["another-model".to_owned()];
    engine.set(|l| l.fail = true);
    fe.wait_metrics("the engine out of routing", |m| out(m) == 1.0).await;
    engine.set(|l| l.fail = false);
    assert!(fe.proc.wait_log("engine came back without models it was registered with", SETTLE), "{}", fe.proc.stderr());
    // Scraped well for a while (at least 25 scrapes, 20 ms apart), still out.
    engine.wait_scrapes(25).await;
    assert_eq!(out(&fe.metrics().await), 1.0, "back in routing serving another model");
    assert_ne!(fe.complete(MODEL).await.0, 200);

    *engine.shared.models.lock().unwrap() = vec![MODEL.to_owned()];
    fe.wait_metrics("the engine back", |m| out(m) == 0.0).await;
    assert_eq!(fe.complete(MODEL).await.0, 200);
}

/// With `model=` the operator named the model: `/v1/models` is never read,
/// not even after the engine was out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_named_with_model_is_never_listed_again() {
    let _box = common::shared().await;
    let engine = FakeEngine::start(Kind::LlamaCpp, &[MODEL]);
    let fe = frontend(
        &[engine.spec(Some(MODEL))],
        &["--engine-scrape-interval-ms", "20", "--engine-scrape-timeout-ms", "200", "--engine-scrape-failures", "3"],
        &[],
    );
    let out = |m: &str| sum_metric(m, "loadgate_frontend_workers_out_of_routing", &[]);
    engine.set(|l| l.fail = true);
    fe.wait_metrics("the engine out of routing", |m| out(m) == 1.0).await;
    engine.set(|l| l.fail = false);
    fe.wait_metrics("the engine back", |m| out(m) == 0.0).await;
    assert_eq!(FakeEngine::count(&engine.shared.model_lists), 0);
}
