//! [`ReasonCounts`]: how many busy instances each busy signal holds.

use crate::thresholds::BusySignals;

/// Per signal, the busy instances that signal made busy when they were
/// published busy: a model's rejection reasons without a scan of its
/// instances.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ReasonCounts([u32; 4]);

impl ReasonCounts {
    /// Counts the signals of an instance published busy.
    pub(crate) fn add(&mut self, signals: BusySignals) {
        for (count, fired) in self.0.iter_mut().zip(bits(signals)) {
            *count += u32::from(fired);
        }
    }

    /// Forgets the signals of an instance no longer published busy.
    pub(crate) fn remove(&mut self, signals: BusySignals) {
        for (count, fired) in self.0.iter_mut().zip(bits(signals)) {
            *count -= u32::from(fired);
        }
    }

    /// The sum of two counts.
    pub(crate) fn plus(mut self, other: ReasonCounts) -> ReasonCounts {
        for (count, more) in self.0.iter_mut().zip(other.0) {
            *count += more;
        }
        self
    }

    /// The difference of two counts (`other` counted in `self`).
    pub(crate) fn minus(mut self, other: ReasonCounts) -> ReasonCounts {
        for (count, less) in self.0.iter_mut().zip(other.0) {
            *count -= less;
        }
        self
    }

    /// The signals that hold at least one instance busy.
    pub(crate) fn signals(&self) -> BusySignals {
        let [decode, prefill, prefill_frac, waiting] = self.0.map(|count| count > 0);
        BusySignals { decode, prefill, prefill_frac, waiting }
    }
}

fn bits(s: BusySignals) -> [bool; 4] {
    [s.decode, s.prefill, s.prefill_frac, s.waiting]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_signals_until_the_last_instance_holding_one_leaves() {
        let decode = BusySignals { decode: true, ..Default::default() };
        let both = BusySignals { decode: true, waiting: true, ..Default::default() };
        let mut counts = ReasonCounts::default();
        counts.add(decode);
        counts.add(both);
        assert_eq!(counts.signals(), both);
        counts.remove(both);
        assert_eq!(counts.signals(), decode);
        assert_eq!(counts.plus(counts).0, [2, 0, 0, 0]);
        assert_eq!(counts.plus(counts).minus(counts), counts);
        counts.remove(decode);
        assert_eq!(counts.signals(), BusySignals::default());
    }
}
