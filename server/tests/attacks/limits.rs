//! Cheap memory: dp sizes, model names and worker ids past their limits are
//! refused, and what a flood registered is forgotten.

use std::time::{Duration, Instant};

use crate::common::{exclusive, register, shared, EventConn, FakeWorker, SECRET};
use crate::{pool, wait_models, CLOSE_WITHIN, MAX_RSS_MIB, MODEL};

/// Found 2: a 34-byte Register with dp_size 65536 cost 16 MiB of frontend
/// memory. Now a dp size over --max-dp-size is refused and the RSS does not
/// grow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_dp_size_is_refused() {
    let _box = exclusive().await;
    let (fe, _w) = pool(&[], &[]).await;
    let impostor = FakeWorker::start();
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
    let before = fe.mem();
    let mut conns = Vec::new();
    for i in 0..8 {
        let mut conn = EventConn::authenticated(fe.events, SECRET);
        let _ = conn.send(&register(600 + i, 1, 65_536, "dp-model", &impostor.addr.to_string()));
        conns.push(conn);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = fe.mem();
    let grown = after.rss_mib() - before.rss_mib();
    eprintln!(
        "8 Registers with dp_size 65536: VmRSS {:.1} -> {:.1} MiB ({grown:+.1} MiB)",
        before.rss_mib(),
        after.rss_mib()
    );
    assert!(grown < 16.0, "8 huge-dp Registers grew the frontend by {grown:.1} MiB");
    let (models, _) = fe.models().await;
    assert!(!models.contains(&"dp-model".to_owned()), "a dp_size of 65536 was registered");
    for conn in &mut conns {
        assert!(conn.closed_within(CLOSE_WITHIN), "huge dp size: connection left open");
    }
    assert!(fe.proc.wait_log("limit hit: --max-dp-size", Duration::from_secs(1)), "no limit log line");
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}

/// Found 2: models were never forgotten (3,000 registrations with distinct
/// 3 KB names left 3,000 models and 9 MB answers). Now names over
/// --max-name-len and models past --max-models are refused, the answers stay
/// small, and the flood's models are forgotten once their workers leave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_name_flood_is_bounded_and_forgotten() {
    let _box = shared().await;
    let (fe, _w) = pool(&["--max-models", "16"], &[]).await;
    let impostor = FakeWorker::start();
    let addr = impostor.addr.to_string();

    // Past --max-models: 40 distinct short names on 40 open connections.
    let mut held = Vec::new();
    for i in 0..40u64 {
        let mut conn = EventConn::authenticated(fe.events, SECRET);
        let _ = conn.send(&register(7000 + i, 1, 1, &format!("flood-{i:03}"), &addr));
        held.push(conn);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (models, bytes) = fe.models().await;
    eprintln!("40 models offered with --max-models 16: {} listed, /v1/models {bytes} bytes", models.len());
    assert!(models.len() <= 16, "{} models registered past --max-models 16", models.len());
    assert!(models.contains(&MODEL.to_owned()));
    let refused = held.iter_mut().map(|c| c.closed_within(Duration::from_millis(5))).filter(|&closed| closed).count();
    assert!(refused >= 40 - 15, "only {refused} of 40 Registers past the model limit were refused");
    assert!(fe.proc.wait_log("limit hit: --max-models", Duration::from_secs(1)), "no limit log line");
    drop(held);
    wait_models(&fe, &[MODEL], Duration::from_secs(5)).await;

    // Names over --max-name-len (256): 3,000 distinct 3 KB names, each on
    // its own authenticated connection, closed right after.
    let started = Instant::now();
    for i in 0..3000u64 {
        let mut conn = EventConn::authenticated(fe.events, SECRET);
        let name = format!("{i:05}-{}", "n".repeat(3000));
        let _ = conn.send(&register(10_000 + i, 1, 1, &name, &addr));
    }
    // And a long address.
    let mut long_addr = EventConn::authenticated(fe.events, SECRET);
    let _ = long_addr.send(&register(9_999, 1, 1, "short-name", &format!("127.0.0.1:1/{}", "a".repeat(1000))));
    eprintln!("3,000 Registers with 3 KB names sent in {:?}", started.elapsed());
    assert!(long_addr.closed_within(CLOSE_WITHIN), "an address over --max-name-len: connection left open");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (models, bytes) = fe.models().await;
    eprintln!("after the flood: {} models, /v1/models {bytes} bytes", models.len());
    assert!(bytes < 2048, "/v1/models is {bytes} bytes after a name flood ({} models)", models.len());
    let thresholds = fe
        .client
        .get(format!("{}/busy_threshold", fe.admin.as_deref().expect("admin listener")))
        .send()
        .await
        .expect("GET /busy_threshold")
        .text()
        .await
        .unwrap_or_default();
    eprintln!("/busy_threshold on the admin port: {} bytes", thresholds.len());
    assert!(thresholds.len() < 4096, "/busy_threshold is {} bytes after a name flood", thresholds.len());
    wait_models(&fe, &[MODEL], Duration::from_secs(5)).await;
    assert!(fe.proc.wait_log("limit hit: --max-name-len", Duration::from_secs(1)), "no limit log line");
    assert_eq!(impostor.requests(), 0);
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}

/// More worker ids than --max-workers, from authenticated connections: the
/// extra are refused, and the real worker still serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_flood_is_bounded() {
    let _box = shared().await;
    let (fe, _w) = pool(&["--max-workers", "4"], &[]).await;
    let impostor = FakeWorker::start();
    let mut conns: Vec<EventConn> = (0..10u64)
        .map(|i| {
            let mut conn = EventConn::authenticated(fe.events, SECRET);
            let _ = conn.send(&register(6000 + i, 1, 1, MODEL, &impostor.addr.to_string()));
            conn
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let workers = fe.workers().await.expect("/health");
    eprintln!("11 workers offered with --max-workers 4: {workers} registered");
    assert!(workers <= 4, "{workers} workers registered past --max-workers 4");
    let refused = conns.iter_mut().map(|c| c.closed_within(Duration::from_millis(5))).filter(|&c| c).count();
    assert!(refused >= 7, "only {refused} of 10 Registers past the worker limit were refused");
    assert!(fe.proc.wait_log("limit hit: --max-workers 4", Duration::from_secs(1)), "no limit log line");
    drop(conns);
    fe.wait_workers(1, Duration::from_secs(5)).await;
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}
