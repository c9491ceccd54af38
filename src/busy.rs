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
/// use loadgate::monitor::BusySet;
///
/// let set = BusySet::new(5).with(1, true).with(2, true);
/// assert_eq!(set.free_count(), 3);
/// assert_eq!(set.next_free_from(1), Some(3));
/// assert_eq!(set.nth_free(2), Some(4));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BusySet {
    words: Box<[u64]>,
    /// Free instances in the words before each word (prefix sums), so that
    /// [`nth_free`](Self::nth_free) finds its word by binary search.
    free_before: Box<[usize]>,
    len: usize,
    busy: usize,
}

impl BusySet {
    /// `len` instances, none busy.
    pub fn new(len: usize) -> Self {
        let words = len.div_ceil(64);
        BusySet {
            words: vec![0; words].into_boxed_slice(),
            free_before: (0..words).map(|w| w * 64).collect(),
            len,
            busy: 0,
        }
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
            (false, true) => {
                self.busy += 1;
                self.free_before[word + 1..].iter_mut().for_each(|f| *f -= 1);
            }
            (true, false) => {
                self.busy -= 1;
                self.free_before[word + 1..].iter_mut().for_each(|f| *f += 1);
            }
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
    ///
    /// A binary search over the per-word prefix counts, then a select within
    /// one word: O(log(len / 64)), no loop over bits.
    #[inline]
    pub fn nth_free(&self, n: usize) -> Option<usize> {
        if n >= self.free_count() {
            return None;
        }
        // The last word with fewer than `n + 1` free instances before it
        // holds the `n`-th; there is one, as word 0 has none before it.
        let w = match self.free_before.len() {
            1 => 0,
            _ => self.free_before.partition_point(|&before| before <= n) - 1,
        };
        let mut free = !self.words[w];
        if (w + 1) * 64 > self.len {
            free &= (1u64 << (self.len % 64)) - 1;
        }
        Some(w * 64 + select_in_word(free, (n - self.free_before[w]) as u32) as usize)
    }

    /// Free instances in index order.
    pub fn iter_free(&self) -> impl Iterator<Item = usize> + '_ {
        self.words.iter().enumerate().flat_map(move |(w, &word)| {
            let mut free = !word;
            if (w + 1) * 64 > self.len {
                free &= (1u64 << (self.len % 64)) - 1;
            }
            // One word at a time: the lowest free bit, then drop it.
            std::iter::from_fn(move || {
                (free != 0).then(|| {
                    let bit = free.trailing_zeros() as usize;
                    free &= free - 1;
                    w * 64 + bit
                })
            })
        })
    }
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The position of the `rank`-th (0-based) set bit of `word`, which has more
/// than `rank` set bits: broadword (per-byte counts, then one byte).
#[inline]
fn select_in_word(word: u64, rank: u32) -> u32 {
    debug_assert!(rank < word.count_ones());
    // Set bits per byte, then running totals: byte i of `cumulative` holds
    // the set bits in bytes 0..=i (at most 64, so no byte overflows).
    let mut bytes = word - ((word >> 1) & 0x5555_5555_5555_5555);
    bytes = (bytes & 0x3333_3333_3333_3333) + ((bytes >> 2) & 0x3333_3333_3333_3333);
    bytes = (bytes + (bytes >> 4)) & 0x0f0f_0f0f_0f0f_0f0f;
    let cumulative = bytes.wrapping_mul(ONES);
    // The high bit of each byte says whether its running total is <= rank;
    // their number is the index of the byte that holds the bit.
    let at_most = ((u64::from(rank) * ONES) | HIGHS).wrapping_sub(cumulative) & HIGHS;
    let byte = ((at_most >> 7).wrapping_mul(ONES) >> 56) as u32;
    let before = ((cumulative << 8) >> (byte * 8)) as u32 & 0xff;
    let mut bits = (word >> (byte * 8)) as u32 & 0xff;
    for _ in 0..rank - before {
        bits &= bits - 1; // drop the lowest set bit (at most 7 times)
    }
    byte * 8 + bits.trailing_zeros()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_in_word_matches_a_bit_by_bit_scan() {
        let mut rng = fastrand::Rng::with_seed(7);
        let patterns = [u64::MAX, 1, 1 << 63, 0x8000_0000_0000_0001, 0xff00_ff00_ff00_ff00];
        for word in patterns.into_iter().chain((0..2_000).map(|_| rng.u64(..) & rng.u64(..) | 1)) {
            let positions: Vec<u32> = (0..64).filter(|b| word >> b & 1 == 1).collect();
            for (rank, &position) in positions.iter().enumerate() {
                assert_eq!(select_in_word(word, rank as u32), position, "word {word:#x} rank {rank}");
            }
        }
    }

    #[test]
    fn nth_free_matches_iter_free_across_words() {
        let mut rng = fastrand::Rng::with_seed(11);
        for len in [1, 63, 64, 65, 128, 200, 1000] {
            let mut set = BusySet::new(len);
            for _ in 0..len * 2 {
                set.set(rng.usize(..len), rng.bool());
                let free: Vec<usize> = set.iter_free().collect();
                let scanned: Vec<usize> = (0..len).filter(|&i| !set.is_busy(i)).collect();
                assert_eq!(free, scanned, "len {len}");
                assert_eq!(free.len(), set.free_count());
                for (n, &index) in free.iter().enumerate() {
                    assert_eq!(set.nth_free(n), Some(index), "len {len} n {n}");
                }
                assert_eq!(set.nth_free(free.len()), None);
            }
        }
    }
}
