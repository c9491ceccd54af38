//! The one concurrency shim: std (plus arc-swap) normally, loom's
//! model-checked stand-ins under `--cfg loom` with the `loom` feature.
//!
//! Nothing else in the crate names `std::sync` or `arc_swap` directly, so the
//! loom build checks every protocol in the crate. loom cannot see inside
//! arc-swap; under loom it is replaced by a stand-in with the same API, so the
//! protocol *around* it is what gets checked. Two stand-ins:
//!
//! - by default a mutex around the `Arc`: loom explores interleavings well
//!   through it (a reader blocked on a writer lets the writer finish), but a
//!   reader after a store is ordered after it by the lock;
//! - with `--cfg loom_weak_swap`, an atomic index to the current `Arc`, read
//!   with Acquire (Relaxed by the cache's check), written with AcqRel: a
//!   reader may see an older value wherever the memory model allows it, so
//!   the memory orderings around a view are checked (the waiting line's no
//!   lost wake-up: `.ci/run` runs its models with both).

#[cfg(not(all(loom, feature = "loom")))]
mod imp {
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

    /// A swappable `Arc` whose reads are wait-free (arc-swap).
    pub(crate) type Swap<T> = arc_swap::ArcSwap<T>;
    /// One thread's cache of a [`Swap`] reached through `A`: holds the last
    /// `Arc` and revalidates with one plain pointer load (arc-swap's `Cache`).
    pub(crate) type SwapCache<A, T> = arc_swap::Cache<A, Arc<T>>;

    /// A concurrent hash map whose reads take no lock and whose writes
    /// copy nothing (scc's `HashIndex`, read-optimised: a read is a probe
    /// under an epoch guard; Fx hash: its keys are registered by the
    /// operator's workers, not chosen by clients).
    pub(crate) struct Map<K: 'static, V: 'static>(scc::HashIndex<K, V, rustc_hash::FxBuildHasher>);

    impl<K: std::hash::Hash + Eq + Clone + 'static, V: Clone + 'static> Map<K, V> {
        pub(crate) fn new() -> Self {
            Map(scc::HashIndex::with_hasher(rustc_hash::FxBuildHasher))
        }
        /// Calls `f` with the value of `key`, borrowed (no count is touched).
        #[inline]
        pub(crate) fn with<R>(&self, key: &K, f: impl FnOnce(Option<&V>) -> R) -> R {
            let mut f = Some(f);
            match self.0.peek_with(key, |_, value| (f.take().expect("called once"))(Some(value))) {
                Some(found) => found,
                None => (f.take().expect("not called"))(None),
            }
        }
        /// Inserts or replaces (readers see the old value or the new one,
        /// never none).
        pub(crate) fn insert(&self, key: K, value: V) {
            match self.0.entry(key) {
                scc::hash_index::Entry::Occupied(entry) => entry.update(value),
                scc::hash_index::Entry::Vacant(entry) => {
                    entry.insert_entry(value);
                }
            }
        }
        pub(crate) fn remove(&self, key: &K) {
            self.0.remove(key);
        }
        pub(crate) fn len(&self) -> usize {
            self.0.len()
        }
        pub(crate) fn for_each(&self, mut f: impl FnMut(&K, &V)) {
            let guard = scc::ebr::Guard::new();
            self.0.iter(&guard).for_each(|(k, v)| f(k, v));
        }
    }
}

#[cfg(all(loom, feature = "loom"))]
mod imp {
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub(crate) use loom::sync::{Mutex, MutexGuard};
    // Immutable shared data needs no model checking: std's `Arc` works on
    // loom's threads, and keeps `Arc<str>` and friends available.
    pub(crate) use std::sync::Arc;

    /// loom stand-in for `arc_swap::ArcSwap`: a loom mutex around the `Arc`.
    #[cfg(not(loom_weak_swap))]
    #[derive(Debug)]
    pub(crate) struct Swap<T>(loom::sync::Mutex<std::sync::Arc<T>>);

    #[cfg(not(loom_weak_swap))]
    impl<T> Swap<T> {
        pub(crate) fn from_pointee(value: T) -> Self {
            Self(loom::sync::Mutex::new(std::sync::Arc::new(value)))
        }
        pub(crate) fn load(&self) -> Guard<T> {
            Guard(self.0.lock().unwrap().clone())
        }
        pub(crate) fn load_full(&self) -> std::sync::Arc<T> {
            self.0.lock().unwrap().clone()
        }
        pub(crate) fn store(&self, value: std::sync::Arc<T>) {
            *self.0.lock().unwrap() = value;
        }
        pub(crate) fn swap(&self, value: std::sync::Arc<T>) -> std::sync::Arc<T> {
            std::mem::replace(&mut *self.0.lock().unwrap(), value)
        }
    }

    /// loom stand-in for `arc_swap::Cache`: reloads from the [`Swap`] on every
    /// `load`, so loom checks each read as if the cache had missed.
    #[cfg(not(loom_weak_swap))]
    #[derive(Debug)]
    pub(crate) struct SwapCache<A, T> {
        source: A,
        cached: std::sync::Arc<T>,
    }

    #[cfg(not(loom_weak_swap))]
    impl<A: std::ops::Deref<Target = Swap<T>>, T> SwapCache<A, T> {
        pub(crate) fn new(source: A) -> Self {
            let cached = source.load_full();
            Self { source, cached }
        }
        pub(crate) fn load(&mut self) -> &std::sync::Arc<T> {
            self.cached = self.source.load_full();
            &self.cached
        }
    }

