//! One attempt against an upstream — a loadgate worker or a real engine —
//! shared by the frontend's proxy (`frontend/proxy.rs`, which routes and
//! migrates) and the worker's sidecar (`worker/sidecar/forward.rs`, which
//! takes an engine slot first):
//!
//! - the HTTP client to upstreams (`client.rs`);
//! - the request: the body as received or, for llama.cpp, rewritten to a
//!   stream once per request and counted in the body budget ([`Payload`],
//!   `payload.rs`, which lets go of the body once an upstream has it), on a
//!   connection of its own for llama.cpp;
//! - the deadlines: connect, first byte (head and first body bytes: the
//!   first token of a stream, the whole answer of a non-streamed request),
//!   between chunks (`chunk_timeout.rs`) — [`Timeouts`];
//! - the first-chunk probe, so that an upstream that sends its head and
//!   then nothing still gets a clean failure (nothing was relayed yet);
//! - the answer: relayed by a task of its own (`relay.rs`: what the request
//!   holds follows the upstream, not the client), assembled whole for a
//!   non-streamed request sent streamed (`assemble.rs`), or the upstream's
//!   own error read within bounds;
//! - what went wrong ([`Failure`], `failure.rs`): a refusal at capacity
//!   (the explicit `x-loadgate-refusal` signal alone), a timeout, a broken
//!   transport — and whether the upstream had taken the request
//!   ([`Outcome::Cut`]) or not ([`Outcome::Failed`], migratable). A
//!   sidecar whose engine did not take a request says so with the signal
//!   [`REFUSAL_NOT_REACHED`]: the frontend migrates it as if it had not
//!   reached the sidecar itself.
//!
//! What a request holds while its answer is read (the frontend's tracked
//! load, a sidecar's engine slot) is a [`Watcher`], dropped when the
//! upstream's answer has ended, failed or been abandoned by the client.
//! The client's side — how long it may take to read what is relayed — is
//! the HTTP server's write-progress deadline (`http_server/`).

mod assemble;
mod attempt;
mod chunk_timeout;
mod client;
mod failure;
mod payload;
mod relay;
mod watcher;

pub(crate) use self::attempt::{attempt, Outcome, Timeouts};
pub(crate) use self::client::client;
pub(crate) use self::failure::{Failure, FailureCounts, Peer, REFUSAL_NOT_REACHED};
pub(crate) use self::payload::Payload;
pub(crate) use self::watcher::Watcher;
