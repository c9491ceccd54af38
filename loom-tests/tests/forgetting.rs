//! loom: model forgetting. A model that is not kept is forgotten when its
//! last worker leaves: the monitor stores a registry without it, then
//! retires its state. A router that cached the old state finds that out
//! only when a route finds no instance, and then looks the model up again.
//!
//! - A route racing the model's forgetting and return never answers a
//!   worker of the old state once the forgetting is over, answers the new
//!   worker once it is registered, and every router and handle made before
//!   routes to the new worker afterwards.
//! - A threshold change racing the model's last worker leaving either keeps
//!   the model with its thresholds or fails with an unknown model: never a
//!   successful change on a forgotten model, never a listed model without
//!   the thresholds that were set.
//! - `add_model` racing the last worker's departure always leaves the model
//!   listed and kept.
//! - A load report racing the last worker's departure never brings the old
//!   worker back into the retired state's view (which must stay empty, as
//!   routers look the model up again only when they find no instance).
//!
//! Each model also counts, outside the model, which outcomes its executions
//! reached, and requires every allowed one: the racy windows are real and
//! explored, not just permitted.
//!
//! What loom cannot see here: under loom the registry, the views and the
//! routers' maps are mutex stand-ins for arc-swap (see `src/sync.rs`), so
//! the happens-before a router needs from `retire`'s Release to its own
//! registry load comes from those mutexes too; the Release/Acquire pair on
//! `retired` is checked by reasoning, not by these models.
#![cfg(loom)]

use std::sync::atomic::{AtomicUsize as Counter, Ordering as CounterOrdering};
use std::sync::Arc;

use loadgate::{
    monitor::{Applied, ApplyError, Publisher, Registered, SetThresholdsError},
    BusyThresholds, LoadReport, LocalRouter, ModelRouter, MonitorConfig, Policy, RankLoad, RouteError, WorkerId,
    WorkerMonitor, WorkerRouter,
};
use loadgate_loom_tests::run_model_with;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

const MODEL: &str = "m";
/// The old state's only worker, and the worker of the state that replaces it.
const OLD: WorkerId = 1;
const NEW: WorkerId = 2;

/// A monitor on a mock clock (default thresholds: none, so nothing is busy)
/// with worker [`OLD`] serving [`MODEL`], which is not kept.
fn monitor() -> Arc<WorkerMonitor> {
    let (clock, _mock) = quanta::Clock::mock();
    let monitor = WorkerMonitor::with_clock(MonitorConfig::default(), clock).unwrap();
    assert_eq!(monitor.register(OLD, MODEL, 1, 0), Ok(Registered::New));
    Arc::new(monitor)
}

/// A round-robin router that has routed [`MODEL`] (so caches its current
/// state), a handle and a thread-local handle made from it.
fn routers(monitor: &Arc<WorkerMonitor>) -> (WorkerRouter, ModelRouter, LocalRouter) {
    let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
    assert_eq!(router.route(MODEL, &[]), Ok(OLD));
    let handle = router.model(MODEL).unwrap();
    let mut local = handle.local();
    assert_eq!(local.route(&[]), Ok(OLD));
    (router, handle, local)
}

// Thread A's progress, published with Release and read with Acquire, so "B
// read phase p before its route" means "the route started after A reached
// p" (happens-before, as any caller that learns of a return would have).
const BEFORE: usize = 0;
const DEREGISTERING: usize = 1;
const FORGOTTEN: usize = 2; // deregister returned: m is gone, its state retired
const BACK: usize = 3; // register of NEW returned

/// Thread A of the route models: deregisters [`OLD`] (the last worker of
/// [`MODEL`], so the model is forgotten), then registers [`NEW`] for it,
/// publishing each phase to `phase`.
fn forget_and_return(monitor: &Arc<WorkerMonitor>, phase: &Arc<AtomicUsize>) -> thread::JoinHandle<()> {
    let (monitor, phase) = (monitor.clone(), phase.clone());
    thread::spawn(move || {
        phase.store(DEREGISTERING, Ordering::Release);
        assert!(monitor.deregister(OLD));
        phase.store(FORGOTTEN, Ordering::Release);
        assert_eq!(monitor.register(NEW, MODEL, 1, 0), Ok(Registered::New));
        phase.store(BACK, Ordering::Release);
    })
}

