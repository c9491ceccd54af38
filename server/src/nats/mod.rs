//! The NATS event plane (`--event-plane nats`, issue 25): workers publish
//! their registration, load and deregistration to subjects of one NATS
//! server (or cluster), each frame sealed under the event secret
//! (`loadgate::wire::envelope`); every frontend subscribes and applies them
//! as it does the TCP plane's. No W × F mesh: a worker holds one connection
//! to NATS whatever the number of frontends, and a frontend that starts
//! late asks every worker to announce itself again.
//!
//! Subjects, per namespace (`--nats-namespace`, default `loadgate`):
//!
//! | subject | publisher | payload |
//! |---|---|---|
//! | `{ns}.ev.{model}.{worker}` | a worker | one sealed frame: Register, Load or Deregister |
//! | `{ns}.hello` | a frontend, at start and after each reconnect | empty: every worker re-sends its registration and latest load |
//! | `{ns}.fe.{frontend}` | a frontend sharing its load | one sealed frame: FrontendLoad, FrontendBeat or FrontendAck ([`sharing`]) |
//!
//! `{model}` is the model name with every byte outside `A-Z a-z 0-9 _ -`
//! written `~XX` (hex), so that no model name can add tokens or wildcards.
//!
//! Connection settings (`NatsArgs`): the URL (`nats://` or `tls://`),
//! credentials read from files or environment variables (never a flag's
//! value), a CA file for TLS; the client reconnects by itself with
//! backoff, and its buffers are bounded.

mod args;
mod plane;
mod publisher;
mod seal_clock;
pub(crate) mod sharing;
mod state;
mod subjects;

pub(crate) use self::args::{EventPlaneKind, NatsArgs};
pub(crate) use self::plane::{NatsPlane, Sharing};
pub(crate) use self::publisher::{NatsLink, NatsPublisher};
pub(crate) use self::subjects::Subjects;
