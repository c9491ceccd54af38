//! Frontends that count together (issue 26): with `--event-plane nats`,
//! each frontend publishes the load it added to each worker (what its
//! router tracks: dispatched and not yet ended) and hears every other
//! frontend's, which its monitor keeps apart (`Publisher::Frontend`) and
//! sums with its own tracking (see `loadgate::monitor::SharedLoad`).
//!
//! | subject | publisher | payload |
//! |---|---|---|
//! | `{ns}.fe.{frontend}` | a frontend | sealed FrontendLoad (one rank of one worker), FrontendBeat (in flight, waiting, and each model's waiting) or FrontendAck (which of the others' FrontendLoads it applied) |
//!
//! - [`changes`]: the requests' tracking notes which (worker, rank) changed;
//! - [`publish`]: the own side, publishing each change at once and a beat
//!   every `--share-heartbeat-ms` (which renews every load published), with
//!   a slice of the loads again per beat ([`rotation`]);
//! - [`peers`]: the other frontends, each given one of `--max-frontends`
//!   monitor slots, renewed at each of their beats, dropped three
//!   heartbeats after their last frame; what this one applied of each
//!   goes back to it in acks;
//! - [`reference`]: the lease's reference, from the others' acks of this
//!   frontend's frames.

pub(crate) mod changes;
#[cfg(test)]
mod lease_model;
pub(crate) mod peers;
pub(crate) mod publish;
pub(crate) mod reference;
mod rotation;

use std::time::Duration;

/// How frontends share their load (frontend flags).
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct SharingArgs {
    /// With --event-plane nats: publish the load this frontend adds to each worker and count the
    /// other frontends' (the busy decision uses the larger of a worker's own report and the sum of
    /// every frontend's). `false`: each frontend counts only its own (for comparison).
    #[arg(long, env = "LOADGATE_FRONTEND_SHARE_LOAD", value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set,
          value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) share_load: bool,
    /// The most other frontends whose load is counted (each costs every worker rank a slot);
    /// frames of more are dropped (counted).
    #[arg(long, env = "LOADGATE_FRONTEND_MAX_FRONTENDS", value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub(crate) max_frontends: u16,
    /// Milliseconds between this frontend's beats (each renews the load it published); another
    /// frontend's load stops counting three beats after its last frame.
    #[arg(long, alias = "frontend-heartbeat-ms", env = "LOADGATE_FRONTEND_SHARE_HEARTBEAT_MS", value_name = "MS", default_value_t = 200, value_parser = crate::flag_limits::ms(10))]
    pub(crate) share_heartbeat_ms: u64,
    /// The lease: what this frontend adds to a worker before the other frontends have applied it
    /// (they acknowledge what they applied) stays within its 1/k share of the headroom everyone has
    /// seen (k live frontends), so k frontends admitting at once overshoot a threshold by at most k
    /// requests. `false`: the sum alone (k frontends admitting at once can overshoot up to k times).
    #[arg(long, alias = "frontend-lease", env = "LOADGATE_FRONTEND_SHARE_LEASE", value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set,
          value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) share_lease: bool,
    /// Whose figures the computed retry hint works from, sharing load: `pool` (every live
    /// frontend's requests in flight and waiting, from their beats) or `frontend` (this one's
    /// alone, as without sharing).
    #[arg(long, env = "LOADGATE_FRONTEND_RETRY_HINT_SCOPE", value_enum, default_value = "pool")]
    pub(crate) retry_hint_scope: HintScope,
}

/// Whose figures the retry hint works from (`--retry-hint-scope`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum HintScope {
    /// Every live frontend's.
    Pool,
    /// This frontend's alone.
    Frontend,
}

impl SharingArgs {
    /// The beat period.
    pub(crate) fn heartbeat(&self) -> Duration {
        Duration::from_millis(self.share_heartbeat_ms)
    }

    /// How long another frontend's publication counts: three beats.
    pub(crate) fn staleness(&self) -> Duration {
        3 * self.heartbeat()
    }
}
