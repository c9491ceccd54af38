//! [`Link`]: the plane's view of its NATS connection, read from the client
//! itself (its state, and how many times it connected), never from its
//! events alone: the client queues at most 128 events and drops the rest,
//! and a flood past `--nats-buffer` raises one per message dropped, so a
//! Disconnected or a Connected can be lost among them. A lost Disconnected
//! made an outage the workers' silence (every worker out of routing, then
//! forgotten); a lost Connected made every later silence an outage.

use std::sync::atomic::Ordering;

/// The frontend's NATS connection, as the client says it is.
pub(super) struct Link {
    client: async_nats::Client,
    /// The client's count of connections when a reconnection was last
    /// handled (the first connection included).
    handled: u64,
}

impl Link {
    pub(super) fn new(client: async_nats::Client) -> Self {
        let handled = connects(&client);
        Link { client, handled }
    }

    /// Connected to NATS now.
    pub(super) fn connected(&self) -> bool {
        crate::nats::state::connected(&self.client)
    }

    /// Whether the client connected again since the last call that said
    /// so (or since [`Link::new`]).
    pub(super) fn reconnected(&mut self) -> bool {
        let now = connects(&self.client);
        now != std::mem::replace(&mut self.handled, now)
    }
}

/// How many times `client` connected: counted before its Connected event
/// is raised (and before it subscribes again).
fn connects(client: &async_nats::Client) -> u64 {
    // Relaxed: a count compared with the last one read; nothing else is
    // read through it.
    client.statistics().connects.load(Ordering::Relaxed)
}
