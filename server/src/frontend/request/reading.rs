//! [`Reading`]: what the proxy asks of a request body beyond its model, and
//! the part of Dynamo's `nvext` it reads (`agent_hints.priority`).

/// What [`read_head`](super::read_head) reads beyond the model.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Reading {
    /// Count the prompt's tokens (else only check its shape).
    pub(crate) prompt: bool,
    /// Read `nvext.agent_hints.priority` (an integer; any other type there
    /// is a 400). Otherwise `nvext` is skipped unread.
    pub(crate) nvext_priority: bool,
}

/// The part of `nvext` the proxy reads (every other field skipped).
#[derive(serde::Deserialize)]
pub(super) struct Nvext {
    #[serde(default)]
    pub(super) agent_hints: Option<AgentHints>,
}

#[derive(serde::Deserialize)]
pub(super) struct AgentHints {
    #[serde(default)]
    pub(super) priority: Option<i64>,
}
