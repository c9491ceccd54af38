//! The directory's flags, their counts and their publication to the monitor.

use super::*;

/// A directory over a monitor where workers 1 to 7 serve model `m`.
fn directory() -> (Arc<WorkerDirectory>, Arc<WorkerMonitor>) {
    let monitor = Arc::new(WorkerMonitor::new(Default::default()).unwrap());
    for worker in 1..=7 {
        monitor.register(worker, "m", 1, 0).unwrap();
    }
    (Arc::new(WorkerDirectory::new(monitor.clone())), monitor)
}

#[test]
fn addresses_become_urls() {
    let (d, _) = directory();
    d.insert(1, "127.0.0.1:80", 2);
    d.insert(2, "http://127.0.0.1:81/", 1);
    assert_eq!(d.get(1).unwrap().base_url.as_ref(), "http://127.0.0.1:80");
    assert_eq!(d.get(2).unwrap().base_url.as_ref(), "http://127.0.0.1:81");
    assert_eq!(d.list().len(), 2);
    assert!(d.remove(1));
    assert!(!d.remove(1));
    assert_eq!(d.get(1), None);
}

#[test]
fn static_workers_are_not_replaced_by_the_event_plane() {
    let (d, _) = directory();
    d.insert_static(3, "127.0.0.1:80", 1);
    assert!(d.is_static(3));
    assert!(!d.insert(3, "127.0.0.1:99", 1), "an event registration may not take a static id");
    assert_eq!(d.get(3).unwrap().base_url.as_ref(), "http://127.0.0.1:80");
    assert!(d.insert(4, "127.0.0.1:81", 1));
    assert!(!d.is_static(4));
    assert!(d.contains(4));
    assert_eq!(d.len(), 2);
}

#[test]
fn engines_are_static_but_not_health_checked() {
    let (d, _) = directory();
    d.insert_static(1, "127.0.0.1:80", 1);
    d.insert_engine(2, "http://127.0.0.1:8080", 2, true);
    assert!(d.is_static(2), "the event plane may not take an engine's id");
    assert!(!d.insert(2, "127.0.0.1:99", 1));
    assert!(d.get(2).unwrap().engine);
    assert!(!d.get(1).unwrap().engine);
    assert!(d.get(2).unwrap().assembles);
    assert!(!d.get(1).unwrap().assembles);
    let checked: Vec<WorkerId> = d.static_workers().into_iter().map(|(id, _)| id).collect();
    assert_eq!(checked, [1], "the --worker health check skips engines");
    assert!(d.set_silent(2, true));
    assert_eq!(d.out_of_routing(), vec![2]);
}

#[test]
fn silent_and_quarantined_workers_are_out_of_routing_until_cleared() {
    let (d, _) = directory();
    d.insert(1, "127.0.0.1:80", 1);
    d.insert(2, "127.0.0.1:81", 1);
    assert!(d.out_of_routing().is_empty());
    assert!(d.set_silent(1, true));
    assert!(!d.set_silent(1, true), "counted once");
    assert_eq!(d.out_of_routing(), vec![1]);
    assert!(d.set_silent(1, false));
    assert!(d.out_of_routing().is_empty());
    d.quarantine(2);
    assert_eq!(d.out_of_routing(), vec![2]);
    assert_eq!(d.liveness_totals(), (1, 1));
    // Removing a silent worker does not leave the count behind.
    d.set_silent(1, true);
    d.remove(1);
    assert!(!d.set_silent(7, true), "unknown worker");
    assert_eq!(d.out_of_routing(), vec![2]);
}

#[test]
fn a_worker_refusing_proofs_leaves_routing_for_longer_each_time_until_it_answers() {
    let (directory, _) = directory();
    directory.insert(1, "127.0.0.1:1", 1);
    let outs: Vec<_> = (0..7).map(|_| directory.proof_refused(1).unwrap()).collect();
    let secs: Vec<u64> = outs.iter().map(Duration::as_secs).collect();
    assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30]);
    assert_eq!(directory.out_of_routing(), [1]);
    // It answers: the next refusal starts again at 1 s.
    directory.proof_accepted(1);
    assert_eq!(directory.proof_refused(1), Some(PROOF_REFUSAL_QUARANTINE));
    assert_eq!(directory.proof_refused(2), None, "not registered");
    // Forgetting the worker forgets its refusals.
    directory.remove(1);
    assert_eq!(directory.refusing_proofs.load(Ordering::Relaxed), 0);
}

