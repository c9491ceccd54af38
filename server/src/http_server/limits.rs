//! The default connection limit: a third of the process's soft
//! `RLIMIT_NOFILE` less a reserve for everything else that needs a
//! descriptor (the frontend's event-plane connections, the admin listener,
//! log files, connections being closed). A third, because each client
//! connection holds two (its socket, and the second handle that watches for
//! the client's close, `hangup.rs`) and, with a request in flight, a
//! connection to a worker:
//!
//! `limit = (nofile - max(256, nofile / 4)) / 3`, at least 1.
//!
//! So 1024 descriptors give 256 connections, 2048 give 512, 20000 give
//! 5000, 1048576 give 262144. An unlimited `RLIMIT_NOFILE` counts as
//! 1048576 (2^20).

/// The reserve is at least this many descriptors.
pub const MIN_RESERVE: u64 = 256;

/// What an unlimited `RLIMIT_NOFILE` counts as.
const UNLIMITED: u64 = 1 << 20;

/// The default connection limit for this process (see the module docs).
pub fn default_max_connections() -> usize {
    let nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    max_connections_for(nofile)
}

/// The connection limit for a soft file limit of `nofile` (`None`: unlimited).
pub fn max_connections_for(nofile: Option<u64>) -> usize {
    let nofile = nofile.unwrap_or(UNLIMITED).min(UNLIMITED);
    let reserve = MIN_RESERVE.max(nofile / 4);
    usize::try_from((nofile.saturating_sub(reserve) / 3).max(1)).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_a_third_of_what_a_reserve_of_a_quarter_or_256_leaves() {
        assert_eq!(max_connections_for(Some(1024)), 256);
        assert_eq!(max_connections_for(Some(2048)), 512);
        assert_eq!(max_connections_for(Some(20_000)), 5_000);
        assert_eq!(max_connections_for(Some(300)), 14);
        assert_eq!(max_connections_for(Some(100)), 1, "at least one");
        assert_eq!(max_connections_for(None), 262_144);
        assert!(default_max_connections() >= 1);
    }
}
