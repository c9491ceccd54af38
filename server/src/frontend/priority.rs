//! [`Priority`]: which class a request is in. `x-loadgate-priority` (and,
//! with `--priority-from-nvext`, the body's `nvext.agent_hints.priority`
//! when the header is absent) counts only with `--trust-priority-header`
//! (any client can send either); otherwise every request is `standard`.

use axum::http::HeaderMap;
use loadgate::Class;

/// The header a trusted gateway sets.
pub(crate) const PRIORITY_HEADER: &str = "x-loadgate-priority";

/// Which way an engine orders `nvext.agent_hints.priority`
/// (`--priority-from-nvext`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum NvextOrder {
    /// vLLM's: lower values first (negative: critical, positive: sheddable).
    Vllm,
    /// SGLang's default: higher values first (positive: critical, negative:
    /// sheddable).
    Sglang,
}

/// How the frontend decides a request's class.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Priority {
    /// `--trust-priority-header`.
    pub(crate) trusted: bool,
    /// `--priority-from-nvext` (only with `trusted`).
    pub(crate) nvext: Option<NvextOrder>,
}

impl Priority {
    /// Whether the body's `nvext.agent_hints.priority` is to be read.
    pub(crate) fn reads_nvext(&self) -> bool {
        self.trusted && self.nvext.is_some()
    }

    /// The class of a body's `nvext.agent_hints.priority` (`None` when it
    /// is not read or not given: standard).
    pub(crate) fn nvext_class(&self, priority: Option<i64>) -> Class {
        let (Some(order), Some(priority), true) = (self.nvext, priority, self.trusted) else {
            return Class::Standard;
        };
        let first = match order {
            NvextOrder::Vllm => -priority.signum(),
            NvextOrder::Sglang => priority.signum(),
        };
        match first {
            1 => Class::Critical,
            0 => Class::Standard,
            _ => Class::Sheddable,
        }
    }

    /// The class `headers` give (`None`: untrusted, or no header); an error
    /// names a value that is not a class (a trusted sender's mistake: 400,
    /// not a guess).
    pub(crate) fn header_class(&self, headers: &HeaderMap) -> Result<Option<Class>, String> {
        if !self.trusted {
            return Ok(None);
        }
        let mut values = headers.get_all(PRIORITY_HEADER).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return match headers.contains_key(PRIORITY_HEADER) {
                true => Err(format!("{PRIORITY_HEADER} is given more than once")),
                false => Ok(None),
            };
        };
        value.to_str().ok().and_then(Class::from_priority).map(Some).ok_or_else(|| {
            format!(
                "{PRIORITY_HEADER} must be critical, standard, sheddable or an integer, not {:?}",
                String::from_utf8_lossy(&value.as_bytes()[..value.len().min(64)])
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append(PRIORITY_HEADER, v.parse().unwrap());
        }
        map
    }

    #[test]
    fn the_header_counts_only_when_trusted() {
        let untrusted = Priority { trusted: false, nvext: None };
        let trusted = Priority { trusted: true, nvext: None };
        assert_eq!(untrusted.header_class(&headers(&["critical"])), Ok(None));
        assert_eq!(untrusted.header_class(&headers(&["nonsense"])), Ok(None), "not even read");
        assert_eq!(trusted.header_class(&headers(&[])), Ok(None));
        assert_eq!(trusted.header_class(&headers(&["critical"])), Ok(Some(Class::Critical)));
        assert_eq!(trusted.header_class(&headers(&["-3"])), Ok(Some(Class::Sheddable)));
        assert_eq!(trusted.header_class(&headers(&["0"])), Ok(Some(Class::Standard)));
        assert!(trusted.header_class(&headers(&["urgent"])).unwrap_err().contains("urgent"));
        assert!(trusted.header_class(&headers(&["1", "-1"])).unwrap_err().contains("more than once"));
    }

    #[test]
    fn the_nvext_priority_follows_its_engines_order() {
        let vllm = Priority { trusted: true, nvext: Some(NvextOrder::Vllm) };
        let sglang = Priority { trusted: true, nvext: Some(NvextOrder::Sglang) };
        let classes = |p: Priority| [-5, 0, 7].map(|v| p.nvext_class(Some(v)));
        assert_eq!(classes(vllm), [Class::Critical, Class::Standard, Class::Sheddable], "lower first");
        assert_eq!(classes(sglang), [Class::Sheddable, Class::Standard, Class::Critical], "higher first");
        assert_eq!(vllm.nvext_class(None), Class::Standard);
        assert_eq!(vllm.nvext_class(Some(i64::MIN)), Class::Critical);
        let untrusted = Priority { trusted: false, nvext: Some(NvextOrder::Vllm) };
        assert!(!untrusted.reads_nvext() && vllm.reads_nvext());
        assert_eq!(untrusted.nvext_class(Some(-5)), Class::Standard);
    }
}
