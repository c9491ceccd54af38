//! [`Reading`]: what the proxy asks of a request body beyond its model (and
//! of Dynamo's `nvext`, `agent_hints.priority`), and the checks that read
//! that priority.

use std::borrow::Cow;

use serde::de::{IgnoredAny, MapAccess};

use super::check::{Check, Checked, Scalar, Wrong};

/// What [`read_head`](super::read_head) reads beyond the model.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Reading {
    /// Count the prompt's tokens (else only check its shape).
    pub(crate) prompt: bool,
    /// Read `nvext.agent_hints.priority` (an integer; any other type there
    /// is a 400). Otherwise `nvext` is skipped unread.
    pub(crate) nvext_priority: bool,
}

/// The `param` of a priority in the body.
pub(super) const PRIORITY_PARAM: &str = "nvext.agent_hints.priority";

/// An object (or null) of which only `key` is read, with `inner` (every
/// other field skipped unread; the last of a repeated key wins).
#[derive(Clone, Copy)]
pub(super) struct Within<C> {
    pub(super) key: &'static str,
    pub(super) inner: C,
}

/// `nvext`, as far as `agent_hints.priority`.
pub(super) const NVEXT: Within<Within<Priority>> =
    Within { key: "agent_hints", inner: Within { key: "priority", inner: Priority } };

impl<'de, C, T> Check<'de> for Within<C>
where
    C: Check<'de, Out = Result<Option<T>, Wrong>> + Copy,
{
    type Out = Result<Option<T>, Wrong>;

    fn wrong(self) -> Self::Out {
        Err(Wrong)
    }

    fn scalar(self, value: Scalar<'_>) -> Self::Out {
        match value {
            Scalar::Null => Ok(None),
            _ => self.wrong(),
        }
    }

    fn map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Out, A::Error> {
        let mut found = Ok(None);
        while let Some(name) = map.next_key::<Cow<'de, str>>()? {
            if name == self.key {
                found = map.next_value_seed(Checked(self.inner))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

/// `nvext.agent_hints.priority`: an integer (or null), of any size (one
/// past 64 bits is taken as the extreme of its sign, as the
/// `x-loadgate-priority` header's).
#[derive(Clone, Copy)]
pub(super) struct Priority;

impl<'de> Check<'de> for Priority {
    type Out = Result<Option<i64>, Wrong>;

    fn wrong(self) -> Self::Out {
        Err(Wrong)
    }

    fn scalar(self, value: Scalar<'_>) -> Self::Out {
        match value {
            Scalar::Null => Ok(None),
            Scalar::Unsigned(n) => Ok(Some(i64::try_from(n).unwrap_or(i64::MAX))),
            Scalar::Negative(n) => Ok(Some(n)),
            // An integer past 64 bits (serde_json reads it as a float; one
            // within 64 bits has come as an integer, so any other float
            // here had a fraction or an exponent), or `-0`.
            Scalar::OtherNumber(f) if f >= TWO_TO_63 => Ok(Some(i64::MAX)),
            Scalar::OtherNumber(f) if f <= -TWO_TO_63 => Ok(Some(i64::MIN)),
            Scalar::OtherNumber(0.0) => Ok(Some(0)),
            _ => self.wrong(),
        }
    }
}

/// 2^63: an integer at least this, or at most its negation, that came as a
/// float is past 64 bits (one below -2^63 rounds to it).
const TWO_TO_63: f64 = 9_223_372_036_854_775_808.0;
