//! [`Padded`]: a boxed slice that shares no cache line with anything else.

use std::mem::size_of;
use std::ops::Deref;

/// Bytes of padding on each side: two cache lines, as `CachePadded` uses on
/// x86-64 (the adjacent-line prefetcher pulls lines in pairs).
const PAD_BYTES: usize = 128;

/// An immutable boxed slice with [`PAD_BYTES`] of padding on each side, so
/// that no other allocation sits on the cache lines of its elements.
///
/// Routers read these slices on every call while the monitor allocates and
/// frees on other cores. With a plain `Box<[T]>`, the allocator's bookkeeping
/// for a neighbouring chunk could share the slice's first or last line, and
/// each of the monitor's allocations would then evict that line from every
/// router's cache.
///
/// Safe code only: the padding is ordinary elements that are never read.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Padded<T> {
    storage: Box<[T]>,
}

impl<T: Copy + Default> Padded<T> {
    /// Elements of padding on each side (at least one).
    const PAD: usize = if size_of::<T>() == 0 { 1 } else { PAD_BYTES.div_ceil(size_of::<T>()) };

    /// A padded copy of `items` (cold path: allocates).
    pub(crate) fn new(items: impl ExactSizeIterator<Item = T>) -> Self {
        let mut storage = Vec::with_capacity(items.len() + 2 * Self::PAD);
        storage.resize(Self::PAD, T::default());
        storage.extend(items);
        storage.resize(storage.len() + Self::PAD, T::default());
        Padded { storage: storage.into_boxed_slice() }
    }
}

impl<T: Copy + Default> Deref for Padded<T> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        &self.storage[Self::PAD..self.storage.len() - Self::PAD]
    }
}

impl<T: Copy + Default> Default for Padded<T> {
    fn default() -> Self {
        Padded::new(std::iter::empty())
    }
}

impl<T: Copy + Default + std::fmt::Debug> std::fmt::Debug for Padded<T> {
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
        }
        assert!(Padded::<u8>::default().is_empty());
    }

    #[test]
    fn no_other_allocation_shares_an_element_line() {
        let padded = Padded::new([1u8, 2, 3].into_iter());
        let storage = padded.storage.as_ptr_range();
        let data = padded.as_ptr_range();
        // Every 128-byte pair of lines that holds an element lies inside the
        // allocation.
        let first_pair = data.start as usize & !(PAD_BYTES - 1);
        let last_pair_end = ((data.end as usize - 1) | (PAD_BYTES - 1)) + 1;
        assert!(first_pair >= storage.start as usize);
        assert!(last_pair_end <= storage.end as usize);
    }
}
