//! Event connections: past `--max-event-connections` the extra are closed
//! at once and the rest at the handshake timeout.

use std::time::{Duration, Instant};

use loadgate::wire::{self, Frame};

use crate::common::{self, shared, worker, EventConn, Frontend, HANDSHAKE_TIMEOUT, SECRET};
use crate::{MAX_RSS_MIB, MODEL};

/// More unauthenticated connections than --max-event-connections: the extra
/// are closed at once, the rest at the handshake timeout, and a real worker
/// registers once they are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_connection_limit_closes_the_extra_and_a_worker_still_registers() {
    let _box = shared().await;
    let fe = Frontend::secured(&["--max-event-connections", "8"]);
    let started = Instant::now();
    let mut conns: Vec<EventConn> = (0..20).map(|_| EventConn::connect(fe.events).expect("connect")).collect();
    // One stalls mid-Proof (slow loris), the others send nothing.
    let proof = common::encoded(&Frame::Proof { nonce: [0; wire::NONCE_LEN], mac: [0; wire::TAG_LEN] });
    let _ = conns[0].send_raw(&proof[..3]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let closed_early: Vec<bool> = conns.iter_mut().map(|c| c.closed_within(Duration::from_millis(5))).collect();
    let early = closed_early.iter().filter(|&&c| c).count();
    eprintln!("20 idle connections with --max-event-connections 8: {early} closed at once");
    assert!(early >= 12, "only {early} of 20 connections closed past --max-event-connections 8");
    assert!(fe.proc.wait_log("limit hit: --max-event-connections 8", Duration::from_secs(1)), "no limit log line");
    // A real worker starts while the 8 are held.
    let _w = worker(Some(fe.events), MODEL, Some(SECRET), &[]);
    for (conn, closed) in conns.iter_mut().zip(&closed_early) {
        if !closed {
            let left = (HANDSHAKE_TIMEOUT + Duration::from_secs(1)).saturating_sub(started.elapsed());
            assert!(conn.closed_within(left), "an idle unauthenticated connection outlived the handshake timeout");
        }
    }
    eprintln!("the held connections were closed by {:?}", started.elapsed());
    drop(conns);
    fe.wait_workers(1, Duration::from_secs(8)).await;
    eprintln!("the real worker registered after {:?}", started.elapsed());
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}
