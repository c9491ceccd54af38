//! [`StripedHistogram`]: a histogram for prometheus-client families whose
//! recording takes no lock.

use std::fmt;

use crossbeam_utils::CachePadded;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

use super::stripe;
use crate::sync::{Arc, AtomicU64, Ordering};

/// Words in a block: 128 bytes, one block per `CachePadded` (two cache
/// lines on x86-64, which the adjacent-line prefetcher pulls in pairs).
const BLOCK_WORDS: usize = 16;

/// A run of words that shares no cache line with any other block.
type Block = CachePadded<[AtomicU64; BLOCK_WORDS]>;

/// The word of a stripe that holds its sum (`f64` bits); the count of
/// bucket `i` is word `1 + i`.
const SUM: usize = 0;

/// A fixed-bucket histogram with prometheus-client's buckets and
/// exposition, whose [`observe`](Self::observe) takes no lock.
///
/// prometheus-client's `Histogram` takes a write lock on every observation,
/// so every thread recording into one series waits on the others. Here each
/// series is striped: every stripe holds its own bucket counts and sum, in
/// cache-padded blocks of its own, so two cores recording at once touch
/// different cache lines. A scrape adds the stripes together.
///
/// - **Owned stripes**: a live thread holds a small index no other live
///   thread holds, and writes the stripe of that index alone. Recording
///   there is a plain load and store of the bucket count and of the sum: no
///   read-modify-write, no lock prefix, and no update lost, there being one
///   writer (an index passes to a new thread only after its old one exited,
///   through a mutex: the new writer starts from the old one's figures).
/// - **The shared stripe**: a thread whose index is past the owned stripes
///   (more threads have recorded at once than twice the cores, up to 64
///   owned stripes) records there with a `fetch_add` on the count and a
///   compare-and-swap loop on the sum.
///
/// - Buckets: the bounds given, then `+Inf`. A value is counted in the first
///   bound at least as large (`le` is inclusive), prometheus-client's rule.
/// - `_count` is the sum of the bucket counts, read at scrape, so it always
///   equals the `+Inf` bucket, even while recording races the scrape; the
///   sum is read alongside and may lag or lead it by observations in flight.
/// - The sum is kept as `f64` bits per stripe (not as whole nanoseconds: any
///   value may be observed), so a thread's observations add up in the order
///   and with the rounding of prometheus-client's `f64` sum: for the same
///   observations from one thread, the text is byte for byte
///   prometheus-client's. Observations from several threads add up per
///   stripe, then stripe by stripe, which may round the last digit
///   differently from one sum in arrival order (itself not deterministic).
/// - One difference: a NaN, or a value above `f64::MAX`, is counted in
///   `+Inf`; prometheus-client counts it in `_count` only, so its `+Inf`
///   bucket then falls short of its `_count`.
///
/// A clone is a handle to the same series, as prometheus-client's metrics
/// are. It implements `EncodeMetric` and `TypedMetric`, so it goes wherever
/// prometheus-client's `Histogram` does: a `Registry`, a `Family`.
///
/// A stripe takes `(bounds + 2) * 8` bytes rounded up to 128: with 20
/// bounds, a series on 8 cores (16 owned stripes and the shared one) takes
/// 4.25 KiB.
///
/// # Examples
///
/// ```
/// use loadgate::metrics::StripedHistogram;
/// use prometheus_client::encoding::text::encode;
/// use prometheus_client::metrics::family::Family;
/// use prometheus_client::registry::Registry;
///
/// let seconds = Family::<Vec<(String, String)>, StripedHistogram>::new_with_constructor(|| {
///     StripedHistogram::new([0.01, 0.1, 1.0])
/// });
/// let mut registry = Registry::default();
/// registry.register("request_seconds", "Request duration", seconds.clone());
///
/// // Keep the series' handle: recording then touches no map and no lock.
/// let llama = seconds.get_or_create(&vec![("model".into(), "llama".into())]).clone();
/// llama.observe(0.1); // `le` is inclusive: in the 0.1 bucket
/// llama.observe(2.5);
///
/// let mut text = String::new();
/// encode(&mut text, &registry).unwrap();
/// assert!(text.contains("# TYPE request_seconds histogram\n"));
/// assert!(text.contains("request_seconds_sum{model=\"llama\"} 2.6\n"));
/// assert!(text.contains("request_seconds_count{model=\"llama\"} 2\n"));
/// assert!(text.contains("request_seconds_bucket{le=\"0.01\",model=\"llama\"} 0\n"));
/// assert!(text.contains("request_seconds_bucket{le=\"0.1\",model=\"llama\"} 1\n"));
/// assert!(text.contains("request_seconds_bucket{le=\"+Inf\",model=\"llama\"} 2\n"));
/// ```
#[derive(Clone)]
pub struct StripedHistogram {
    inner: Arc<Stripes>,
}

/// The stripes of one series.
struct Stripes {
    /// The upper bounds as given, then `f64::MAX`: the `+Inf` bucket, as
    /// prometheus-client's encoder expects it.
    bounds: Box<[f64]>,
    /// The bounds rise strictly: the bucket is found without branches.
    rising: bool,
    /// Owned stripes: stripe `i < owned` is written only by the thread
    /// holding index `i`; stripe `owned` is shared by the other threads.
    owned: usize,
    /// Words per stripe: the sum and the bucket counts, rounded up to whole
    /// blocks, so that no two stripes share a block.
    stride: usize,
    blocks: Box<[Block]>,
}

impl StripedHistogram {
    /// A histogram with these upper bounds (and `+Inf` after them), like
    /// prometheus-client's `Histogram::new`.
    pub fn new(bounds: impl IntoIterator<Item = f64>) -> Self {
        Self::with_owned(bounds, stripe::owned())
    }

