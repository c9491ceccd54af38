//! [`Check`]: how the request reader checks one field in one pass — a
//! visitor per field, each JSON type read by one method, any type it does
//! not take [`Check::wrong`].

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// A value of a type its field does not take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Wrong;

/// A JSON value that is not a container, as a [`Check`] sees it.
#[derive(Clone, Copy, Debug)]
pub(super) enum Scalar<'a> {
    Null,
    Bool(bool),
    /// A non-negative integer.
    Unsigned(u64),
    /// A negative integer.
    Negative(i64),
    /// A number with a fraction or exponent, or an integer past 64 bits
    /// (or `-0`), as serde_json reads it.
    OtherNumber(f64),
    Str(&'a str),
}

/// What one field (or part of one) takes: each JSON type is read by one
/// method, and any type whose method is left out is [`wrong`](Check::wrong)
/// (a container is then skipped). Read through [`Checked`].
pub(super) trait Check<'de>: Sized {
    /// What the check yields.
    type Out;

    /// The outcome for a value of a type the field does not take.
    fn wrong(self) -> Self::Out;

    /// A scalar.
    fn scalar(self, _value: Scalar<'_>) -> Self::Out {
        self.wrong()
    }

    /// A string borrowed from the body (no escapes).
    fn borrowed_str(self, value: &'de str) -> Self::Out {
        self.scalar(Scalar::Str(value))
    }

    /// An array.
    fn seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Out, A::Error> {
        IgnoredAny.visit_seq(seq).map(|_| self.wrong())
    }

    /// An object.
    fn map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Out, A::Error> {
        IgnoredAny.visit_map(map).map(|_| self.wrong())
    }
}

/// Reads one value with the [`Check`] `C`.
pub(super) struct Checked<C>(pub(super) C);

impl<'de, C: Check<'de>> DeserializeSeed<'de> for Checked<C> {
    type Value = C::Out;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<C::Out, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de, C: Check<'de>> Visitor<'de> for Checked<C> {
    type Value = C::Out;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<C::Out, E> {
        Ok(self.0.scalar(Scalar::Null))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<C::Out, E> {
        Ok(self.0.scalar(Scalar::Bool(v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<C::Out, E> {
        Ok(self.0.scalar(Scalar::Unsigned(v)))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<C::Out, E> {
        // serde_json gives non-negative integers as u64; this is for others.
        Ok(self.0.scalar(u64::try_from(v).map_or(Scalar::Negative(v), Scalar::Unsigned)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<C::Out, E> {
        Ok(self.0.scalar(Scalar::OtherNumber(v)))
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<C::Out, E> {
        Ok(self.0.borrowed_str(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<C::Out, E> {
        Ok(self.0.scalar(Scalar::Str(v)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<C::Out, A::Error> {
        self.0.seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<C::Out, A::Error> {
        self.0.map(map)
    }
}
