//! The NATS subjects of one namespace (see the module docs).

use std::fmt::Write as _;

use loadgate::WorkerId;

/// A namespace's subjects.
#[derive(Clone, Debug)]
pub(crate) struct Subjects {
    namespace: String,
}

impl Subjects {
    pub(crate) fn new(namespace: &str) -> Self {
        Subjects { namespace: namespace.to_owned() }
    }

    /// Where `worker` of `model` publishes its frames.
    pub(crate) fn events(&self, model: &str, worker: WorkerId) -> String {
        format!("{}.ev.{}.{worker}", self.namespace, token(model))
    }

    /// Every worker's frames (what a frontend subscribes to).
    pub(crate) fn all_events(&self) -> String {
        format!("{}.ev.>", self.namespace)
    }

    /// Where frontend `frontend` publishes the load it adds (and its beats).
    pub(crate) fn frontend(&self, frontend: u64) -> String {
        format!("{}.fe.{frontend}", self.namespace)
    }

    /// Every frontend's shared load (what a sharing frontend subscribes to).
    pub(crate) fn all_frontends(&self) -> String {
        format!("{}.fe.>", self.namespace)
    }

    /// A frontend's request that every worker announce itself again.
    pub(crate) fn hello(&self) -> String {
        format!("{}.hello", self.namespace)
    }
}

/// `model` as one subject token: bytes outside `A-Z a-z 0-9 _ -` as `~XX`.
fn token(model: &str) -> String {
    let mut out = String::with_capacity(model.len());
    for b in model.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "~{b:02X}");
        }
    }
    if out.is_empty() {
        out.push('~');
    }
    out
}

/// Whether `namespace` is one or more subject tokens without wildcards.
pub(crate) fn valid_namespace(namespace: &str) -> bool {
    !namespace.is_empty()
        && namespace.len() <= 128
        && namespace
            .split('.')
            .all(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_cannot_add_tokens_or_wildcards() {
        let s = Subjects::new("lg");
        assert_eq!(s.events("llama-3_8b", 7), "lg.ev.llama-3_8b.7");
        assert_eq!(s.events("a.b>*", 1), "lg.ev.a~2Eb~3E~2A.1");
        assert_eq!(s.events("", 1), "lg.ev.~.1");
        assert_eq!((s.all_events().as_str(), s.hello().as_str()), ("lg.ev.>", "lg.hello"));
    }

    #[test]
    fn namespaces_are_plain_tokens() {
        assert!(valid_namespace("loadgate") && valid_namespace("prod.eu-1"));
        for bad in ["", "a..b", "a.*", "a.>", "a b", ".a"] {
            assert!(!valid_namespace(bad), "{bad:?}");
        }
    }
}
