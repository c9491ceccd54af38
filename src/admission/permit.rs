//! [`Permit`] and [`ScopedPermit`]: one engine slot, released on drop.

use std::fmt;

use super::Admission;
use crate::sync::Arc;

/// One engine slot; released when dropped (finished, failed, panicked or
/// cancelled alike).
#[must_use = "dropping a permit releases its slot at once"]
pub struct Permit<T> {
    pub(super) admission: Option<Arc<Admission<T>>>,
}

impl<T> Permit<T> {
    pub(super) fn new(admission: Arc<Admission<T>>) -> Self {
        Permit { admission: Some(admission) }
    }
}

impl<T> fmt::Debug for Permit<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Permit")
    }
}

impl<T> Drop for Permit<T> {
    fn drop(&mut self) {
        if let Some(admission) = self.admission.take() {
            admission.release();
        }
    }
}

/// One engine slot held within the caller's scope, from
/// [`Admission::try_admit_scoped`]; released when dropped.
#[must_use = "dropping a permit releases its slot at once"]
pub struct ScopedPermit<'a, T> {
    pub(super) admission: &'a Arc<Admission<T>>,
}

impl<T> ScopedPermit<'_, T> {
    /// The same slot as a [`Permit`] that owns a reference to its gate (to
    /// move into a task).
    pub fn into_owned(self) -> Permit<T> {
        let admission = self.admission.clone();
        // The slot now belongs to the owned permit: skip this one's release.
        std::mem::forget(self);
        Permit::new(admission)
    }
}

impl<T> fmt::Debug for ScopedPermit<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ScopedPermit")
    }
}

impl<T> Drop for ScopedPermit<'_, T> {
    fn drop(&mut self) {
        self.admission.release();
    }
}