/// What a route may answer, given the phases read just before (`p0`) and
/// just after (`p1`) it; panics on anything else. Returns the outcome's
/// index for the coverage counters.
fn check_route(kind: &str, p0: usize, p1: usize, routed: Result<WorkerId, RouteError>) -> usize {
    let ok = match routed {
        // The old worker only from a route that began before the forgetting
        // was over.
        Ok(OLD) => p0 < FORGOTTEN,
        // The new worker only once its register has begun.
        Ok(NEW) => p1 >= FORGOTTEN,
        // No instance: only while the old state is emptied but not yet
        // retired (inside deregister).
        Err(RouteError::Unavailable) => p1 >= DEREGISTERING && p0 < FORGOTTEN,
        // Unknown: only while m is gone (from inside deregister until the
        // register of NEW returned).
        Err(RouteError::UnknownModel) => p1 >= DEREGISTERING && p0 < BACK,
        _ => false,
    };
    assert!(ok, "{kind} route answered {routed:?} between phases {p0} and {p1}");
    match routed {
        Ok(OLD) => 0,
        Ok(NEW) => 1,
        Err(RouteError::Unavailable) => 2,
        _ => 3,
    }
}

const OUTCOMES: [&str; 4] = ["old worker", "new worker", "unavailable", "unknown model"];

/// Whether the coverage requirements apply: every outcome they ask for needs
/// at least two preemptions, so a `LOOM_MAX_PREEMPTIONS` below 2 (a quick
/// run) checks the claims but not the coverage.
fn coverage_required(name: &str) -> bool {
    let bound = loom::model::Builder::new().preemption_bound;
    let required = bound.is_none_or(|b| b >= 2);
    if !required {
        eprintln!("  {name}: preemption bound {bound:?} < 2, coverage not required");
    }
    required
}

/// Counts outcomes across executions (plain std counters, outside the model).
struct Coverage([Counter; 4]);

impl Coverage {
    const fn new() -> Self {
        Coverage([Counter::new(0), Counter::new(0), Counter::new(0), Counter::new(0)])
    }
    fn seen(&self, outcome: usize) {
        self.0[outcome].fetch_add(1, CounterOrdering::Relaxed);
    }
    /// Prints the counts and requires each outcome listed in `required`.
    fn require(&self, name: &str, required: &[usize]) {
        let counts: Vec<usize> = self.0.iter().map(|c| c.load(CounterOrdering::Relaxed)).collect();
        let shown: Vec<String> = OUTCOMES.iter().zip(&counts).map(|(o, c)| format!("{o}: {c}")).collect();
        eprintln!("  {name}: {}", shown.join(", "));
        if !coverage_required(name) {
            return;
        }
        for &r in required {
            assert!(counts[r] > 0, "{name}: no execution reached outcome '{}'", OUTCOMES[r]);
        }
    }
}

/// The route models' preemption bound: with two threads and these few
/// operations it already explores every execution (the same count as a
/// bound of 100), in a few seconds.
const EXHAUSTIVE: usize = 16;

/// Every outcome of [`check_route`].
const ALL: [usize; 4] = [0, 1, 2, 3];

