//! [`connected`]: whether a NATS client is connected now, as the client's
//! own state says (its events may be dropped: see `plane::link`).

/// Whether `client` is connected to NATS now.
pub(crate) fn connected(client: &async_nats::Client) -> bool {
    client.connection_state() == async_nats::connection::State::Connected
}
