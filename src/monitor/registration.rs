//! [`Registration`]: a worker's registration by name (who, which model, how
//! many ranks, which life), for [`WorkerMonitor::register_worker`].

use crate::load::WorkerId;
use crate::monitor::error::RegisterError;
use crate::monitor::{Registered, WorkerMonitor};

/// What a worker registers with: its id and model, and, where the defaults
/// do not fit, its data-parallel size (default 1) and incarnation (default
/// 0: pick one per process start, e.g. its start time in nanoseconds, so a
/// restart is told from a reconnect).
///
/// # Examples
///
/// ```
/// use loadgate::monitor::{Registered, Registration};
/// use loadgate::WorkerMonitor;
///
/// let monitor = WorkerMonitor::new(Default::default()).unwrap();
/// let llama = Registration::new(1, "llama").dp_size(2).incarnation(100);
/// assert_eq!(monitor.register_worker(llama), Ok(Registered::New));
/// assert_eq!(monitor.register_worker(llama), Ok(Registered::Same)); // a reconnect
/// assert_eq!(monitor.register_worker(llama.incarnation(101)), Ok(Registered::Restarted));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a registration does nothing until `register_worker` takes it"]
pub struct Registration<'a> {
    worker: WorkerId,
    model: &'a str,
    dp_size: u32,
    incarnation: u64,
}

impl<'a> Registration<'a> {
    /// Worker `worker` serving `model`, with one rank, incarnation 0.
    pub fn new(worker: WorkerId, model: &'a str) -> Self {
        Registration { worker, model, dp_size: 1, incarnation: 0 }
    }

    /// `dp_size` data-parallel ranks (reports name ranks `0..dp_size`).
    pub fn dp_size(self, dp_size: u32) -> Self {
        Registration { dp_size, ..self }
    }

    /// The incarnation its reports carry (see
    /// [`LoadReport`](crate::LoadReport)'s freshness contract).
    pub fn incarnation(self, incarnation: u64) -> Self {
        Registration { incarnation, ..self }
    }
}

impl WorkerMonitor {
    /// Registers a worker as `registration` names it: the preferred form of
    /// [`register`](Self::register), whose four positional values it
    /// names (same outcomes, same errors).
    ///
    /// # Errors
    ///
    /// [`RegisterError`] for a zero or huge dp size, an empty model name, or
    /// a reconnect that names another model or dp size.
    pub fn register_worker(&self, registration: Registration<'_>) -> Result<Registered, RegisterError> {
        let Registration { worker, model, dp_size, incarnation } = registration;
        self.register(worker, model, dp_size, incarnation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::MonitorConfig;

    #[test]
    fn defaults_and_errors_are_registers() {
        let monitor = WorkerMonitor::new(MonitorConfig::default()).unwrap();
        assert_eq!(monitor.register_worker(Registration::new(1, "m")), Ok(Registered::New));
        assert_eq!(monitor.incarnation(1), Some(0));
        assert_eq!(monitor.workers()[0].dp_size, 1);
        assert_eq!(
            monitor.register_worker(Registration::new(1, "m").dp_size(2)),
            Err(RegisterError::Conflict(1)),
            "a reconnect with another dp size"
        );
        assert_eq!(monitor.register_worker(Registration::new(2, "")), Err(RegisterError::EmptyModel));
        assert_eq!(monitor.register_worker(Registration::new(2, "m").dp_size(0)), Err(RegisterError::InvalidDpSize(0)));
        assert_eq!(monitor.register_worker(Registration::new(1, "n").incarnation(9)), Ok(Registered::Restarted));
        assert_eq!((monitor.incarnation(1), monitor.models()), (Some(9), vec!["n".to_owned()]));
    }

    #[test]
    fn only_an_id_not_registered_counts_as_a_registration() {
        let monitor = WorkerMonitor::new(MonitorConfig::default()).unwrap();
        assert_eq!(monitor.registrations(), 0);
        monitor.register(1, "m", 1, 1).unwrap();
        monitor.register(1, "m", 1, 1).unwrap(); // a reconnect
        monitor.register(1, "m", 1, 2).unwrap(); // a restart
        let _ = monitor.register(2, "", 1, 1); // refused
        assert_eq!(monitor.registrations(), 1);
        monitor.deregister(1);
        monitor.register(1, "m", 1, 2).unwrap();
        assert_eq!(monitor.registrations(), 2, "registered again after it left");
    }
}
