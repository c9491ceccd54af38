//! The load event plane: workers push their registration and per-rank load
//! to every frontend over TCP, in `loadgate::wire` frames.
//!
//! - Worker side (`publisher.rs`): [`EventPublisher`], a std thread with one
//!   blocking connection per frontend; reconnects with backoff, coalesces
//!   reports (at most one per rank per millisecond), numbers them, and
//!   re-sends every rank's latest state as a heartbeat.
//! - Frontend side (`listener.rs`): [`EventPlane`], ONE mio thread that
//!   serves every worker connection and applies frames straight to the
//!   `WorkerMonitor`. A bad frame closes only its own connection; a worker
//!   whose last connection closes is deregistered after a grace period
//!   unless it reconnects.
//!
//! The two sides share nothing but the frame format, `loadgate::wire`.

mod listener;
mod publisher;
#[cfg(test)]
mod tests;

pub use self::listener::EventPlane;
pub use self::publisher::{EventPublisher, Registration};