#[test]
fn the_same_incarnation_registered_again_keeps_its_quarantine_and_refusals() {
    let (d, monitor) = directory();
    d.insert(1, "127.0.0.1:80", 1);
    d.insert(2, "127.0.0.1:81", 1);
    d.quarantine(1);
    assert_eq!(d.proof_refused(2), Some(PROOF_REFUSAL_QUARANTINE));
    // Its event connection made again: the same address, still out.
    assert!(d.insert_again(1, "127.0.0.1:80", 1, true));
    assert!(d.insert_again(2, "127.0.0.1:81", 1, true));
    let mut out = d.out_of_routing();
    out.sort_unstable();
    assert_eq!(out, [1, 2]);
    assert!(monitor.is_out_of_routing(1) && monitor.is_out_of_routing(2));
    assert_eq!(d.proof_refused(2), Some(2 * PROOF_REFUSAL_QUARANTINE), "the refusals in a row go on");
    assert_eq!(d.refusing_proofs.load(Ordering::Relaxed), 1, "counted once");
    // A new address (or a new incarnation: `insert`) starts afresh.
    assert!(d.insert_again(1, "127.0.0.1:90", 1, true));
    assert!(d.insert(2, "127.0.0.1:81", 1));
    assert!(d.out_of_routing().is_empty());
    assert!(!monitor.is_out_of_routing(1) && !monitor.is_out_of_routing(2));
    assert_eq!(d.refusing_proofs.load(Ordering::Relaxed), 0);
    assert_eq!(d.proof_refused(2), Some(PROOF_REFUSAL_QUARANTINE));
    // A static worker's id is still refused.
    d.insert_static(3, "127.0.0.1:82", 1);
    assert!(!d.insert_again(3, "127.0.0.1:82", 1, true));
}

#[test]
fn out_of_routing_is_published_to_the_monitor_and_forgotten_with_the_entry() {
    let (d, monitor) = directory();
    d.insert(1, "127.0.0.1:80", 1);
    d.insert(2, "127.0.0.1:81", 1);
    assert!(d.set_silent(1, true));
    assert!(monitor.is_out_of_routing(1) && !monitor.is_out_of_routing(2));
    assert!(d.set_silent(1, false));
    assert!(!monitor.is_out_of_routing(1));
    d.quarantine(2);
    assert!(monitor.is_out_of_routing(2), "a quarantine takes effect at once");
    // A registration that comes back (a reconnect) starts in routing.
    d.set_silent(1, true);
    d.insert(1, "127.0.0.1:80", 1);
    assert!(!monitor.is_out_of_routing(1));
    d.remove(2);
    assert!(!monitor.is_out_of_routing(2), "a removed entry keeps no worker out");
}

/// Margins: the quarantine is 1 s; its end is published once the
/// directory's clock passes the deadline (so never earlier than 1 s
/// less a millisecond of rounding), and a busy 2-core machine gets 5 s
/// to wake the task.
#[tokio::test]
async fn a_quarantine_ends_by_itself() {
    let (d, monitor) = directory();
    d.insert(3, "127.0.0.1:80", 1);
    tokio::spawn(d.expiry());
    let started = Instant::now();
    d.quarantine(3);
    assert!(monitor.is_out_of_routing(3));
    while monitor.is_out_of_routing(3) {
        assert!(started.elapsed() < Duration::from_secs(5), "still quarantined after 5 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(started.elapsed() >= UNREACHABLE_QUARANTINE - Duration::from_millis(2), "{:?}", started.elapsed());
    assert!(d.out_of_routing().is_empty());
}