/// A: the last worker of m leaves (m forgotten, its state retired) and a
/// worker registers m again (a new state). B: a router that cached the old
/// state routes m through the router, then through its thread-local handle.
/// Afterwards the router, a handle made before and the local handle all
/// route to the new worker.
#[test]
fn a_route_racing_forget_and_return_never_answers_a_stale_worker() {
    static ROUTER: Coverage = Coverage::new();
    static LOCAL: Coverage = Coverage::new();
    run_model_with("forgetting/a_route_racing_forget_and_return_never_answers_a_stale_worker", EXHAUSTIVE, || {
        let monitor = monitor();
        let (router, handle, mut local) = routers(&monitor);
        let phase = Arc::new(AtomicUsize::new(BEFORE));
        let churn = forget_and_return(&monitor, &phase);

        let p0 = phase.load(Ordering::Acquire);
        let routed = router.route(MODEL, &[]);
        let p1 = phase.load(Ordering::Acquire);
        ROUTER.seen(check_route("router", p0, p1, routed));
        let routed = local.route(&[]);
        let p2 = phase.load(Ordering::Acquire);
        LOCAL.seen(check_route("local", p1, p2, routed));

        churn.join().unwrap();
        assert_eq!(monitor.models(), [MODEL]);
        assert_eq!(router.route(MODEL, &[]), Ok(NEW), "the router still routes the old state");
        assert_eq!(handle.route(&[]), Ok(NEW), "a handle made before still routes the old state");
        assert_eq!(local.route(&[]), Ok(NEW), "a local handle made before still routes the old state");
        assert_eq!(router.model(MODEL).unwrap().route(&[]), Ok(NEW));
    });
    ROUTER.require("router route", &ALL);
    LOCAL.require("local route", &ALL);
}

/// As above with B routing through the handle made before (the
/// `ModelRouter` path) and then a second handle from the router.
#[test]
fn a_handle_racing_forget_and_return_never_answers_a_stale_worker() {
    static HANDLE: Coverage = Coverage::new();
    run_model_with("forgetting/a_handle_racing_forget_and_return_never_answers_a_stale_worker", EXHAUSTIVE, || {
        let monitor = monitor();
        let (router, handle, _) = routers(&monitor);
        let phase = Arc::new(AtomicUsize::new(BEFORE));
        let churn = forget_and_return(&monitor, &phase);

        let p0 = phase.load(Ordering::Acquire);
        let routed = handle.route(&[]);
        let p1 = phase.load(Ordering::Acquire);
        HANDLE.seen(check_route("handle", p0, p1, routed));

        churn.join().unwrap();
        assert_eq!(handle.route(&[]), Ok(NEW), "a handle made before still routes the old state");
        assert_eq!(router.route(MODEL, &[]), Ok(NEW), "the router still routes the old state");
    });
    HANDLE.require("handle route", &ALL);
}

/// How the model's last worker leaves.
#[derive(Clone, Copy)]
enum Leave {
    Deregister,
    /// A restart of the worker into another model (the register path).
    RestartElsewhere,
}

