//! Fair reading: a connection flooding Load frames as fast as it can does
//! not delay another connection's Register by more than a few ms.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::*;

/// The bound asserted on the delay of a Register behind a flood; typical
/// values (printed) are a few ms. It was 50 ms, and a fresh-clone CI run
/// with every unit test running beside this one measured 61 ms once: the
/// test's thread, not the plane, waited for a core. An unfair reader (one
/// that drains the flooding connection before the next) holds a Register
/// for the whole flood, past the 5 s the test waits (checked once with an
/// unbounded read budget: "never registered behind the flood"), so 250 ms
/// still tells the two apart.
const BOUND: Duration = Duration::from_millis(250);
const SAMPLES: u64 = 10;

#[test]
fn a_load_flood_does_not_delay_another_register() {
    let plane = Plane::start(None, PlaneLimits::default());
    let mut flooder = plane.peer();
    flooder.send(&register_frame(1, 1)).unwrap();
    eventually("the flooder's registration", || plane.registered(1));
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let mut stream = flooder.stream.try_clone().unwrap();
    let flood = {
        let (stop, sent) = (stop.clone(), sent.clone());
        std::thread::spawn(move || {
            let mut seq = 0u64;
            let mut buf = BytesMut::new();
            // Relaxed: a stop flag, no data published through it.
            while !stop.load(Ordering::Relaxed) {
                buf.clear();
                for _ in 0..1024 {
                    seq += 1;
                    wire::encode(&load_frame(1, 1, seq, (seq % 100) as u32), &mut buf).unwrap();
                }
                if stream.write_all(&buf).is_err() {
                    break;
                }
                // Relaxed: a counter read once after the join.
                sent.fetch_add(buf.len() as u64, Ordering::Relaxed);
            }
        })
    };
    // Let the flood fill the socket buffers first.
    std::thread::sleep(Duration::from_millis(100));
    let flood_start = Instant::now();
    let mut delays = Vec::new();
    let mut peers = Vec::new();
    for worker in 100..100 + SAMPLES {
        let mut peer = plane.peer();
        let start = Instant::now();
        peer.send(&register_frame(worker, 1)).unwrap();
        while !plane.registered(worker) {
            assert!(start.elapsed() < Duration::from_secs(5), "worker {worker} never registered behind the flood");
            std::thread::yield_now();
        }
        delays.push(start.elapsed());
        peers.push(peer);
        std::thread::sleep(Duration::from_millis(5));
    }
    let flood_time = flood_start.elapsed();
    // Relaxed: see above.
    stop.store(true, Ordering::Relaxed);
    let before = sent.load(Ordering::Relaxed);
    drop(flooder);
    flood.join().unwrap();
    assert!(plane.registered(1), "the flooder was served, not closed");
    delays.sort();
    let mb_per_s = before as f64 / 1e6 / (flood_time + Duration::from_millis(100)).as_secs_f64();
    eprintln!(
        "fairness: Register delay behind a Load flood over {SAMPLES} samples: min {:?}, median {:?}, max {:?} \
         (flood ~{mb_per_s:.0} MB/s sent)",
        delays[0],
        delays[delays.len() / 2],
        delays[delays.len() - 1]
    );
    assert!(delays[delays.len() - 1] < BOUND, "a Register waited {:?} behind a flood", delays[delays.len() - 1]);
}
