//! The event plane's time bounds: a connection becomes established (the
//! idle timeout and the silence watch start), a silent worker speaks again,
//! and [`PlaneServer::expire`] closes connections whose handshake ran out of
//! time or that stayed idle, takes silent workers out of routing and
//! deregisters workers whose grace passed without a new holder.

use std::cmp::Reverse;
use std::time::Instant;

use mio::Token;

use super::{Auth, Close, Conn, PlaneServer};
use crate::events::handshake::HANDSHAKE_TIMEOUT;

impl PlaneServer {
    /// `conn` authenticated (or, without a secret, registered): no longer
    /// pending; from now on the idle timeout applies.
    pub(super) fn establish(&mut self, token: Token, conn: &mut Conn) {
        conn.auth = Auth::Open;
        self.pending.remove(&token);
        self.idle.push(Reverse((conn.last_read + self.config.limits.event_idle_timeout, token)));
        self.silence.push(Reverse((conn.last_read + self.config.silence, token)));
    }

    /// Bytes arrived on `conn`, which had been silent: its worker rejoins
    /// routing, and its silence is watched again.
    pub(super) fn speaks_again(&mut self, token: Token, conn: &mut Conn) {
        conn.silent = false;
        if let Some((worker, incarnation)) = conn.worker {
            if self.set_silent(worker, incarnation, false) {
                tracing::info!(worker, peer = %conn.peer, "worker reports again; back in routing");
            }
        }
        self.silence.push(Reverse((conn.last_read + self.config.silence, token)));
    }

    /// When the oldest pending connection's handshake times out.
    pub(super) fn next_handshake_deadline(&self) -> Option<Instant> {
        let token = self.pending.first()?;
        self.conns.get(token).map(|c| c.opened + HANDSHAKE_TIMEOUT)
    }

    /// The earliest idle deadline (possibly stale: checked when due).
    pub(super) fn next_idle_deadline(&self) -> Option<Instant> {
        self.idle.peek().map(|Reverse((at, _))| *at)
    }

    /// Closes connections whose handshake ran out of time and established
    /// ones silent for the idle timeout, and deregisters workers whose grace
    /// passed without a new holder.
    pub(super) fn expire(&mut self) {
        let now = Instant::now();
        while let Some(&token) = self.pending.first() {
            let Some(conn) = self.conns.get(&token) else {
                self.pending.remove(&token);
                continue;
            };
            if conn.opened + HANDSHAKE_TIMEOUT > now {
                break;
            }
            let reason = match conn.auth {
                Auth::Unregistered => format!("no Register within {HANDSHAKE_TIMEOUT:?}"),
                _ => format!("no Proof within {HANDSHAKE_TIMEOUT:?}"),
            };
            if let Some(conn) = self.conns.remove(&token) {
                self.close(token, conn, Close::Refused(reason));
            }
        }
        let timeout = self.config.limits.event_idle_timeout;
        while let Some(&Reverse((_, token))) = self.idle.peek().filter(|Reverse((at, _))| *at <= now) {
            self.idle.pop();
            let Some(conn) = self.conns.get(&token) else { continue };
            let due = conn.last_read + timeout;
            if due > now {
                // Bytes came since this entry was pushed: check again then.
                self.idle.push(Reverse((due, token)));
                continue;
            }
            if let Some(conn) = self.conns.remove(&token) {
                let reason = format!(
                    "nothing received for {timeout:?} (--event-idle-timeout-ms {}): the peer is gone or stalled",
                    timeout.as_millis()
                );
                self.close(token, conn, Close::Bad(reason));
            }
        }
        let silence = self.config.silence;
        while let Some(&Reverse((_, token))) = self.silence.peek().filter(|Reverse((at, _))| *at <= now) {
            self.silence.pop();
            let Some(conn) = self.conns.get_mut(&token) else { continue };
            let due = conn.last_read + silence;
            if due > now {
                self.silence.push(Reverse((due, token)));
                continue;
            }
            conn.silent = true;
            let (registered, peer) = (conn.worker, conn.peer);
            if let Some((worker, incarnation)) = registered {
                if self.set_silent(worker, incarnation, true) {
                    tracing::warn!(
                        worker,
                        %peer,
                        "nothing received for {silence:?} (--event-silence-ms, or a smaller --load-staleness-ms): worker out of routing until it reports"
                    );
                }
            }
        }
        for (worker, incarnation) in self.ownership.expire(now) {
            self.remove(worker, incarnation);
        }
    }
}
