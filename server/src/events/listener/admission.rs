//! Which new connection the event plane takes, and when: eviction by
//! behaviour among the pending handshakes.
//!
//! Every pending connection (challenged, or without a secret not yet
//! registered) gets its share of the handshake deadline,
//! [`ANSWER_SHARE`]: an honest peer answers a Challenge in one round trip,
//! so one still silent after its share has shown how it behaves. A new
//! connection that finds no room may evict a pending one only when that
//! one is past its share without an answer (the oldest first); a pending
//! connection within its share is never evicted, so a flood of connections
//! that never answer cannot evict a handshake that answers within its
//! share, however fast the flood comes. When there is no room:
//!
//! - past `--max-pending-handshakes`, with every pending connection within
//!   its share: new connections wait in the listen backlog (not accepted)
//!   until one answers, closes, or comes past its share. The kernel bounds
//!   the backlog, and a flood that fills it waits on its own connects, so a
//!   worker behind `B` held connections waits at most about
//!   `B × ANSWER_SHARE / max_pending` (128 × 250 ms / 64 = 0.5 s with the
//!   defaults and std's backlog of 128);
//! - at `--max-event-connections`: a new connection evicts one past its
//!   share, or is accepted and closed at once (also when every connection
//!   is established: those are never evicted).
//!
//! A pending connection past its share and with no one waiting for its
//! place keeps it until the handshake deadline (`HANDSHAKE_TIMEOUT`).

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Interest, Token};

use super::{Auth, Close, Conn, PlaneServer, ACCEPTS_PER_ROUND, ACCEPT_RETRY};
use crate::events::handshake::{challenge_frame, fresh_nonce, HANDSHAKE_TIMEOUT};
use crate::events::limits::Limit;

/// A pending connection's share of the handshake deadline: within it, it
/// is never evicted. An eighth of [`HANDSHAKE_TIMEOUT`] (250 ms): many
/// round trips even between continents, and ample for a busy host to
/// schedule the worker's answer (a worker answers in about a millisecond).
pub(crate) const ANSWER_SHARE: Duration = Duration::from_millis(HANDSHAKE_TIMEOUT.as_millis() as u64 / 8);

/// What a new connection may have now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Room {
    /// Under both limits.
    Free,
    /// The oldest pending connection is past its share: evict it for the
    /// new one (which limit: for the log).
    EvictOverdue(Limit),
    /// At `--max-event-connections` and nothing evictable: accept the new
    /// connection and close it at once.
    CloseAtOnce,
    /// Past `--max-pending-handshakes`, every pending one within its share:
    /// leave new connections in the backlog until then.
    WaitUntil(Instant),
}

impl PlaneServer {
    /// When the listener should be served next: now (or earlier) when an
    /// accept may proceed, later when new connections wait for a pending
    /// one's share to pass, `None` when there is nothing to accept.
    pub(super) fn next_accept(&self, now: Instant) -> Option<Instant> {
        if !self.listener_ready {
            return None;
        }
        match self.room(now) {
            Room::WaitUntil(at) => Some(at),
            _ => Some(now),
        }
    }

    /// When the oldest pending connection was accepted.
    fn oldest_pending(&self) -> Option<Instant> {
        self.pending.iter().find_map(|token| self.conns.get(token).map(|c| c.opened))
    }

    fn room(&self, now: Instant) -> Room {
        let limits = self.config.limits;
        let pending_full = self.pending.len() >= limits.max_pending_handshakes.max(1);
        let conns_full = self.conns.len() >= limits.max_event_connections;
        let limit = if conns_full { Limit::EventConnections } else { Limit::PendingHandshakes };
        match (pending_full || conns_full, self.oldest_pending()) {
            (false, _) => Room::Free,
            (true, Some(opened)) if opened + ANSWER_SHARE <= now => Room::EvictOverdue(limit),
            (true, _) if conns_full => Room::CloseAtOnce,
            (true, Some(opened)) => Room::WaitUntil(opened + ANSWER_SHARE),
            // Not reached: pending_full needs a pending connection.
            (true, None) => Room::CloseAtOnce,
        }
    }

