//! loom: awaited admission ([`Admission::admit`]) with futures dropped while
//! they wait. `N = 1` slot, `Q = 2` overflow. A dropped queued future gives
//! up its place at once (an arrival after it is never refused for it); a
//! permit handed to a dropped future passes to the next waiter; waiters not
//! cancelled get their slot in arrival order; the counts end at zero.
#![cfg(loom)]

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Wake, Waker};

use loadgate::{admission::Admit, Admission, Permit};
use loadgate_loom_tests::run_model_with;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::thread;

const N: usize = 1;
const Q: usize = 2;

/// A waker that records that it was woken.
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: std::sync::Arc<Self>) {
        // SeqCst: a test flag; the strongest ordering hides nothing.
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A future under test with its own waker.
struct Waiting {
    admit: Pin<Box<Admit<u32>>>,
    woken: std::sync::Arc<Flag>,
}

impl Waiting {
    /// Polls `gate.admit(id)` once; `Err` if it resolved at once.
    fn start(gate: &std::sync::Arc<Admission<u32>>, id: u32) -> Result<Self, Poll<Result<(u32, Permit<u32>), u32>>> {
        let mut waiting =
            Waiting { admit: Box::pin(gate.admit(id)), woken: std::sync::Arc::new(Flag(AtomicBool::new(false))) };
        match waiting.poll() {
            Poll::Pending => Ok(waiting),
            Poll::Ready(done) => Err(Poll::Ready(done)),
        }
    }

    fn poll(&mut self) -> Poll<Result<(u32, Permit<u32>), u32>> {
        let waker = Waker::from(self.woken.clone());
        let mut cx = Context::from_waker(&waker);
        self.admit.as_mut().poll(&mut cx).map(|done| done.map_err(|rejected| rejected.into_inner()))
    }

    /// Polls once more; the slot must have come, and the waker fired.
    fn granted(mut self, id: u32) -> Permit<u32> {
        let Poll::Ready(Ok((item, permit))) = self.poll() else { panic!("waiter {id} has no slot") };
        assert_eq!(item, id, "a waiter got another's item");
        // SeqCst: as in `wake`.
        assert!(self.woken.0.load(Ordering::SeqCst), "waiter {id} got its slot without a wake");
        permit
    }
}

/// Holds the slot and queues two waiters: `(permit, first, second)`.
fn full_gate(gate: &std::sync::Arc<Admission<u32>>) -> (Permit<u32>, Waiting, Waiting) {
    let Err(Poll::Ready(Ok((0, permit)))) = Waiting::start(gate, 0) else { panic!("the slot was free") };
    let first = Waiting::start(gate, 1).unwrap_or_else(|_| panic!("waiter 1 must queue"));
    let second = Waiting::start(gate, 2).unwrap_or_else(|_| panic!("waiter 2 must queue"));
    assert_eq!((gate.running(), gate.queued()), (N, Q));
    (permit, first, second)
}

/// A queued future is dropped while another arrives: once the drop is done,
/// the arrival is never refused (fewer than `N + Q` are admitted), and the
/// survivors run in arrival order when the slot frees. Also the other side
/// of the bound: with the drop not yet done, the arrival is refused.
#[test]
fn cancel_while_queued_gives_up_the_place() {
    run_model_with("admit_async/cancel_while_queued_gives_up_the_place", 3, || {
        let gate = Admission::<u32>::new(N, Q).unwrap();
        let (permit, first, second) = full_gate(&gate);
        let cancelled = std::sync::Arc::new(AtomicBool::new(false));
        let canceller = {
            let cancelled = cancelled.clone();
            thread::spawn(move || {
                drop(first);
                // SeqCst: the witness that the drop is complete.
                cancelled.store(true, Ordering::SeqCst);
            })
        };
        // SeqCst: as above.
        let after_the_drop = cancelled.load(Ordering::SeqCst);
        let third = Waiting::start(&gate, 3);
        assert!(gate.running() + gate.queued() <= N + Q, "more than N + Q admitted");
        canceller.join().unwrap();
        let third = match third {
            Ok(waiting) => Some(waiting),
            Err(Poll::Ready(Err(3))) => {
                assert!(!after_the_drop, "arrival refused after a queued future gave up its place");
                None
            }
            Err(_) => panic!("the slot is held: the arrival cannot run now"),
        };
        assert_eq!(gate.queued(), 1 + usize::from(third.is_some()));
        drop(permit);
        let second_permit = second.granted(2);
        assert_eq!((gate.running(), gate.queued()), (1, usize::from(third.is_some())));
        drop(second_permit);
        if let Some(third) = third {
            drop(third.granted(3));
        }
        assert_eq!((gate.running(), gate.queued()), (0, 0));
    });
}

/// The slot is released while the oldest waiter's future is dropped: the
/// drop finds it queued (it leaves a tombstone), claimed (the grant hands
/// the permit back), or granted (its permit is released). In every case the
/// next waiter gets the slot, exactly once, and nothing leaks.
#[test]
fn cancel_during_handoff_passes_the_permit_on() {
    run_model_with("admit_async/cancel_during_handoff_passes_the_permit_on", 3, || {
        let gate = Admission::<u32>::new(N, Q).unwrap();
        let (permit, first, second) = full_gate(&gate);
        let releaser = thread::spawn(move || drop(permit));
        drop(first);
        releaser.join().unwrap();
        assert_eq!((gate.running(), gate.queued()), (1, 0), "the slot went to waiter 2, and only there");
        drop(second.granted(2));
        assert_eq!((gate.running(), gate.queued()), (0, 0));
    });
}

/// Both waiters are dropped while the slot is released: the slot ends free.
#[test]
fn every_waiter_dropped_during_the_release_frees_the_slot() {
    run_model_with("admit_async/every_waiter_dropped_during_the_release_frees_the_slot", 3, || {
        let gate = Admission::<u32>::new(N, Q).unwrap();
        let (permit, first, second) = full_gate(&gate);
        let releaser = thread::spawn(move || drop(permit));
        drop(second);
        drop(first);
        releaser.join().unwrap();
        assert_eq!((gate.running(), gate.queued()), (0, 0));
        let Err(Poll::Ready(Ok((4, _)))) = Waiting::start(&gate, 4) else { panic!("the slot must be free") };
    });
}
