//! [`Padded`]: a boxed slice that shares no cache line with anything else.

use std::mem::size_of;
use std::ops::Deref;

/// Bytes of padding on each side: two cache lines, as `CachePadded` uses on
/// x86-64 (the adjacent-line prefetcher pulls lines in pairs).
const PAD_BYTES: usize = 128;

/// A cache line.
const LINE: usize = 64;

/// An immutable boxed slice whose elements start on a cache-line boundary,
/// with at least [`PAD_BYTES`] of padding on each side, so that no other
/// allocation sits on the lines of its elements and a short slice takes as
/// few lines as it can.
///
/// Routers read these slices on every call while the monitor allocates and
/// frees on other cores. With a plain `Box<[T]>`, the allocator's bookkeeping
/// for a neighbouring chunk could share the slice's first or last line, and
/// each of the monitor's allocations would then evict that line from every
/// router's cache.
///
/// Safe code only: the padding is ordinary elements that are never read.
pub(crate) struct Padded<T> {
    storage: Box<[T]>,
    /// Index of the first element in `storage`.
    start: usize,
    len: usize,
}

impl<T: Copy + Default> Padded<T> {
    /// Elements of padding on each side, before alignment (at least one).
    const PAD: usize = if size_of::<T>() == 0 { 1 } else { PAD_BYTES.div_ceil(size_of::<T>()) };
    /// Extra elements that leave room to move the start to a line boundary.
    const SLACK: usize = if size_of::<T>() == 0 { 0 } else { LINE / size_of::<T>() };

    /// A padded copy of `items` (cold path: allocates).
    pub(crate) fn new(items: impl ExactSizeIterator<Item = T>) -> Self {
        Padded::filled(items.len(), |slots| {
            for (slot, item) in slots.iter_mut().zip(items) {
                *slot = item;
            }
        })
    }

    /// A padded slice of `len` elements that `fill` writes, from defaults
    /// (cold path: allocates; lets a caller copy whole runs with
    /// `copy_from_slice`).
    pub(crate) fn filled(len: usize, fill: impl FnOnce(&mut [T])) -> Self {
        let mut storage = vec![T::default(); len + 2 * Self::PAD + Self::SLACK].into_boxed_slice();
        // The first index at or after `PAD` whose address is on a line
        // boundary (element sizes here divide the line size).
        let first = storage[Self::PAD..].as_ptr() as usize;
        let start = Self::PAD + (first.next_multiple_of(LINE) - first) / size_of::<T>().max(1);
        fill(&mut storage[start..start + len]);
        Padded { storage, start, len }
    }
}

impl<T: Copy> Padded<T> {
    /// Number of elements (without the slice bounds checks of `deref`).
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Element `index` (`index < len()`), with a single bounds check against
    /// the whole allocation; hot paths index with values below `len()` by
    /// construction, so this check never fails (and never reads padding).
    #[inline(always)]
    pub(crate) fn get(&self, index: usize) -> T {
        debug_assert!(index < self.len, "index {index} out of range for {} elements", self.len);
        self.storage[self.start + index]
    }
}

impl<T> Deref for Padded<T> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        &self.storage[self.start..self.start + self.len]
    }
}

impl<T: Copy + Default> Default for Padded<T> {
    fn default() -> Self {
        Padded::new(std::iter::empty())
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Padded<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_exactly_its_items() {
        for len in [0, 1, 7, 64, 200] {
            let items: Vec<u32> = (0..len).map(|i| i * 3 + 1).collect();
            let padded = Padded::new(items.iter().copied());
            assert_eq!(&*padded, &items[..]);
            let wide: Vec<u64> = items.iter().map(|&i| u64::from(i) << 40).collect();
            assert_eq!(&*Padded::new(wide.iter().copied()), &wide[..]);
        }
        assert_eq!(Padded::<u8>::default().len(), 0);
    }

    /// The addresses of the allocation and of the elements.
    fn addresses<T>(padded: &Padded<T>) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
        let (storage, data) = (padded.storage.as_ptr_range(), padded.as_ptr_range());
        (storage.start as usize..storage.end as usize, data.start as usize..data.end as usize)
    }

    #[test]
    fn starts_on_a_line_and_shares_no_line_pair() {
        for len in [1, 3, 48, 64, 65, 300] {
            let bytes = addresses(&Padded::new((0..len).map(|i| i as u8)));
            let words = addresses(&Padded::new((0..len).map(|i| i as u64)));
            for (storage, data) in [bytes, words] {
                assert_eq!(data.start % LINE, 0, "len {len}");
                // Every 128-byte pair of lines that holds an element lies
                // inside the allocation.
                let first_pair = data.start & !(PAD_BYTES - 1);
                let last_pair_end = ((data.end - 1) | (PAD_BYTES - 1)) + 1;
                assert!(first_pair >= storage.start, "len {len}");
                assert!(last_pair_end <= storage.end, "len {len}");
            }
        }
    }
}
