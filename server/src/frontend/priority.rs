//! [`Priority`]: which class a request is in. `x-loadgate-priority` counts
//! only with `--trust-priority-header` (any client can send it); otherwise
//! every request is `standard`.

use axum::http::HeaderMap;
use loadgate::Class;

/// The header a trusted gateway sets.
pub(crate) const PRIORITY_HEADER: &str = "x-loadgate-priority";

/// How the frontend decides a request's class.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Priority {
    /// `--trust-priority-header`.
    pub(crate) trusted: bool,
}

impl Priority {
    /// The class of a request with `headers`; an error names a value that
    /// is not a class (a trusted sender's mistake: 400, not a guess).
    pub(crate) fn class_of(&self, headers: &HeaderMap) -> Result<Class, String> {
        if !self.trusted {
            return Ok(Class::Standard);
        }
        let mut values = headers.get_all(PRIORITY_HEADER).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return match headers.contains_key(PRIORITY_HEADER) {
                true => Err(format!("{PRIORITY_HEADER} is given more than once")),
                false => Ok(Class::Standard),
            };
        };
        value.to_str().ok().and_then(Class::from_priority).ok_or_else(|| {
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
        let untrusted = Priority { trusted: false };
        let trusted = Priority { trusted: true };
        assert_eq!(untrusted.class_of(&headers(&["critical"])), Ok(Class::Standard));
        assert_eq!(untrusted.class_of(&headers(&["nonsense"])), Ok(Class::Standard), "not even read");
        assert_eq!(trusted.class_of(&headers(&[])), Ok(Class::Standard));
        assert_eq!(trusted.class_of(&headers(&["critical"])), Ok(Class::Critical));
        assert_eq!(trusted.class_of(&headers(&["-3"])), Ok(Class::Sheddable));
        assert_eq!(trusted.class_of(&headers(&["0"])), Ok(Class::Standard));
        assert!(trusted.class_of(&headers(&["urgent"])).unwrap_err().contains("urgent"));
        assert!(trusted.class_of(&headers(&["1", "-1"])).unwrap_err().contains("more than once"));
    }
}
