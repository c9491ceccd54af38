//! [`Class`]: how much a request matters when workers are short — which
//! waiters leave a model's line first, and who gives way when it is full.

use std::fmt;
use std::str::FromStr;

/// A request's priority class.
///
/// Higher classes leave a waiting line first; a [`Class::Critical`] arrival
/// that finds the line full takes the place of a queued
/// [`Class::Sheddable`] one, which is refused at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    /// Served first; displaces sheddable waiters from a full line.
    Critical,
    /// Everything not marked otherwise.
    #[default]
    Standard,
    /// Served last; the first to give way.
    Sheddable,
}

impl Class {
    /// How many classes there are.
    pub const COUNT: usize = 3;

    /// Every class, highest first.
    pub const ALL: [Class; Class::COUNT] = [Class::Critical, Class::Standard, Class::Sheddable];

    /// The class's place in [`Class::ALL`] (0: highest).
    #[inline]
    pub fn index(self) -> usize {
        self as usize
    }

    /// The label value (`critical`, `standard`, `sheddable`).
    pub fn label(self) -> &'static str {
        match self {
            Class::Critical => "critical",
            Class::Standard => "standard",
            Class::Sheddable => "sheddable",
        }
    }

    /// The class of an `x-loadgate-priority` value: a class name, or an
    /// integer (positive: critical, 0: standard, negative: sheddable).
    /// `None` for anything else.
    pub fn from_priority(value: &str) -> Option<Class> {
        let value = value.trim();
        if let Ok(class) = value.parse() {
            return Some(class);
        }
        // Only the sign matters: an integer of any length (a sign, then
        // ASCII digits) is read without being parsed into a number.
        let (negative, digits) = match value.as_bytes() {
            [b'-', rest @ ..] => (true, rest),
            [b'+', rest @ ..] => (false, rest),
            rest => (false, rest),
        };
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(match (negative, digits.iter().all(|d| *d == b'0')) {
            (_, true) => Class::Standard,
            (true, false) => Class::Sheddable,
            (false, false) => Class::Critical,
        })
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// A name that is not a class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownClass(pub String);

impl fmt::Display for UnknownClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown class `{}` (expected critical, standard or sheddable)", self.0)
    }
}

impl std::error::Error for UnknownClass {}

impl FromStr for Class {
    type Err = UnknownClass;

    /// `critical`, `standard` or `sheddable` (ASCII case ignored).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Class::ALL.into_iter().find(|c| c.label().eq_ignore_ascii_case(s)).ok_or_else(|| UnknownClass(s.to_owned()))
    }
}

/// One value for each class (a timeout, a count), indexed by [`Class`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PerClass<T>(pub [T; Class::COUNT]);

impl<T: Copy + PartialEq> PerClass<T> {
    /// `value` for every class.
    pub fn all(value: T) -> Self {
        PerClass([value; Class::COUNT])
    }

    /// The value of `class`.
    #[inline]
    pub fn get(&self, class: Class) -> T {
        self.0[class.index()]
    }

    /// The value every class has, if they all have the same.
    pub fn uniform(&self) -> Option<T> {
        let first = self.0[0];
        self.0.iter().all(|v| *v == first).then_some(first)
    }

    /// Each value mapped.
    pub fn map<U>(self, f: impl FnMut(T) -> U) -> PerClass<U> {
        PerClass(self.0.map(f))
    }
}

/// Why a per-class list did not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PerClassError(String);

impl fmt::Display for PerClassError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PerClassError {}

impl FromStr for PerClass<u64> {
    type Err = PerClassError;

    /// `2000` (every class), or `critical=5000,standard=2000,sheddable=0`:
    /// each class at most once, in any order; a class not named gets 0.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let number = |v: &str| {
            v.trim()
                .parse::<u64>()
                .map_err(|_| PerClassError(format!("`{}` is not a whole non-negative number", v.trim())))
        };
        if !s.contains('=') {
            return number(s).map(PerClass::all);
        }
        let mut values = PerClass::all(None);
        for item in s.split(',') {
            let (name, value) = item
                .split_once('=')
                .ok_or_else(|| PerClassError(format!("`{}`: expected CLASS=NUMBER", item.trim())))?;
            let class: Class = name.trim().parse().map_err(|e: UnknownClass| PerClassError(e.to_string()))?;
            let slot = &mut values.0[class.index()];
            if slot.is_some() {
                return Err(PerClassError(format!("`{class}` is given twice")));
            }
            *slot = Some(number(value)?);
        }
        Ok(values.map(|v| v.unwrap_or(0)))
    }
}

impl fmt::Display for PerClass<u64> {
    /// The form [`FromStr`] reads: one number when every class has it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(value) = self.uniform() {
            return write!(f, "{value}");
        }
        for (i, class) in Class::ALL.into_iter().enumerate() {
            let comma = if i == 0 { "" } else { "," };
            write!(f, "{comma}{class}={}", self.get(class))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_map_to_classes_by_name_or_sign() {
        let cases = [
            ("critical", Some(Class::Critical)),
            ("Standard", Some(Class::Standard)),
            (" sheddable ", Some(Class::Sheddable)),
            ("1", Some(Class::Critical)),
            ("+7", Some(Class::Critical)),
            ("99999999999999999999999999", Some(Class::Critical)),
            ("0", Some(Class::Standard)),
            ("-0", Some(Class::Standard)),
            ("000", Some(Class::Standard)),
            ("-1", Some(Class::Sheddable)),
            ("-99999999999999999999999999", Some(Class::Sheddable)),
            ("", None),
            ("-", None),
            ("+", None),
            ("1.5", None),
            ("high", None),
            ("--1", None),
            ("１", None),
        ];
        for (value, class) in cases {
            assert_eq!(Class::from_priority(value), class, "{value:?}");
        }
    }

    #[test]
    fn classes_order_highest_first() {
        assert!(Class::Critical < Class::Standard && Class::Standard < Class::Sheddable);
        assert_eq!(Class::ALL.map(Class::index), [0, 1, 2]);
        assert_eq!(Class::default(), Class::Standard);
        assert_eq!("CRITICAL".parse::<Class>(), Ok(Class::Critical));
        assert!("urgent".parse::<Class>().unwrap_err().to_string().contains("urgent"));
    }
    #[test]
    fn per_class_values_parse_as_one_number_or_by_class() {
        let parse = |s: &str| s.parse::<PerClass<u64>>();
        assert_eq!(parse("2000"), Ok(PerClass::all(2000)));
        assert_eq!(parse(" 0 "), Ok(PerClass::all(0)));
        assert_eq!(parse("critical=5000,standard=2000,sheddable=0"), Ok(PerClass([5000, 2000, 0])));
        assert_eq!(parse("sheddable=1, critical = 9"), Ok(PerClass([9, 0, 1])), "unnamed: 0");
        for bad in [
            "",
            "-1",
            "1.5",
            "critical=",
            "critical=x",
            "urgent=5",
            "critical=1,critical=2",
            "critical=1,",
            "5,critical=1",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        for value in [PerClass::all(7), PerClass([5000, 2000, 0])] {
            assert_eq!(parse(&value.to_string()), Ok(value), "{value}");
        }
        assert_eq!(PerClass([1, 2, 3]).to_string(), "critical=1,standard=2,sheddable=3");
        assert_eq!(PerClass([1, 1, 2]).uniform(), None);
    }
}
