//! [`Watcher`]: what a request holds while an upstream's answer is read.

use super::failure::Failure;

/// What a request holds while its answer is read; dropped when the
/// upstream's answer has ended, failed, or been abandoned by the client
/// (never later: see `relay.rs`). Each hook has a no-op default.
pub(crate) trait Watcher: Send + 'static {
    /// The upstream answered with a 2xx (not a refusal, a failure or an
    /// error answer).
    fn answered(&mut self) {}
    /// A chunk of its body arrived (the first included).
    fn chunk(&mut self, _chunk: &[u8]) {}
    /// A relayed answer failed after it began ([`Failure::Broken`] or
    /// [`Failure::BetweenChunks`]).
    fn failed(&mut self, _failure: Failure) {}
}
