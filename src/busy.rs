//! [`BusySet`]: an immutable bitmap of busy instances, published as a whole.

/// An immutable bitmap over a model's instances (by position), with the count
/// of free ones.
///
/// The monitor builds a new one when a bit changes and publishes it through
/// arc-swap; routers only read. Selection is a word scan: no lock, no
/// allocation.
///
/// # Examples
///
/// ```
/// use loadgate::BusySet;
///
/// let set = BusySet::new(5).with(1, true).with(2, true);
/// assert_eq!(set.free_count(), 3);
/// assert_eq!(set.next_free_from(1), Some(3));
/// assert_eq!(set.nth_free(2), Some(4));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BusySet {
    words: Box<[u64]>,
    len: usize,
    busy: usize,
}

impl BusySet {
    /// `len` instances, none busy.
    pub fn new(len: usize) -> Self {
        BusySet { words: vec![0; len.div_ceil(64)].into_boxed_slice(), len, busy: 0 }
    }

    /// A copy with instance `index` marked busy or free.
    ///
    /// # Panics
    ///
    /// Panics if `index >= len()`.
    pub fn with(&self, index: usize, busy: bool) -> Self {
        let mut next = self.clone();
        next.set(index, busy);
        next
    }

    /// Marks instance `index` busy or free in place.
    ///
    /// # Panics
    ///
    /// Panics if `index >= len()`.
    pub fn set(&mut self, index: usize, busy: bool) {
        assert!(index < self.len, "index {index} out of range for {} instances", self.len);
        let (word, bit) = (index / 64, 1u64 << (index % 64));
        let was = self.words[word] & bit != 0;
        if busy {
            self.words[word] |= bit;
        } else {
            self.words[word] &= !bit;
        }
        match (was, busy) {
            (false, true) => self.busy += 1,
            (true, false) => self.busy -= 1,
            _ => {}
        }
    }

    /// Number of instances.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are no instances.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of busy instances.
    #[inline]
    pub fn busy_count(&self) -> usize {
        self.busy
    }

    /// Number of free instances.
    #[inline]
    pub fn free_count(&self) -> usize {
        self.len - self.busy
    }

    /// Whether instance `index` is busy (`false` when out of range).
    #[inline]
    pub fn is_busy(&self, index: usize) -> bool {
        match self.words.get(index / 64) {
            Some(word) => word & (1u64 << (index % 64)) != 0,
            None => false,
        }
    }

    /// The first free instance at or after `start`, wrapping around.
    #[inline]
    pub fn next_free_from(&self, start: usize) -> Option<usize> {
        if self.busy == self.len {
            return None;
        }
        let start = if start >= self.len { 0 } else { start };
        self.scan(start, self.len).or_else(|| self.scan(0, start))
    }

    /// The first free index in `[from, to)`.
    #[inline]
    fn scan(&self, from: usize, to: usize) -> Option<usize> {
        let mut index = from;
        while index < to {
            let word = index / 64;
            // Free bits of this word at or above `index`.
            let free = !self.words[word] & (u64::MAX << (index % 64));
            if free != 0 {
                let found = word * 64 + free.trailing_zeros() as usize;
                return (found < to).then_some(found);
            }
            index = (word + 1) * 64;
        }
        None
    }

    /// The `n`-th free instance (0-based), counting from index 0.
    #[inline]
    pub fn nth_free(&self, mut n: usize) -> Option<usize> {
        if n >= self.free_count() {
            return None;
        }
        for (w, &word) in self.words.iter().enumerate() {
            let mut free = !word;
            if (w + 1) * 64 > self.len {
                free &= (1u64 << (self.len % 64)) - 1;
            }
            let count = free.count_ones() as usize;
            if n < count {
                for _ in 0..n {
                    free &= free - 1; // drop the lowest set bit
                }
                return Some(w * 64 + free.trailing_zeros() as usize);
            }
            n -= count;
        }
        None
    }

    /// Free instances in index order.
    pub fn iter_free(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.len).filter(move |&i| !self.is_busy(i))
    }
}
