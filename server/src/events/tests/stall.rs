//! A frontend that stops reading holds up only its own connection: the
//! publisher's reports to the others keep flowing while its writes to the
//! stalled one block.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::*;

/// Ranks of the publishing worker: every report of all of them is a few
/// KiB, so the stalled connection's socket buffers fill within the first
/// probes.
const RANKS: u32 = 256;
/// How long the probes run: past the 1 s a blocked write may take (the
/// publisher then drops the stalled connection and makes it again).
const PROBING: Duration = Duration::from_millis(2500);
/// The bound on a probe's delay at the healthy frontend; typical values
/// are a few ms. With one thread writing to every frontend in turn, a
/// probe behind blocked writes to the stalled one waited the 1 s write
/// timeout and more (measured once: 2.1 s), so 400 ms tells the two apart
/// with a wide margin for a busy 2-core machine.
const BOUND: Duration = Duration::from_millis(400);

/// A frontend that accepts connections and never reads from them (its
/// receive buffer small, so a writer fills it soon), for at most `life`.
fn stalled_frontend(life: Duration) -> (String, std::thread::JoinHandle<()>, Arc<AtomicBool>) {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.bind(&"127.0.0.1:0".parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
    socket.listen(16).unwrap();
    let listener: std::net::TcpListener = socket.into();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let end = Instant::now() + life;
            let mut held = Vec::new();
            // Relaxed: a stop flag, no data published through it.
            while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                match listener.accept() {
                    Ok((stream, _)) => held.push(stream),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        })
    };
    (addr, thread, stop)
}

#[test]
fn a_frontend_that_stops_reading_does_not_delay_the_others() {
    let plane = Plane::start(None, PlaneLimits::default());
    let (stalled, acceptor, stop) = stalled_frontend(Duration::from_secs(20));
    let registration = Registration { dp_size: RANKS, ..registration(60) };
    // The stalled frontend first: a publisher writing in turn meets it
    // before the healthy one.
    let publisher =
        EventPublisher::start(vec![stalled, plane.addr()], registration, Duration::from_millis(20), None).unwrap();
    eventually("the registration", || plane.registered(60));
    let started = Instant::now();
    let (mut probes, mut worst) = (0u32, Duration::ZERO);
    while started.elapsed() < PROBING {
        probes += 1;
        let value = load(probes % 100);
        (0..RANKS).for_each(|rank| publisher.report(rank, value));
        let sent = Instant::now();
        // The last rank's frame is the last of the batch.
        while reported(&plane.monitor, 60, RANKS - 1) != Some(value) {
            assert!(sent.elapsed() < Duration::from_secs(5), "probe {probes} never arrived");
            std::thread::sleep(Duration::from_millis(1));
        }
        worst = worst.max(sent.elapsed());
    }
    eprintln!("{probes} probes, the slowest in {worst:?}");
    assert!(worst < BOUND, "a probe took {worst:?} to reach the healthy frontend");
    drop(publisher);
    // Relaxed: a stop flag.
    stop.store(true, Ordering::Relaxed);
    acceptor.join().unwrap();
}
