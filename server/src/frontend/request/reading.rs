//! [`Reading`]: what the proxy asks of a request body beyond its model (and
//! of Dynamo's `nvext`, `agent_hints.priority`).

/// What [`read_head`](super::read_head) reads beyond the model.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Reading {
    /// Count the prompt's tokens (else only check its shape).
    pub(crate) prompt: bool,
    /// Read `nvext.agent_hints.priority` (an integer; any other type there
    /// is a 400). Otherwise `nvext` is skipped unread.
    pub(crate) nvext_priority: bool,
}