/// A threshold change on m races the departure of m's last worker (B sets,
/// A leaves). Either the change succeeded and m is kept, listed, with the
/// thresholds, routing as unavailable (its state not retired), and a worker
/// that registers m again joins it under those thresholds; or the change
/// failed with an unknown model and m is gone, and a worker that registers
/// m again starts it afresh with the defaults. Routers made before route to
/// that worker either way.
///
/// `outcomes` counts (kept, refused) across executions: the test's own.
fn threshold_change_races_the_last_worker_leaving(
    name: &str,
    leave: Leave,
    by_edit: bool,
    outcomes: &'static [Counter; 2],
) {
    let [kept_count, refused_count] = outcomes;
    run_model_with(name, 4, move || {
        let monitor = monitor();
        let (router, _, mut local) = routers(&monitor);
        let leaver = {
            let monitor = monitor.clone();
            thread::spawn(move || match leave {
                Leave::Deregister => assert!(monitor.deregister(OLD)),
                Leave::RestartElsewhere => assert_eq!(monitor.register(OLD, "other", 1, 1), Ok(Registered::Restarted)),
            })
        };
        let set = if by_edit {
            monitor.update_thresholds(MODEL, |t| t.active_decode_blocks_threshold = Some(0.5))
        } else {
            monitor.set_thresholds(MODEL, decode(0.5))
        };
        leaver.join().unwrap();

        let others: &[&str] = match leave {
            Leave::Deregister => &[],
            Leave::RestartElsewhere => &["other"],
        };
        let kept = match set {
            Ok(thresholds) => {
                assert_eq!(thresholds.decode_ppb(), Some(HALF));
                assert!(monitor.has_model(MODEL), "the change succeeded on a forgotten model");
                assert_eq!(monitor.thresholds(MODEL).and_then(|t| t.decode_ppb()), Some(HALF), "threshold lost");
                let mut listed = vec![MODEL];
                listed.extend_from_slice(others);
                listed.sort_unstable();
                assert_eq!(monitor.models(), listed);
                // Kept, not retired: the cached state stands, with no instance.
                assert_eq!(router.route(MODEL, &[]), Err(RouteError::Unavailable));
                assert_eq!(local.route(&[]), Err(RouteError::Unavailable));
                kept_count.fetch_add(1, CounterOrdering::Relaxed);
                true
            }
            Err(SetThresholdsError::UnknownModel(model)) => {
                assert_eq!(model, MODEL);
                assert!(!monitor.has_model(MODEL), "the change was refused on a listed model");
                assert!(monitor.thresholds(MODEL).is_none());
                assert_eq!(monitor.models(), others);
                assert_eq!(router.route(MODEL, &[]), Err(RouteError::UnknownModel));
                assert_eq!(local.route(&[]), Err(RouteError::UnknownModel));
                refused_count.fetch_add(1, CounterOrdering::Relaxed);
                false
            }
            Err(other) => panic!("unexpected {other:?}"),
        };

        // m comes back: kept, it has the thresholds; forgotten, the defaults.
        assert_eq!(monitor.register(NEW, MODEL, 1, 0), Ok(Registered::New));
        let expected = if kept { Some(HALF) } else { None };
        assert_eq!(monitor.thresholds(MODEL).and_then(|t| t.decode_ppb()), expected);
        assert_eq!(router.route(MODEL, &[]), Ok(NEW));
        assert_eq!(local.route(&[]), Ok(NEW));
    });
    let (kept, refused) = (kept_count.load(CounterOrdering::Relaxed), refused_count.load(CounterOrdering::Relaxed));
    eprintln!("  {name}: kept {kept}, refused {refused}");
    if !coverage_required(name) {
        return;
    }
    assert!(kept > 0 && refused > 0, "{name}: both orders must be explored (kept {kept}, refused {refused})");
}

/// 0.5 in parts per billion.
const HALF: u64 = 500_000_000;

fn decode(threshold: f64) -> BusyThresholds {
    BusyThresholds { active_decode_blocks_threshold: Some(threshold), ..Default::default() }
}

#[test]
fn set_thresholds_races_the_last_deregister() {
    static OUTCOMES: [Counter; 2] = [Counter::new(0), Counter::new(0)];
    threshold_change_races_the_last_worker_leaving(
        "forgetting/set_thresholds_races_the_last_deregister",
        Leave::Deregister,
        false,
        &OUTCOMES,
    );
}

#[test]
fn update_thresholds_races_a_restart_into_another_model() {
    static OUTCOMES: [Counter; 2] = [Counter::new(0), Counter::new(0)];
    threshold_change_races_the_last_worker_leaving(
        "forgetting/update_thresholds_races_a_restart_into_another_model",
        Leave::RestartElsewhere,
        true,
        &OUTCOMES,
    );
}

/// `add_model` on m (which keeps a known model, or creates a kept one) races
/// the departure of m's last worker. Either it found the old state and kept
/// it (returns false: the old state stays, not retired, and a router that
/// cached it routes as unavailable), or m was forgotten first and it made a
/// new kept state (returns true). Either way m is listed afterwards, routes
/// as unavailable from every router made before, and a worker that
/// registers it again is routed.
#[test]
fn add_model_races_the_last_deregister() {
    static OUTCOMES: [Counter; 2] = [Counter::new(0), Counter::new(0)];
    run_model_with("forgetting/add_model_races_the_last_deregister", 4, || {
        let monitor = monitor();
        let (router, handle, mut local) = routers(&monitor);
        let leaver = {
            let monitor = monitor.clone();
            thread::spawn(move || assert!(monitor.deregister(OLD)))
        };
        let created = monitor.add_model(MODEL);
        leaver.join().unwrap();
        OUTCOMES[usize::from(created)].fetch_add(1, CounterOrdering::Relaxed);

        assert_eq!(monitor.models(), [MODEL], "a kept model was forgotten");
        assert_eq!(router.route(MODEL, &[]), Err(RouteError::Unavailable));
        assert_eq!(handle.route(&[]), Err(RouteError::Unavailable));
        assert_eq!(local.route(&[]), Err(RouteError::Unavailable));
        assert_eq!(monitor.register(NEW, MODEL, 1, 0), Ok(Registered::New));
        assert_eq!(router.route(MODEL, &[]), Ok(NEW));
        assert_eq!(handle.route(&[]), Ok(NEW));
        assert_eq!(local.route(&[]), Ok(NEW));
        // Kept either way: its last worker leaving again forgets nothing.
        assert!(monitor.deregister(NEW));
        assert_eq!(monitor.models(), [MODEL], "a kept model was forgotten");
    });
    let (kept, created) = (OUTCOMES[0].load(CounterOrdering::Relaxed), OUTCOMES[1].load(CounterOrdering::Relaxed));
    eprintln!("  add_model: kept the old state {kept}, created a new one {created}");
    if !coverage_required("add_model") {
        return;
    }
    assert!(kept > 0 && created > 0, "both orders must be explored (kept {kept}, created {created})");
}

