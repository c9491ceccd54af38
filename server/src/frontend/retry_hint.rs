//! The frontend's retry hint: the library's `loadgate::retry_hint::RetryHint`
//! (the computation, its reasoning and its tests are there), one per
//! frontend (`Frontend::retry_hint`).
//!
//! - `--retry-after-mode computed` (the default) builds it with
//!   `RetryHint::computed()`, `constant` with `RetryHint::constant()`
//!   (always 1 s, the behaviour before issue 10, kept to measure the
//!   difference).
//! - The in-flight ledger feeds it each answered request's time
//!   (`finished`); every refusal asks it with the requests in flight and
//!   the model's waiting line (`Frontend::retry_after_waiting`).
//! - With `--event-plane nats` sharing load and `--retry-hint-scope pool`
//!   (the default there), the NATS plane gives it the other frontends'
//!   figures at every beat (`set_others`, issue 26): the pool's slots and
//!   line, not this frontend's. The line is the refused request's model's
//!   across the frontends (`Frontend::waiting` adds the others' waiters of
//!   that model), not every model's.

pub(crate) use loadgate::retry_hint::RetryHint;
