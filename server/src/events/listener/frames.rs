//! What each frame does on the event plane's thread: the handshake's Proof
//! (with a secret) or the first Register (without one) establishes a
//! connection; Register, Load and Deregister then apply to the
//! `WorkerMonitor` and the `WorkerDirectory`, checked against the limits
//! and the ownership of the worker id.

use std::io::Write;

use bytes::BytesMut;
use loadgate::monitor::{Applied, Publisher, Registered};
use loadgate::wire::{self, Frame};
use loadgate::{LoadReport, WorkerId};
use mio::Token;

use super::{Auth, Close, Conn, PlaneServer};
use crate::events::handshake::answer_proof;

impl PlaneServer {
    /// Decodes and handles every complete frame in the buffer.
    pub(super) fn drain(&mut self, token: Token, conn: &mut Conn) -> Result<(), Close> {
        loop {
            let frame = match wire::decode(&mut conn.buf) {
                Ok(Some(frame)) => frame,
                Ok(None) => return Ok(()),
                Err(e) if matches!(conn.auth, Auth::Challenged(_)) => return Err(Close::Refused(e.to_string())),
                Err(e) => return Err(Close::Bad(e.to_string())),
            };
            match conn.auth {
                Auth::Challenged(nonce) => {
                    let Some(secrets) = self.config.secrets.as_deref() else {
                        return Err(Close::Refused("challenged without a secret".into()));
                    };
                    let welcome = answer_proof(secrets, &nonce, &frame).map_err(Close::Refused)?;
                    // Nothing was sent since the Challenge: the buffer takes it.
                    if !matches!(conn.stream.write(&welcome), Ok(n) if n == welcome.len()) {
                        return Err(Close::Refused("could not send the welcome".into()));
                    }
                    self.establish(token, conn);
                    tracing::debug!(peer = %conn.peer, "event connection authenticated");
                }
                Auth::Unregistered => {
                    self.apply(token, conn, frame)?;
                    if conn.worker.is_some() {
                        self.establish(token, conn);
                    }
                }
                Auth::Open => self.apply(token, conn, frame)?,
            }
        }
    }

    fn apply(&mut self, token: Token, conn: &mut Conn, frame: Frame) -> Result<(), Close> {
        match frame {
            Frame::Register { .. } => self.register(token, conn, frame),
            Frame::Load { worker, incarnation, rank, seq, load } => {
                if conn.worker != Some((worker, incarnation)) {
                    return Err(Close::Bad(format!(
                        "Load for worker {worker} from a connection that does not hold it"
                    )));
                }
                let report = LoadReport { worker, incarnation, rank, publisher: Publisher::Worker, seq, load };
                match self.monitor.apply(&report) {
                    Ok(Applied::OtherIncarnation) => {
                        tracing::debug!(worker, incarnation, "load of a replaced incarnation dropped");
                        Ok(())
                    }
                    Ok(applied @ (Applied::Stored | Applied::Flipped)) => {
                        self.config.stats.load_applied(applied == Applied::Flipped);
                        Ok(())
                    }
                    Ok(_) => Ok(()),
                    Err(e) => Err(Close::Bad(e.to_string())),
                }
            }
            Frame::Deregister { worker, incarnation } => {
                if conn.worker != Some((worker, incarnation)) {
                    return Err(Close::Bad(format!(
                        "Deregister for worker {worker} from a connection that does not hold it"
                    )));
                }
                conn.worker = None;
                conn.last_register = None;
                self.ownership.forget(worker);
                self.remove(worker, incarnation);
                Ok(())
            }
            other if matches!(conn.auth, Auth::Unregistered) => Err(Close::Refused(format!(
                "expected a Register, got a {} frame (this frontend has no event secret)",
                other.kind_name()
            ))),
            other => Err(Close::Bad(format!("unexpected {} frame", other.kind_name()))),
        }
    }

