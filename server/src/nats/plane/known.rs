//! [`Known`]: a worker the NATS plane registered, one life of it.

use std::time::Instant;

/// A worker the plane registered.
pub(super) struct Known {
    pub(super) incarnation: u64,
    /// Its subject (every frame of it must come on it).
    pub(super) subject: String,
    /// When the Register that made this life was sealed.
    pub(super) since_ms: u64,
    pub(super) heard: Instant,
    pub(super) silent: bool,
}
