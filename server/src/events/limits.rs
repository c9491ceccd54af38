//! [`PlaneLimits`]: a bound on everything an event-plane peer controls (and
//! on what a `--worker URL`'s `/info` names), and the checks of a
//! registration against them. The warn lines when one is hit:
//! `plane_log.rs`.

use std::time::Duration;

use loadgate::{WorkerId, WorkerMonitor};

use crate::directory::WorkerDirectory;

/// Bounds on what event-plane peers may make the frontend hold. Each one is
/// a frontend flag; `Default` gives the documented defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlaneLimits {
    /// `--max-dp-size`: the largest dp size a Register may name.
    pub max_dp_size: u32,
    /// `--max-event-connections`: open event connections, pending ones
    /// included; at it, a new connection evicts the oldest pending one, or
    /// is accepted and closed at once when none is pending.
    pub max_event_connections: usize,
    /// `--max-workers`: registered workers (event plane and `--worker`); a
    /// Register for a new id past it is refused.
    pub max_workers: usize,
    /// `--max-models`: distinct models; a Register naming a new model past
    /// it is refused.
    pub max_models: usize,
    /// `--max-name-len`: bytes of a Register's model name and of its HTTP
    /// address.
    pub max_name_len: usize,
    /// `--event-read-budget`: bytes read from one connection per poll round
    /// (fair reading); at least 1 is used.
    pub event_read_budget: usize,
    /// `--max-pending-handshakes`: connections not yet authenticated (or,
    /// without a secret, not yet registered); a new one past it evicts the
    /// oldest of them. At least 1 is used.
    pub max_pending_handshakes: usize,
    /// `--event-idle-timeout-ms`: an established connection that sends
    /// nothing for this long is closed (a worker host that vanished without
    /// closing its connection must not hold its id). Keep it at least 5x the
    /// workers' `--heartbeat-ms`.
    pub event_idle_timeout: Duration,
}

impl Default for PlaneLimits {
    fn default() -> Self {
        PlaneLimits {
            max_dp_size: 256,
            max_event_connections: 1024,
            max_workers: 1024,
            max_models: 256,
            max_name_len: 256,
            event_read_budget: 16 * 1024,
            max_pending_handshakes: 64,
            event_idle_timeout: Duration::from_millis(2000),
        }
    }
}

impl PlaneLimits {
    /// Checks a registration of `worker` for `model` with `dp_size` ranks
    /// (and `http_addr`, when a peer named it) against the limits: name
    /// lengths, dp size, and room for a new worker and a new model.
    ///
    /// # Errors
    ///
    /// The limit that refuses it, with a message naming its flag.
    pub fn check_register(
        &self,
        monitor: &WorkerMonitor,
        directory: &WorkerDirectory,
        worker: WorkerId,
        model: &str,
        http_addr: Option<&str>,
        dp_size: u32,
    ) -> Result<(), LimitRefusal> {
        let refuse = |limit, message| Err(LimitRefusal { limit, message });
        let addr_len = http_addr.map_or(0, str::len);
        if model.len() > self.max_name_len || addr_len > self.max_name_len {
            let what = match http_addr {
                Some(_) => format!("model name ({} bytes) or address ({addr_len} bytes)", model.len()),
                None => format!("model name ({} bytes)", model.len()),
            };
            return refuse(
                Limit::NameLen,
                format!("worker {worker}: {what} over --max-name-len {}", self.max_name_len),
            );
        }
        if dp_size > self.max_dp_size {
            return refuse(
                Limit::DpSize,
                format!("worker {worker}: dp size {dp_size} over --max-dp-size {}", self.max_dp_size),
            );
        }
        if !directory.contains(worker) && directory.len() >= self.max_workers {
            return refuse(
                Limit::Workers,
                format!("worker {worker}: already {} workers (--max-workers {})", directory.len(), self.max_workers),
            );
        }
        if monitor.adds_model(worker, model) && monitor.model_count() >= self.max_models {
            return refuse(
                Limit::Models,
                format!("worker {worker}: a new model past --max-models {}", self.max_models),
            );
        }
        Ok(())
    }
}

/// A registration refused by a limit.
#[derive(Debug)]
pub struct LimitRefusal {
    /// The limit.
    pub(super) limit: Limit,
    /// What was refused and why, naming the flag.
    pub message: String,
}

impl std::fmt::Display for LimitRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Which limit was hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Limit {
    DpSize,
    EventConnections,
    Workers,
    Models,
    NameLen,
    PendingHandshakes,
}

impl Limit {
    /// How many limits there are.
    pub(super) const ALL: usize = 6;

    /// The flag that sets it.
    pub(super) fn flag(self) -> &'static str {
        match self {
            Limit::DpSize => "--max-dp-size",
            Limit::EventConnections => "--max-event-connections",
            Limit::Workers => "--max-workers",
            Limit::Models => "--max-models",
            Limit::NameLen => "--max-name-len",
            Limit::PendingHandshakes => "--max-pending-handshakes",
        }
    }

    /// Its value in `limits`.
    pub(super) fn value(self, limits: &PlaneLimits) -> u64 {
        let value = match self {
            Limit::DpSize => return u64::from(limits.max_dp_size),
            Limit::EventConnections => limits.max_event_connections,
            Limit::Workers => limits.max_workers,
            Limit::Models => limits.max_models,
            Limit::NameLen => limits.max_name_len,
            Limit::PendingHandshakes => limits.max_pending_handshakes,
        };
        u64::try_from(value).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_values_are_the_documented_ones() {
        let limits = PlaneLimits::default();
        let all = [
            Limit::DpSize,
            Limit::EventConnections,
            Limit::Workers,
            Limit::Models,
            Limit::NameLen,
            Limit::PendingHandshakes,
        ];
        let named: Vec<_> = all.iter().map(|l| format!("{} {}", l.flag(), l.value(&limits))).collect();
        assert_eq!(
            named,
            [
                "--max-dp-size 256",
                "--max-event-connections 1024",
                "--max-workers 1024",
                "--max-models 256",
                "--max-name-len 256",
                "--max-pending-handshakes 64",
            ]
        );
        assert_eq!(limits.event_read_budget, 16_384);
        assert_eq!(limits.event_idle_timeout, Duration::from_millis(2000));
    }
}
