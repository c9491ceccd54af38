//! Ownership: a worker id belongs to the connection that registered it.

use std::time::Duration;

use super::*;

const SECRET: &str = "the event secret, 16+ bytes";

/// An authenticated connection that registered `worker`.
fn holder(plane: &Plane, worker: WorkerId, incarnation: u64, addr: &str) -> Peer {
    let mut peer = plane.peer();
    let (_, welcome) = peer.authenticate(&secrets(SECRET, None));
    assert!(welcome.is_some());
    let frame = Frame::Register { worker, incarnation, dp_size: 1, model: "m".into(), http_addr: addr.into() };
    peer.send(&frame).unwrap();
    eventually("registration", || plane.monitor.incarnation(worker) == Some(incarnation));
    peer
}

fn base_url(plane: &Plane, worker: WorkerId) -> String {
    plane.directory.get(worker).map(|a| a.base_url.to_string()).unwrap_or_default()
}

#[test]
fn a_live_id_cannot_be_hijacked() {
    let plane = Plane::start(Some(secrets(SECRET, None)), PlaneLimits::default());
    let mut owner = holder(&plane, 1, 1, "127.0.0.1:1001");
    // Another authenticated connection claims the id with another address,
    // then another incarnation: refused, the owner untouched.
    for incarnation in [1, 2] {
        let mut thief = plane.peer();
        thief.authenticate(&secrets(SECRET, None));
        let frame =
            Frame::Register { worker: 1, incarnation, dp_size: 1, model: "m".into(), http_addr: "6.6.6.6:1".into() };
        thief.send(&frame).unwrap();
        assert!(thief.closed_within(Duration::from_secs(5)), "the hijack is refused");
        assert_eq!(base_url(&plane, 1), "http://127.0.0.1:1001");
        assert_eq!(plane.monitor.incarnation(1), Some(1));
    }
    owner.send(&load_frame(1, 1, 1, 9)).unwrap();
    eventually("the owner's load still applies", || reported(&plane.monitor, 1, 0) == Some(load(9)));
    assert!(!owner.closed_within(Duration::from_millis(50)));
}

#[test]
fn a_reconnect_with_the_same_incarnation_keeps_its_slots() {
    let plane = Plane::start(Some(secrets(SECRET, None)), PlaneLimits::default());
    let mut first = holder(&plane, 2, 7, "127.0.0.1:1002");
    first.send(&load_frame(2, 7, 5, 3)).unwrap();
    eventually("the first report", || reported(&plane.monitor, 2, 0) == Some(load(3)));
    drop(first);
    let mut second = holder(&plane, 2, 7, "127.0.0.1:1002");
    assert_eq!(reported(&plane.monitor, 2, 0), Some(load(3)), "a reconnect keeps the slots");
    // The same seq again is stale within the incarnation: the slot was kept.
    second.send(&load_frame(2, 7, 5, 8)).unwrap();
    second.send(&load_frame(2, 7, 6, 4)).unwrap();
    eventually("the next report", || reported(&plane.monitor, 2, 0) == Some(load(4)));
    std::thread::sleep(GRACE * 3);
    assert!(plane.registered(2), "the reconnected worker outlives the old connection's grace");
}

#[test]
fn a_restart_with_a_new_incarnation_is_accepted_during_the_grace() {
    let plane = Plane::start(Some(secrets(SECRET, None)), PlaneLimits::default());
    let mut old = holder(&plane, 3, 1, "127.0.0.1:1003");
    old.send(&load_frame(3, 1, 1, 9)).unwrap();
    eventually("the old life's report", || reported(&plane.monitor, 3, 0) == Some(load(9)));
    drop(old); // crashes: its grace starts
    let _new = holder(&plane, 3, 2, "127.0.0.1:2003");
    assert_eq!(reported(&plane.monitor, 3, 0), None, "a restart resets the slots");
    assert_eq!(base_url(&plane, 3), "http://127.0.0.1:2003");
    std::thread::sleep(GRACE * 3);
    assert_eq!(plane.monitor.incarnation(3), Some(2), "the old life's grace does not remove the new one");
}

#[test]
fn a_new_life_waits_until_the_old_connection_closes() {
    // Without a secret (loopback): the same ownership rules.
    let plane = Plane::start(None, PlaneLimits::default());
    let mut old = plane.peer();
    old.send(&register_frame(7, 1)).unwrap();
    eventually("the old life", || plane.monitor.incarnation(7) == Some(1));
    let mut early = plane.peer();
    early.send(&register_frame(7, 2)).unwrap();
    assert!(early.closed_within(Duration::from_secs(5)), "refused while the old connection lives");
    assert_eq!(plane.monitor.incarnation(7), Some(1));
    drop(old);
    let mut new = plane.peer();
    new.send(&register_frame(7, 2)).unwrap();
    eventually("the new life", || plane.monitor.incarnation(7) == Some(2));
    // The new life leaves with its own connection, after the grace.
    drop(new);
    eventually("deregistered after the grace", || !plane.registered(7) && plane.directory.get(7).is_none());
}

