//! Fair reading (`--event-read-budget`): a Load flood on one event
//! connection does not delay another connection's Register.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use loadgate::wire::{self, Frame};
use loadgate::RankLoad;

use crate::common::{exclusive, register, EventConn, FakeWorker, Frontend, SECRET};
use crate::{pool, MAX_RSS_MIB, MODEL};

/// One connection floods Load frames (for its own worker) as fast as it can
/// write; another connection's Register must still take effect within a few
/// milliseconds (fair reading, --event-read-budget).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_flood_does_not_delay_another_register() {
    let _box = exclusive().await;
    let (fe, _w) = pool(&[], &[]).await;
    let impostor = FakeWorker::start();
    let mut conns = Vec::new();
    // The same measurement without a flood, for comparison.
    let mut quiet = Vec::new();
    for k in 0..5u64 {
        let (_, delay, conn) = timed_register(&fe, 850 + k, &impostor.addr.to_string()).await;
        quiet.push(delay.as_secs_f64() * 1e3);
        conns.push(conn);
    }
    let mut flooder = EventConn::authenticated(fe.events, SECRET);
    flooder.send(&register(800, 1, 1, "flood-model", &impostor.addr.to_string())).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let flood = {
        let (stop, sent) = (stop.clone(), sent.clone());
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(12);
            let mut seq = 0u64;
            let mut buf = BytesMut::new();
            // Acquire: pairs with the Release store below.
            while !stop.load(Ordering::Acquire) && Instant::now() < deadline {
                buf.clear();
                for _ in 0..1000 {
                    seq += 1;
                    let load =
                        RankLoad { active_decode_blocks: (seq % 7) as u32, kv_total_blocks: 8, ..Default::default() };
                    let frame = Frame::Load { worker: 800, incarnation: 1, rank: 0, seq, load };
                    wire::encode(&frame, &mut buf).unwrap();
                }
                if let Err(e) = flooder.send_raw(&buf) {
                    return (flooder, Some(e.to_string()));
                }
                // Relaxed: a progress counter.
                sent.fetch_add(buf.len() as u64, Ordering::Relaxed);
            }
            (flooder, None)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Relaxed: a progress counter.
    let flooding_at = sent.load(Ordering::Relaxed);
    let mut delays = Vec::new();
    let mut handshakes = Vec::new();
    for k in 0..10u64 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (handshake, delay, conn) = timed_register(&fe, 900 + k, &impostor.addr.to_string()).await;
        handshakes.push(handshake);
        delays.push(delay);
        conns.push(conn);
    }
    // Relaxed: a progress counter.
    let flooded = sent.load(Ordering::Relaxed) - flooding_at;
    // Release: the flood thread's Acquire load sees it.
    stop.store(true, Ordering::Release);
    let (flooder, flood_error) = flood.join().expect("flood thread");
    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    let delays_ms: Vec<f64> = delays.iter().map(ms).collect();
    let handshakes_ms: Vec<f64> = handshakes.iter().map(ms).collect();
    eprintln!(
        "during a Load flood ({:.1} MB written while measuring): Register took effect after {delays_ms:.1?} ms \
         (handshake {handshakes_ms:.1?} ms); without a flood: {quiet:.1?} ms",
        flooded as f64 / 1e6
    );
    assert!(flood_error.is_none(), "the flooding connection failed: {flood_error:?}");
    assert!(flooded > 1_000_000, "the flood did not flow ({flooded} bytes; {flooding_at} before measuring)");
    // "A few ms" on an idle box; the bounds leave room for a noisy 2-core
    // machine running the flood, the frontend and the poller at once (before
    // fair reading, the Register waited for the flood to end).
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let worst = delays_ms.iter().copied().fold(0.0, f64::max);
    assert!(median(&delays_ms) < 50.0, "a Register waited {:.1} ms (median) behind a Load flood", median(&delays_ms));
    assert!(worst < 250.0, "a Register waited {worst:.1} ms behind a Load flood");
    let worst_handshake = handshakes_ms.iter().copied().fold(0.0, f64::max);
    assert!(worst_handshake < 250.0, "a handshake waited {worst_handshake:.1} ms behind a Load flood");
    drop(flooder);
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}

/// Opens an authenticated connection, sends a Register for `id` and waits
/// (bounded, polling `/health`) until the frontend counts it. Returns the
/// handshake's time, the Register's time to effect, and the connection.
async fn timed_register(fe: &Frontend, id: u64, addr: &str) -> (Duration, Duration, EventConn) {
    let base = fe.workers().await.expect("/health");
    let started = Instant::now();
    let mut conn = EventConn::authenticated(fe.events, SECRET);
    let handshake = started.elapsed();
    let sent_at = Instant::now();
    conn.send(&register(id, 1, 1, &format!("fair-{id}"), addr)).unwrap();
    let deadline = sent_at + Duration::from_secs(8);
    while fe.workers().await != Some(base + 1) {
        assert!(Instant::now() < deadline, "a Register did not take effect within 8 s");
        // Short: this loop measures the delay (to a resolution of ~1 ms).
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    (handshake, sent_at.elapsed(), conn)
}