    /// A histogram of `owned` owned stripes (and the shared one).
    pub(super) fn with_owned(bounds: impl IntoIterator<Item = f64>, owned: usize) -> Self {
        let bounds: Box<[f64]> = bounds.into_iter().chain([f64::MAX]).collect();
        let stride = (1 + bounds.len()).next_multiple_of(BLOCK_WORDS);
        let blocks = (0..(owned + 1) * stride / BLOCK_WORDS)
            .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))));
        let rising = bounds.windows(2).all(|pair| pair[0] < pair[1]);
        let inner = Stripes { bounds, rising, owned, stride, blocks: blocks.collect() };
        StripedHistogram { inner: Arc::new(inner) }
    }

    /// Records one observation of `value`.
    #[inline]
    pub fn observe(&self, value: f64) {
        self.observe_n(value, 1);
    }

    /// Records `n` observations of `value` at the cost of one: the sum grows
    /// by `value` added `n` times, as `n` calls of [`observe`](Self::observe)
    /// would make it.
    #[inline]
    pub fn observe_n(&self, value: f64, n: u32) {
        let stripes = &*self.inner;
        let bucket = 1 + stripes.bucket(value);
        match stripe::index() {
            Some(index) if index < stripes.owned => {
                // This thread is the stripe's one writer (`stripe.rs`), and
                // it reads its own last stores: a load and a store lose
                // nothing. Relaxed: each figure is read on its own at scrape,
                // nothing is published through it; a later holder of the
                // index sees these through the index's mutex.
                let count = stripes.word(index, bucket);
                count.store(count.load(Ordering::Relaxed).wrapping_add(u64::from(n)), Ordering::Relaxed);
                let sum = stripes.word(index, SUM);
                sum.store(add_n(f64::from_bits(sum.load(Ordering::Relaxed)), value, n).to_bits(), Ordering::Relaxed);
            }
            _ => {
                let shared = stripes.owned;
                // Relaxed: as above; `fetch_add` loses no increment among
                // the shared stripe's writers.
                stripes.word(shared, bucket).fetch_add(u64::from(n), Ordering::Relaxed);
                add_to_shared_sum(stripes.word(shared, SUM), value, n);
            }
        }
    }

    /// The sum, the count and each bucket's own count (not cumulative; the
    /// last is `+Inf`, bound `f64::MAX`), added over the stripes.
    fn merged(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let stripes = &*self.inner;
        let mut buckets: Vec<(f64, u64)> = stripes.bounds.iter().map(|&bound| (bound, 0)).collect();
        let mut sum = 0.0;
        for stripe in 0..=stripes.owned {
            // Relaxed: the sum and the counts are independent figures; a
            // scrape promises no snapshot across them.
            sum += f64::from_bits(stripes.word(stripe, SUM).load(Ordering::Relaxed));
            for (bucket, (_, count)) in buckets.iter_mut().enumerate() {
                // Relaxed: as for the sum.
                *count += stripes.word(stripe, 1 + bucket).load(Ordering::Relaxed);
            }
        }
        // From the very counts written below: `+Inf` equals `_count`.
        let count = buckets.iter().map(|&(_, count)| count).sum();
        (sum, count, buckets)
    }
}

impl Stripes {
    /// Word `slot` of `stripe`.
    #[inline]
    fn word(&self, stripe: usize, slot: usize) -> &AtomicU64 {
        let at = stripe * self.stride + slot;
        &self.blocks[at / BLOCK_WORDS][at % BLOCK_WORDS]
    }

    /// The bucket of `value`: the first bound at least as large, in the
    /// order given (prometheus-client's search); NaN and values above
    /// `f64::MAX` pass every bound and land in `+Inf`.
    #[inline]
    fn bucket(&self, value: f64) -> usize {
        let last = self.bounds.len() - 1;
        if self.rising && !value.is_nan() {
            // Rising bounds: the first at least as large comes right after
            // those below, and counting those takes no branch per bound.
            let below: usize = self.bounds.iter().map(|&bound| usize::from(bound < value)).sum();
            return below.min(last);
        }
        self.bounds.iter().position(|&bound| value <= bound).unwrap_or(last)
    }
}

/// `sum` plus `value` added `n` times, one addition after the other.
#[inline]
fn add_n(mut sum: f64, value: f64, n: u32) -> f64 {
    for _ in 0..n {
        sum += value;
    }
    sum
}

/// Adds `value` `n` times to the `f64` whose bits the shared stripe's `sum`
/// holds.
#[cold]
fn add_to_shared_sum(sum: &AtomicU64, value: f64, n: u32) {
    // Relaxed: the sum is a figure read on its own at scrape. The loop
    // retries when another thread wrote the sum in between.
    let mut current = sum.load(Ordering::Relaxed);
    loop {
        let next = add_n(f64::from_bits(current), value, n).to_bits();
        match sum.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return,
            Err(actual) => current = actual,
        }
    }
}

impl TypedMetric for StripedHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for StripedHistogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> fmt::Result {
        let (sum, count, buckets) = self.merged();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

impl fmt::Debug for StripedHistogram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (sum, count, _) = self.merged();
        let bounds = &self.inner.bounds[..self.inner.bounds.len() - 1];
        f.debug_struct("StripedHistogram")
            .field("bounds", &bounds)
            .field("owned_stripes", &self.inner.owned)
            .field("count", &count)
            .field("sum", &sum)
            .finish()
    }
}

#[cfg(test)]
#[path = "histogram_tests.rs"]
mod tests;
