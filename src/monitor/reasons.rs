//! [`ReasonCounts`]: how many busy instances of a model each busy signal
//! holds (kept by the model's writer; their union answers a 529's reasons).

use crate::thresholds::BusySignals;

/// Per signal, the busy instances that signal holds busy (as last
/// evaluated): a model's rejection reasons without a scan of its instances.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ReasonCounts([u32; 4]);

impl ReasonCounts {
    /// Counts the signals of an instance published busy.
    pub(crate) fn add(&mut self, signals: BusySignals) {
        for (count, fired) in self.0.iter_mut().zip(bits(signals)) {
            *count += u32::from(fired);
        }
    }

    /// Forgets the signals of an instance no longer published busy (each
    /// counted before: saturating, so a broken invariant cannot wrap a count
    /// into a reason reported forever).
    pub(crate) fn remove(&mut self, signals: BusySignals) {
        for (count, fired) in self.0.iter_mut().zip(bits(signals)) {
            debug_assert!(*count >= u32::from(fired), "a signal removed more often than added");
            *count = count.saturating_sub(u32::from(fired));
        }
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
        counts.remove(decode);
        assert_eq!(counts.signals(), BusySignals::default());
    }
}
