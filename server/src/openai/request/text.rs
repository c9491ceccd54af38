//! [`AllText`]: the prompt tokens of a JSON value an engine renders into
//! the prompt whole — a chat's `tools`, a message's `tool_calls`: the
//! [`words`] of every string in it, keys included.

use std::borrow::Cow;

use serde::de::{MapAccess, SeqAccess};

use super::check::{Check, Checked, Scalar};
use crate::tokens::words;

/// Counts the words of every string in a value, at any depth (serde_json
/// bounds the depth).
pub(super) struct AllText;

impl<'de> Check<'de> for AllText {
    type Out = u64;

    fn wrong(self) -> u64 {
        0
    }

    fn scalar(self, value: Scalar<'_>) -> u64 {
        match value {
            Scalar::Str(s) => words(s),
            // A number or a literal is about one token.
            Scalar::Null | Scalar::Bool(_) | Scalar::Unsigned(_) | Scalar::Negative(_) | Scalar::OtherNumber(_) => 1,
        }
    }

    fn seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<u64, A::Error> {
        let mut total = 0u64;
        while let Some(tokens) = seq.next_element_seed(Checked(AllText))? {
            total = total.saturating_add(tokens);
        }
        Ok(total)
    }

    fn map<A: MapAccess<'de>>(self, mut map: A) -> Result<u64, A::Error> {
        let mut total = 0u64;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            total = total.saturating_add(words(&key)).saturating_add(map.next_value_seed(Checked(AllText))?);
        }
        Ok(total)
    }
}