    /// A Register: checks the limits and the ownership of the id, then
    /// registers the worker and makes this connection its holder.
    fn register(&mut self, token: Token, conn: &mut Conn, frame: Frame) -> Result<(), Close> {
        let Frame::Register { worker, incarnation, dp_size, ref model, ref http_addr } = frame else {
            return Ok(());
        };
        if let Some((w, i)) = conn.worker.filter(|&held| held != (worker, incarnation)) {
            return Err(Close::Bad(format!(
                "connection registered worker {w} (incarnation {i}), then worker {worker} (incarnation {incarnation})"
            )));
        }
        if conn.last_register.as_ref() == Some(&frame) {
            return Ok(());
        }
        if self.directory.is_static(worker) {
            return Err(Close::Refused(format!("worker id {worker} is registered by --worker")));
        }
        if self.ownership.may_claim(worker, token).is_err() {
            return Err(self.held(conn, worker));
        }
        // An id another plane registered (NATS) has no connection here to
        // hold it: while that worker is heard, only the same life at the
        // same address (a worker on both planes) registers here; another
        // life or address waits until it is silent or gone, as an id a
        // connection holds waits for the connection. That holds too for an
        // id orphaned here whose life the other plane has replaced since.
        let current = self.monitor.incarnation(worker);
        let ours = self.ownership.incarnation(worker).is_some_and(|mine| current == Some(mine));
        let elsewhere = !ours
            && current.is_some_and(|held| self.directory.held_by_another_live(worker, held, incarnation, http_addr));
        if elsewhere {
            return Err(Close::Refused(format!("worker id {worker} is held by a live worker on the NATS plane")));
        }
        if let Err(why) = crate::directory::check_address(http_addr) {
            return Err(Close::Refused(format!("Register of worker {worker}: {why}")));
        }
        let limits = self.config.limits;
        if let Err(refusal) =
            limits.check_register(&self.monitor, &self.directory, worker, model, Some(http_addr), dp_size)
        {
            self.log.limit_hit(refusal.limit, &limits, &conn.peer, "Register refused");
            return Err(Close::Refused(format!("Register of {refusal}")));
        }
        // A new worker's address goes in first: the router may pick it as
        // soon as the monitor has it, and the proxy then needs its address
        // (a miss would quarantine a worker that just arrived). A known
        // worker keeps its entry (and its flags) until the monitor took the
        // Register.
        let new = !self.directory.contains(worker);
        if new && !self.directory.insert(worker, http_addr, dp_size) {
            return Err(Close::Refused(format!("worker id {worker} is registered by --worker")));
        }
        let outcome = match self.monitor.register(worker, model, dp_size, incarnation) {
            Ok(outcome) => outcome,
            Err(e) => {
                if new {
                    self.directory.remove(worker);
                }
                return Err(Close::Refused(format!("Register of worker {worker}: {e}")));
            }
        };
        let same = outcome == Registered::Same;
        if !new && !self.directory.insert_again(worker, http_addr, dp_size, same) {
            return Err(Close::Refused(format!("worker id {worker} is registered by --worker")));
        }
        // Its entry's flags, in the monitor's view of this incarnation.
        self.directory.sync(worker);
        // Checked above: no other live connection holds it.
        let _ = self.ownership.claim(worker, incarnation, token);
        conn.worker = Some((worker, incarnation));
        // A worker may register and leave in a loop (a sidecar whose engine
        // flaps): the bucket of authenticated connections.
        let line = || self.log.connection_line(true);
        match outcome {
            Registered::New => {
                if let Some(suppressed) = line() {
                    tracing::info!(worker, incarnation, ?model, dp_size, ?http_addr, suppressed, "worker registered")
                }
            }
            Registered::Restarted => {
                if let Some(suppressed) = line() {
                    tracing::info!(
                        worker,
                        incarnation,
                        ?model,
                        dp_size,
                        ?http_addr,
                        suppressed,
                        "worker restarted; load reset"
                    )
                }
            }
            Registered::Same => tracing::debug!(worker, incarnation, "worker registered again"),
        }
        conn.last_register = Some(frame);
        Ok(())
    }

    /// A Register for `worker`, which another live connection holds: tells
    /// `conn` who holds it (the holder's Register, sent back before the
    /// close: the worker reads it when its next write fails, and logs it),
    /// and the refusal naming the holder's address.
    fn held(&self, conn: &mut Conn, worker: WorkerId) -> Close {
        let holder = self.ownership.holder(worker).and_then(|token| self.conns.get(&token));
        let Some(holder) = holder else {
            return Close::Refused(format!("worker id {worker} is held by a live connection"));
        };
        if let Some(register) = &holder.last_register {
            let mut buf = BytesMut::new();
            // It was decoded from a frame: it fits in one. Best effort: a
            // refused connection's send buffer holds at most the Welcome.
            if wire::encode(register, &mut buf).is_ok() {
                let _ = conn.stream.write(&buf);
            }
        }
        Close::Refused(format!("worker id {worker} is held by a live connection from {}", holder.peer))
    }

    /// Deregisters `worker` if `incarnation` is still its current one (a
    /// restarted worker that registered anew stays).
    pub(super) fn remove(&mut self, worker: WorkerId, incarnation: u64) {
        if self.monitor.deregister_incarnation(worker, incarnation) {
            self.directory.remove(worker);
            // As a registration's line: a worker may leave in a loop.
            if let Some(suppressed) = self.log.connection_line(true) {
                tracing::info!(worker, incarnation, suppressed, "worker deregistered");
            }
        }
    }
}