/// A (the main thread) applies a report that makes the old worker busy
/// (under default thresholds, which do not keep the model) while B
/// deregisters it, its model's last worker. The retired state's view must
/// stay empty: had the report's publication put the worker back, routers
/// that cached the state would route to a worker that left (they only look
/// again when they find no instance). Afterwards every router made before
/// answers unknown model, and a new life of the same worker id starts free.
#[test]
fn a_report_racing_the_last_deregister_leaves_the_old_state_empty() {
    static OUTCOMES: [Counter; 3] = [Counter::new(0), Counter::new(0), Counter::new(0)];
    run_model_with("forgetting/a_report_racing_the_last_deregister_leaves_the_old_state_empty", 4, || {
        let (clock, _mock) = quanta::Clock::mock();
        let config = MonitorConfig { default_thresholds: decode(0.5), ..Default::default() };
        let monitor = Arc::new(WorkerMonitor::with_clock(config, clock).unwrap());
        assert_eq!(monitor.register(OLD, MODEL, 1, 0), Ok(Registered::New));
        let (router, handle, mut local) = routers(&monitor);
        let leaver = {
            let monitor = monitor.clone();
            thread::spawn(move || assert!(monitor.deregister(OLD)))
        };
        let busy = LoadReport {
            worker: OLD,
            incarnation: 0,
            rank: 0,
            publisher: Publisher::Worker,
            seq: 1,
            load: RankLoad { active_decode_blocks: 90, kv_total_blocks: 100, ..Default::default() },
        };
        let applied = monitor.apply(&busy);
        leaver.join().unwrap();
        let outcome = match applied {
            Ok(Applied::Flipped) => 0,
            Ok(Applied::Stored) => 1,
            Err(ApplyError::UnknownWorker(OLD)) => 2,
            other => panic!("unexpected {other:?}"),
        };
        OUTCOMES[outcome].fetch_add(1, CounterOrdering::Relaxed);

        assert!(!monitor.has_model(MODEL));
        assert_eq!(router.route(MODEL, &[]), Err(RouteError::UnknownModel), "the old state is not empty");
        assert_eq!(handle.route(&[]), Err(RouteError::UnknownModel), "the old state is not empty");
        assert_eq!(local.route(&[]), Err(RouteError::UnknownModel), "the old state is not empty");
        assert_eq!(monitor.register(OLD, MODEL, 1, 1), Ok(Registered::New));
        assert!(!monitor.is_busy(OLD), "the old life's load leaked into the new one");
        assert_eq!(router.route(MODEL, &[]), Ok(OLD));
        assert_eq!(handle.route(&[]), Ok(OLD));
        assert_eq!(local.route(&[]), Ok(OLD));
    });
    let counts: Vec<usize> = OUTCOMES.iter().map(|c| c.load(CounterOrdering::Relaxed)).collect();
    eprintln!("  report outcomes: flipped {}, stored {}, unknown worker {}", counts[0], counts[1], counts[2]);
    if !coverage_required("report") {
        return;
    }
    assert!(counts[0] > 0 && counts[2] > 0, "both orders must be explored: {counts:?}");
}
