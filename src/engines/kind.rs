//! Which engine a URL serves: [`EngineKind`].

use std::fmt;
use std::str::FromStr;

/// An inference engine whose own endpoints loadgate reads load from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EngineKind {
    /// vLLM: `/metrics`.
    Vllm,
    /// SGLang: `/metrics` (started with `--enable-metrics`).
    Sglang,
    /// llama.cpp's `llama-server`: `/metrics` (with `--metrics`) and `/slots`.
    LlamaCpp,
}

impl EngineKind {
    /// Every kind, in the order of their names in messages.
    pub const ALL: [EngineKind; 3] = [EngineKind::Vllm, EngineKind::Sglang, EngineKind::LlamaCpp];

    /// The kind's name: `"vllm"`, `"sglang"` or `"llamacpp"`.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
            EngineKind::LlamaCpp => "llamacpp",
        }
    }

    /// True when a scrape needs `GET /slots` besides `GET /metrics`
    /// (llama.cpp: its `/metrics` has no KV-cache gauge).
    pub fn needs_slots(self) -> bool {
        self == EngineKind::LlamaCpp
    }

    /// True when a router should send this engine's non-streamed requests
    /// streamed and assemble the answer ([`StreamAssembler`]): llama.cpp,
    /// which otherwise notices a client that left only after a second in
    /// which none of its tasks gave a result (never, while it is scraped).
    ///
    /// [`StreamAssembler`]: super::StreamAssembler
    pub fn assembles(self) -> bool {
        self == EngineKind::LlamaCpp
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EngineKind {
    type Err = UnknownEngineKind;

    /// `vllm`, `sglang`, `llamacpp` (also `llama.cpp` and `llama-cpp`),
    /// ASCII case-insensitive.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        const NAMES: [(&str, EngineKind); 5] = [
            ("vllm", EngineKind::Vllm),
            ("sglang", EngineKind::Sglang),
            ("llamacpp", EngineKind::LlamaCpp),
            ("llama.cpp", EngineKind::LlamaCpp),
            ("llama-cpp", EngineKind::LlamaCpp),
        ];
        NAMES
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(text))
            .map(|&(_, kind)| kind)
            .ok_or_else(|| UnknownEngineKind(super::excerpt(text)))
    }
}

/// A name that is no [`EngineKind`]; its message lists the kinds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownEngineKind(pub String);

impl fmt::Display for UnknownEngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown engine kind {:?}: expected vllm, sglang or llamacpp", self.0)
    }
}

impl std::error::Error for UnknownEngineKind {}
