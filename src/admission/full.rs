//! [`Admission::refuse_if_full`]: a refusal decided before the request is
//! read, for a caller whose request takes time to read and parse.

use super::{unpack, Admission};
use crate::sync::Ordering;

impl<T> Admission<T> {
    /// Whether an arrival now would be refused (`N` running and `Q`
    /// queued, read at one instant); if so it is counted as refused. A
    /// caller that must read a large request before it can
    /// [`admit`](Self::admit) it refuses it at once instead of after the
    /// reading: the exact decision of `admit` would be the same now.
    pub fn refuse_if_full(&self) -> bool {
        // Relaxed: a hint; `admit` decides exactly. One load: running and
        // queued from the same instant (not `N - 1` running and `Q` queued
        // seen as full).
        let (running, queued) = unpack(self.state.load(Ordering::Relaxed));
        let full = running >= self.limit && queued >= self.queue_limit;
        if full {
            // Relaxed: a statistic.
            self.rejected.fetch_add(1, Ordering::Relaxed);
        }
        full
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Waker};

    use crate::admission::{Admission, Admitted};

    #[test]
    fn only_a_full_gate_refuses_and_counts_it() {
        let gate = Admission::new(1, 2).unwrap();
        let mut cx = Context::from_waker(Waker::noop());
        assert!(!gate.refuse_if_full());
        let Ok(Admitted::Now((), _permit)) = gate.try_admit(()) else { panic!("a slot was free") };
        let mut first = pin!(gate.admit(()));
        assert!(first.as_mut().poll(&mut cx).is_pending());
        assert!(!gate.refuse_if_full(), "N running, Q - 1 queued: room left");
        let mut second = pin!(gate.admit(()));
        assert!(second.as_mut().poll(&mut cx).is_pending());
        assert!(gate.refuse_if_full());
        assert_eq!(gate.rejected(), 1);
    }
}