    #[cfg(not(loom_weak_swap))]
    impl<A: Clone, T> Clone for SwapCache<A, T> {
        fn clone(&self) -> Self {
            Self { source: self.source.clone(), cached: self.cached.clone() }
        }
    }

    /// With `--cfg loom_weak_swap`, the loom stand-in for `arc_swap::ArcSwap`:
    /// the current `Arc` is named by a loom atomic (an index into every value
    /// ever stored, each kept until the swap is dropped), so loom checks what
    /// a reader may see with its memory model, as with arc-swap's pointer: a
    /// load reads the index with Acquire, a store or swap writes it with an
    /// AcqRel swap (arc-swap's are at least as strong). A reader may see an
    /// older value, where the lock would have ordered it after every store.
    #[cfg(loom_weak_swap)]
    #[derive(Debug)]
    pub(crate) struct Swap<T> {
        current: loom::sync::atomic::AtomicUsize,
        /// Only appended to; std's lock (not a point loom schedules at):
        /// what is read through an index is ordered by the index's atomic.
        values: std::sync::Mutex<Vec<std::sync::Arc<T>>>,
    }

    #[cfg(loom_weak_swap)]
    impl<T> Swap<T> {
        pub(crate) fn from_pointee(value: T) -> Self {
            let values = std::sync::Mutex::new(vec![std::sync::Arc::new(value)]);
            Self { current: loom::sync::atomic::AtomicUsize::new(0), values }
        }
        fn value(&self, index: usize) -> std::sync::Arc<T> {
            self.values.lock().unwrap()[index].clone()
        }
        /// The current value and its index.
        fn load_indexed(&self) -> (usize, std::sync::Arc<T>) {
            let index = self.current.load(Ordering::Acquire);
            (index, self.value(index))
        }
        pub(crate) fn load(&self) -> Guard<T> {
            Guard(self.load_indexed().1)
        }
        pub(crate) fn load_full(&self) -> std::sync::Arc<T> {
            self.load_indexed().1
        }
        pub(crate) fn store(&self, value: std::sync::Arc<T>) {
            self.swap(value);
        }
        pub(crate) fn swap(&self, value: std::sync::Arc<T>) -> std::sync::Arc<T> {
            let index = {
                let mut values = self.values.lock().unwrap();
                values.push(value);
                values.len() - 1
            };
            let old = self.current.swap(index, Ordering::AcqRel);
            self.value(old)
        }
    }

    /// With `--cfg loom_weak_swap`, the loom stand-in for `arc_swap::Cache`:
    /// keeps the value it loaded last and checks the swap's index with a
    /// Relaxed load, as arc-swap's cache
    /// checks its pointer, reloading (Acquire) only when it changed.
    #[cfg(loom_weak_swap)]
    #[derive(Debug)]
    pub(crate) struct SwapCache<A, T> {
        source: A,
        index: usize,
        cached: std::sync::Arc<T>,
    }

    #[cfg(loom_weak_swap)]
    impl<A: std::ops::Deref<Target = Swap<T>>, T> SwapCache<A, T> {
        pub(crate) fn new(source: A) -> Self {
            let (index, cached) = source.load_indexed();
            Self { source, index, cached }
        }
        pub(crate) fn load(&mut self) -> &std::sync::Arc<T> {
            if self.source.current.load(Ordering::Relaxed) != self.index {
                (self.index, self.cached) = self.source.load_indexed();
            }
            &self.cached
        }
    }

    #[cfg(loom_weak_swap)]
    impl<A: Clone, T> Clone for SwapCache<A, T> {
        fn clone(&self) -> Self {
            Self { source: self.source.clone(), index: self.index, cached: self.cached.clone() }
        }
    }

    /// loom stand-in for the scc map: a loom mutex around a `HashMap`,
    /// held only to copy a value out (so that readers of different keys
    /// still interleave freely in the models).
    pub(crate) struct Map<K, V>(loom::sync::Mutex<std::collections::HashMap<K, V>>);

    impl<K: std::hash::Hash + Eq + Clone, V: Clone> Map<K, V> {
        pub(crate) fn new() -> Self {
            Map(loom::sync::Mutex::new(std::collections::HashMap::new()))
        }
        pub(crate) fn with<R>(&self, key: &K, f: impl FnOnce(Option<&V>) -> R) -> R {
            let value = self.0.lock().unwrap().get(key).cloned();
            f(value.as_ref())
        }
        pub(crate) fn insert(&self, key: K, value: V) {
            self.0.lock().unwrap().insert(key, value);
        }
        pub(crate) fn remove(&self, key: &K) {
            self.0.lock().unwrap().remove(key);
        }
        pub(crate) fn len(&self) -> usize {
            self.0.lock().unwrap().len()
        }
        pub(crate) fn for_each(&self, mut f: impl FnMut(&K, &V)) {
            let all: Vec<(K, V)> = self.0.lock().unwrap().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            all.iter().for_each(|(k, v)| f(k, v));
        }
    }

    /// What [`Swap::load`] returns: derefs to the `Arc`, like arc-swap's guard.
    #[derive(Debug)]
    pub(crate) struct Guard<T>(std::sync::Arc<T>);

    impl<T> std::ops::Deref for Guard<T> {
        type Target = std::sync::Arc<T>;
        fn deref(&self) -> &std::sync::Arc<T> {
            &self.0
        }
    }
}

pub(crate) use imp::*;

/// Locks `mutex`, ignoring poisoning: every critical section in this crate
/// leaves its data consistent before anything in it can panic.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}