#[test]
fn spoofed_load_and_deregister_close_the_spoofer_only() {
    let plane = Plane::start(Some(secrets(SECRET, None)), PlaneLimits::default());
    let mut owner = holder(&plane, 4, 1, "127.0.0.1:1004");
    owner.send(&load_frame(4, 1, 1, 2)).unwrap();
    eventually("the owner's report", || reported(&plane.monitor, 4, 0) == Some(load(2)));
    // A connection that registered another worker spoofs Load; one that
    // registered nothing spoofs Deregister; a third spoofs with the owner's
    // worker id but another incarnation.
    let mut spoofer = holder(&plane, 5, 1, "127.0.0.1:1005");
    spoofer.send(&load_frame(4, 1, u64::MAX, 1000)).unwrap();
    assert!(spoofer.closed_within(Duration::from_secs(5)), "a spoofed Load closes the spoofer");
    let mut anonymous = plane.peer();
    anonymous.authenticate(&secrets(SECRET, None));
    anonymous.send(&Frame::Deregister { worker: 4, incarnation: 1 }).unwrap();
    assert!(anonymous.closed_within(Duration::from_secs(5)), "a spoofed Deregister closes the spoofer");
    assert_eq!(reported(&plane.monitor, 4, 0), Some(load(2)), "the owner's load untouched");
    assert!(plane.registered(4));
    // The owner goes on: its next report applies (seq was not advanced).
    owner.send(&load_frame(4, 1, 2, 3)).unwrap();
    eventually("the owner's next report", || reported(&plane.monitor, 4, 0) == Some(load(3)));
    std::thread::sleep(GRACE * 2);
    assert!(plane.registered(4));
    assert!(!owner.closed_within(Duration::from_millis(20)));
}

#[test]
fn an_id_registered_by_worker_url_is_refused() {
    let plane = Plane::start(Some(secrets(SECRET, None)), PlaneLimits::default());
    plane.monitor.register(6, "m", 1, 0).unwrap();
    plane.directory.insert_static(6, "127.0.0.1:1006", 1);
    let mut peer = plane.peer();
    peer.authenticate(&secrets(SECRET, None));
    peer.send(&register_frame(6, 1)).unwrap();
    assert!(peer.closed_within(Duration::from_secs(5)));
    assert_eq!(plane.monitor.incarnation(6), Some(0));
    assert_eq!(base_url(&plane, 6), "http://127.0.0.1:1006");
}

/// A plane whose workers go silent after `silence` and whose closed
/// connections' ids wait a minute (longer than any test) for a new holder.
fn long_grace_plane(silence: Duration) -> Plane {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    // Idle connections stay open: only the tests close them.
    let limits = PlaneLimits { event_idle_timeout: Duration::from_secs(60), ..PlaneLimits::default() };
    let timing = (silence, Duration::from_secs(60));
    Plane::with_grace(listener, MonitorConfig::default(), Some(secrets(SECRET, None)), limits, timing)
}

/// What the NATS plane does when it registers `incarnation` of `worker`
/// at `addr` (`nats::plane::workers`): the monitor, then the directory.
fn registered_elsewhere(plane: &Plane, worker: WorkerId, incarnation: u64, addr: &str) {
    plane.monitor.register(worker, "m", 1, incarnation).unwrap();
    assert!(plane.directory.insert_again(worker, addr, 1, false));
    plane.directory.sync(worker);
    assert!(!plane.directory.out_of_routing().contains(&worker), "the other plane's life is in routing");
}

/// Found by a review: an id whose connection closed stayed this plane's for
/// its whole grace, even once another plane (NATS) had registered a new
/// life of it, heard and in routing: any connection's Register then took
/// that live worker's id, and its requests, which the check of ids another
/// plane holds refuses otherwise (docs/deployment.md, *Trust model*).
#[test]
fn an_orphaned_id_another_plane_registered_since_is_not_taken_from_it() {
    let plane = long_grace_plane(Duration::from_secs(60));
    drop(holder(&plane, 8, 1, "127.0.0.1:1008"));
    eventually("the closed connection's worker out of routing", || plane.directory.out_of_routing().contains(&8));
    registered_elsewhere(&plane, 8, 2, "127.0.0.1:2008");
    // Another life (a thief's, or the old one's again), within the grace.
    for incarnation in [3, 1] {
        let mut thief = plane.peer();
        thief.authenticate(&secrets(SECRET, None));
        let frame =
            Frame::Register { worker: 8, incarnation, dp_size: 1, model: "m".into(), http_addr: "6.6.6.6:1".into() };
        thief.send(&frame).unwrap();
        assert!(thief.closed_within(Duration::from_secs(5)), "incarnation {incarnation}: the takeover is refused");
        assert_eq!(plane.monitor.incarnation(8), Some(2), "incarnation {incarnation}");
        assert_eq!(base_url(&plane, 8), "http://127.0.0.1:2008", "incarnation {incarnation}");
    }
}

/// Found by a review: a connection whose worker another plane (NATS) had
/// registered anew since (its own life silent, so the other plane could)
/// still marked the worker silent when it closed: the other plane's live
/// worker left routing, and nothing of that plane brought it back (it
/// clears only the silence it set itself).
#[test]
fn a_connection_closing_leaves_another_planes_life_of_its_worker_in_routing() {
    let plane = long_grace_plane(Duration::from_millis(50));
    let old = holder(&plane, 9, 1, "127.0.0.1:1009");
    eventually("the silent worker out of routing", || plane.directory.out_of_routing().contains(&9));
    registered_elsewhere(&plane, 9, 2, "127.0.0.1:2009");
    drop(old);
    // The plane serves the old connection's end before a Register of a
    // connection opened after it.
    let _later = holder(&plane, 10, 1, "127.0.0.1:1010");
    assert!(!plane.directory.out_of_routing().contains(&9), "the other plane's live worker stays in routing");
    assert_eq!(plane.monitor.incarnation(9), Some(2));
}