    /// Accepts up to [`ACCEPTS_PER_ROUND`] connections, while there is room
    /// for them (see the module docs).
    pub(super) fn accept(&mut self) {
        let limits = self.config.limits;
        for _ in 0..ACCEPTS_PER_ROUND {
            let room = self.room(Instant::now());
            if let Room::WaitUntil(_) = room {
                let what = "new connections wait in the listen backlog: every pending one is within its share";
                self.log.limit_hit(Limit::PendingHandshakes, &limits, &"the event listener", what);
                return;
            }
            let (stream, peer) = match self.listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.listener_ready = false;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // E.g. out of file descriptors: the connections waiting
                    // in the backlog raise no new readiness, so retry after
                    // a pause (not in a busy loop, and not only when another
                    // connection happens to arrive).
                    if let Some(suppressed) = self.accept_warnings.admit() {
                        tracing::warn!(error = %e, suppressed, "event port accept failed; retrying");
                    }
                    self.listener_ready = false;
                    self.accept_retry = Some(Instant::now() + ACCEPT_RETRY);
                    return;
                }
            };
            match room {
                Room::Free => {}
                Room::EvictOverdue(limit) => {
                    self.evict_oldest_pending();
                    let what = "a pending connection silent past its share evicted";
                    self.log.limit_hit(limit, &limits, &peer, what);
                }
                Room::CloseAtOnce | Room::WaitUntil(_) => {
                    self.log.limit_hit(Limit::EventConnections, &limits, &peer, "connection closed at once");
                    continue;
                }
            }
            self.admit(stream, peer);
        }
    }

    /// Takes one accepted connection (there is room for it), challenged
    /// (with a secret) and watched. No TCP keepalive: the deadlines watch
    /// silence (see "No TCP keepalive" in `listener.rs`).
    fn admit(&mut self, mut stream: TcpStream, peer: SocketAddr) {
        let _ = stream.set_nodelay(true);
        let auth = match &self.config.secrets {
            None => Auth::Unregistered,
            Some(_) => {
                let nonce = match fresh_nonce() {
                    Ok(nonce) => nonce,
                    Err(e) => {
                        tracing::error!(%peer, error = %e, "event connection refused: no nonce");
                        return;
                    }
                };
                // A fresh socket's send buffer takes the 36 bytes whole.
                let challenge = challenge_frame(&nonce);
                if !matches!(io::Write::write(&mut stream, &challenge), Ok(n) if n == challenge.len()) {
                    // A peer that connects and resets at once: anyone can.
                    if let Some(suppressed) = self.log.connection_line(false) {
                        tracing::warn!(%peer, suppressed, "event connection refused: could not send the challenge");
                    }
                    return;
                }
                Auth::Challenged(nonce)
            }
        };
        let token = Token(self.next_token);
        self.next_token += 1;
        if let Err(e) = self.poll.registry().register(&mut stream, token, Interest::READABLE) {
            tracing::warn!(%peer, error = %e, "could not watch event connection");
            return;
        }
        self.pending.insert(token);
        tracing::debug!(%peer, "event connection opened");
        let now = Instant::now();
        let conn = Conn {
            stream,
            peer,
            buf: bytes::BytesMut::new(),
            auth,
            opened: now,
            last_read: now,
            worker: None,
            last_register: None,
            queued: false,
            silent: false,
        };
        self.conns.insert(token, conn);
        // Bytes may have arrived with the connection.
        self.mark_ready(token);
    }

    /// Closes the oldest pending connection; false when none is pending.
    fn evict_oldest_pending(&mut self) -> bool {
        while let Some(token) = self.pending.pop_first() {
            if let Some(conn) = self.conns.remove(&token) {
                self.close(token, conn, Close::Evicted);
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_is_an_eighth_of_the_handshake_deadline() {
        assert_eq!(ANSWER_SHARE * 8, HANDSHAKE_TIMEOUT);
        assert_eq!(ANSWER_SHARE, Duration::from_millis(250));
    }
}
