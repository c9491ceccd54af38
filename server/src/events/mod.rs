//! The load event plane: workers push their registration and per-rank load
//! to every frontend over TCP, in `loadgate::wire` frames.
//!
//! - Worker side (`publisher.rs`): [`EventPublisher`], one std thread and
//!   one blocking connection per frontend (a frontend that stops reading
//!   holds up only its own); reconnects with backoff, coalesces
//!   reports (at most one per rank per millisecond), numbers them, and
//!   re-sends every rank's latest state as a heartbeat. One [`ReportSeq`]
//!   per incarnation numbers the reports of every publisher of it.
//! - Frontend side (`listener.rs`): [`EventPlane`], ONE mio thread that
//!   serves every worker connection and applies frames straight to the
//!   `WorkerMonitor`, reading each connection fairly (a byte budget per
//!   round). A bad frame closes only its own connection.
//! - The handshake (`handshake.rs`): with the event secret, the frontend
//!   challenges each connection and applies no frame before a valid Proof;
//!   the worker checks the frontend's Welcome before it registers.
//! - Ownership (`ownership.rs`): a worker id belongs to the connection that
//!   registered it; after that connection closes it may register again (a
//!   reconnect or a restart) or is deregistered after a grace period.
//! - Limits (`limits.rs`): [`PlaneLimits`], a bound on everything a peer
//!   controls, each a frontend flag, including how long a connection may
//!   stay silent and how many may wait in the handshake; `plane_log.rs`
//!   caps the warn lines peers can cause (`crate::throttle`).
//! - Bind policy (`bind.rs`): without the secret, loopback only.
//! - Counters (`stats.rs`): [`PlaneStats`], the Load frames applied and the
//!   busy flips they caused, for `/metrics`.
//!
//! The two sides share nothing but the frame format, `loadgate::wire`.

mod bind;
mod handshake;
mod limits;
mod listener;
mod ownership;
mod plane_log;
mod publisher;
mod stats;
#[cfg(test)]
mod tests;

pub use self::bind::event_bind_host;
pub use self::limits::PlaneLimits;
pub use self::listener::{EventPlane, PlaneConfig};
pub use self::publisher::{EventPublisher, Registration, ReportSeq};
pub use self::stats::PlaneStats;
