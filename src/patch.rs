//! The body of `POST /busy_threshold`: which model, and for each threshold
//! whether to leave it, set it or clear it. Pure parser, no I/O.
//!
//! # Format
//!
//! A JSON object with a required `"model"` (a non-empty string) and any of
//! five optional fields:
//!
//! | field | value |
//! |---|---|
//! | `active_decode_blocks_threshold` | a number in `[0, 1]` |
//! | `active_prefill_tokens_threshold` | a non-negative integer (`u64`) |
//! | `active_prefill_tokens_threshold_frac` | a number in `[0, 1_000_000]` |
//! | `active_waiting_requests_threshold` | a non-negative integer (`u64`) |
//! | `router_queue_timeout_ms` | whole milliseconds, 0 to 86,400,000 (the frontend's waiting line; 0: none), or an object of them by class (`{"critical":5000,"standard":2000}`; a class not named: 0) |
//!
//! A field that is absent leaves the threshold unchanged, a number sets it,
//! `null` clears it (for `router_queue_timeout_ms`: back to the frontend's
//! default). A body with only `"model"` reads the thresholds. Any
//! other key, a key given twice (in any object of the body), a value of
//! another type, or a number out of range is an error, never a silent
//! default (a typo must not turn a change into a read, and a repeated
//! `"model"` must not change another model than the one a reader of the
//! body's start saw).
//!
//! # Examples
//!
//! ```
//! use loadgate::patch::{parse_threshold_patch, Change};
//! use loadgate::BusyThresholds;
//!
//! let patch = parse_threshold_patch(br#"{"model":"llama","active_decode_blocks_threshold":0.85,
//!     "active_prefill_tokens_threshold":null}"#).unwrap();
//! assert_eq!(patch.model, "llama");
//! assert_eq!(patch.decode, Change::Set(0.85));
//! assert_eq!(patch.prefill, Change::Clear);
//! assert_eq!(patch.prefill_frac, Change::Unchanged);
//! assert_eq!(patch.waiting, Change::Unchanged);
//!
//! let mut current = BusyThresholds { active_prefill_tokens_threshold: Some(4096), ..Default::default() };
//! patch.apply(&mut current);
//! assert_eq!(current, BusyThresholds { active_decode_blocks_threshold: Some(0.85), ..Default::default() });
//! ```

use std::fmt;

use serde_json::Value;

use crate::class::{Class, PerClass};
use crate::thresholds::{BusyThresholds, MAX_PREFILL_FRAC};

/// Field name of the decode-blocks threshold.
pub const DECODE_FIELD: &str = "active_decode_blocks_threshold";
/// Field name of the absolute prefill-tokens threshold.
pub const PREFILL_FIELD: &str = "active_prefill_tokens_threshold";
/// Field name of the fractional prefill-tokens threshold.
pub const PREFILL_FRAC_FIELD: &str = "active_prefill_tokens_threshold_frac";
/// Field name of the waiting-requests threshold.
pub const WAITING_FIELD: &str = "active_waiting_requests_threshold";

/// Field name of the model's waiting-line timeout, ms (not a threshold:
/// the frontend keeps it; 0 is no line, `null` the frontend's default).
pub const QUEUE_TIMEOUT_FIELD: &str = "router_queue_timeout_ms";

/// The longest waiting-line timeout a patch may set: a day.
pub const MAX_QUEUE_TIMEOUT_MS: u64 = 86_400_000;

/// What a request does to one threshold.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Change<T> {
    /// Field absent: keep the current value.
    #[default]
    Unchanged,
    /// A value: set it.
    Set(T),
    /// `null`: clear it (the signal is disabled).
    Clear,
}

impl<T: Copy> Change<T> {
    /// Applies the change to `slot`.
    pub fn apply_to(self, slot: &mut Option<T>) {
        match self {
            Change::Unchanged => {}
            Change::Set(v) => *slot = Some(v),
            Change::Clear => *slot = None,
        }
    }
}

/// A parsed `POST /busy_threshold` body.
#[derive(Clone, Debug, PartialEq)]
pub struct ThresholdPatch {
    /// The model whose thresholds are read or changed.
    pub model: String,
    /// `active_decode_blocks_threshold`.
    pub decode: Change<f64>,
    /// `active_prefill_tokens_threshold`.
    pub prefill: Change<u64>,
    /// `active_prefill_tokens_threshold_frac`.
    pub prefill_frac: Change<f64>,
    /// `active_waiting_requests_threshold`.
    pub waiting: Change<u64>,
    /// `router_queue_timeout_ms` (not applied by [`apply`](Self::apply):
    /// the waiting line's timeout is the frontend's to keep).
    pub queue_timeout_ms: Change<PerClass<u64>>,
}

impl ThresholdPatch {
    /// True when no threshold field was given: the request only reads.
    pub fn is_read(&self) -> bool {
        self.decode == Change::Unchanged
            && self.prefill == Change::Unchanged
            && self.prefill_frac == Change::Unchanged
            && self.waiting == Change::Unchanged
            && self.queue_timeout_ms == Change::Unchanged
    }

    /// Applies every change to `thresholds` (fields left absent stay).
    pub fn apply(&self, thresholds: &mut BusyThresholds) {
        self.decode.apply_to(&mut thresholds.active_decode_blocks_threshold);
        self.prefill.apply_to(&mut thresholds.active_prefill_tokens_threshold);
        self.prefill_frac.apply_to(&mut thresholds.active_prefill_tokens_threshold_frac);
        self.waiting.apply_to(&mut thresholds.active_waiting_requests_threshold);
    }
}

/// Why a body is not a valid threshold patch (HTTP 400).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum PatchError {
    /// Not JSON at all (the parser's message).
    Json(String),
    /// JSON, but not an object.
    NotAnObject,
    /// `"model"` is missing, not a string, or empty.
    Model,
    /// A key that is none of the known fields.
    UnknownField(String),
    /// An object of the body names a key twice (the parser's message).
    RepeatedKey(String),
    /// A field has a value of the wrong type or out of range.
    InvalidValue {
        /// The field.
        field: &'static str,
        /// What was expected.
        expected: &'static str,
    },
}

impl fmt::Display for PatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Json(e) => write!(f, "body is not valid JSON: {e}"),
            Self::NotAnObject => f.write_str("body must be a JSON object"),
            Self::Model => f.write_str("\"model\" must be a non-empty string"),
            Self::UnknownField(k) => write!(f, "unknown field {k:?}"),
            Self::RepeatedKey(message) => f.write_str(message),
            Self::InvalidValue { field, expected } => write!(f, "{field} must be {expected} or null"),
        }
    }
}

impl std::error::Error for PatchError {}

/// Parses a `POST /busy_threshold` body (see the module docs for the format).
///
/// # Errors
///
/// [`PatchError`] for anything but a JSON object with a non-empty string
/// `"model"` and known fields holding `null` or an in-range value of their
/// type. The accepted values are exactly those
/// [`BusyThresholds::validate`] accepts.
pub fn parse_threshold_patch(body: &[u8]) -> Result<ThresholdPatch, PatchError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| PatchError::Json(e.to_string()))?;
    let Value::Object(fields) = value else {
        return Err(PatchError::NotAnObject);
    };
    // A `Value` keeps the last of a repeated key: read the body once more
    // for repeats alone.
    serde_json::from_slice::<NoRepeats>(body).map_err(|e| PatchError::RepeatedKey(e.to_string()))?;
    let mut patch = ThresholdPatch {
        model: String::new(),
        decode: Change::Unchanged,
        prefill: Change::Unchanged,
        prefill_frac: Change::Unchanged,
        waiting: Change::Unchanged,
        queue_timeout_ms: Change::Unchanged,
    };
    let mut model = None;
    for (key, value) in &fields {
        match key.as_str() {
            "model" => match value {
                Value::String(m) if !m.is_empty() => model = Some(m.clone()),
                _ => return Err(PatchError::Model),
            },
            DECODE_FIELD => patch.decode = fraction(value, DECODE_FIELD, 1.0, "a number between 0 and 1")?,
            PREFILL_FIELD => patch.prefill = unsigned(value, PREFILL_FIELD)?,
            WAITING_FIELD => patch.waiting = unsigned(value, WAITING_FIELD)?,
            QUEUE_TIMEOUT_FIELD => patch.queue_timeout_ms = queue_timeouts(value)?,
            PREFILL_FRAC_FIELD => {
                patch.prefill_frac =
                    fraction(value, PREFILL_FRAC_FIELD, MAX_PREFILL_FRAC, "a number between 0 and 1000000")?
            }
            other => return Err(PatchError::UnknownField(other.to_owned())),
        }
    }
    patch.model = model.ok_or(PatchError::Model)?;
    Ok(patch)
}

/// A JSON value whose objects (at any depth) name each key once; reading
/// it fails at the first key given twice.
struct NoRepeats;

impl<'de> serde::Deserialize<'de> for NoRepeats {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NoRepeats)
    }
}

impl<'de> serde::de::Visitor<'de> for NoRepeats {
    type Value = NoRepeats;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<NoRepeats, A::Error> {
        let mut keys = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if keys.contains(&key) {
                return Err(serde::de::Error::custom(format_args!("key {key:?} given twice")));
            }
            map.next_value::<NoRepeats>()?;
            keys.insert(key);
        }
        Ok(NoRepeats)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<NoRepeats, A::Error> {
        while seq.next_element::<NoRepeats>()?.is_some() {}
        Ok(NoRepeats)
    }

    fn visit_bool<E>(self, _: bool) -> Result<NoRepeats, E> {
        Ok(NoRepeats)
    }

    fn visit_i64<E>(self, _: i64) -> Result<NoRepeats, E> {
        Ok(NoRepeats)
    }

    fn visit_u64<E>(self, _: u64) -> Result<NoRepeats, E> {
        Ok(NoRepeats)
    }

    fn visit_f64<E>(self, _: f64) -> Result<NoRepeats, E> {
        Ok(NoRepeats)
    }

    fn visit_str<E>(self, _: &str) -> Result<NoRepeats, E> {
        Ok(NoRepeats)
    }

    fn visit_unit<E>(self) -> Result<NoRepeats, E> {
        Ok(NoRepeats)
    }
}

fn fraction(value: &Value, field: &'static str, max: f64, expected: &'static str) -> Result<Change<f64>, PatchError> {
    match value {
        Value::Null => Ok(Change::Clear),
        Value::Number(n) => match n.as_f64() {
            Some(v) if v.is_finite() && (0.0..=max).contains(&v) => Ok(Change::Set(v)),
            _ => Err(PatchError::InvalidValue { field, expected }),
        },
        _ => Err(PatchError::InvalidValue { field, expected }),
    }
}

/// `router_queue_timeout_ms`: `null`, a number of ms for every class, or
/// an object of them by class name.
fn queue_timeouts(value: &Value) -> Result<Change<PerClass<u64>>, PatchError> {
    let invalid = || PatchError::InvalidValue {
        field: QUEUE_TIMEOUT_FIELD,
        expected: "a whole number of milliseconds from 0 to 86400000, or an object of them by class \
                   (critical, standard, sheddable; each named once)",
    };
    let ms = |value: &Value| value.as_u64().filter(|ms| *ms <= MAX_QUEUE_TIMEOUT_MS).ok_or_else(invalid);
    match value {
        Value::Null => Ok(Change::Clear),
        Value::Object(by_class) => {
            let mut timeouts = PerClass::all(0);
            let mut named = [false; Class::COUNT];
            for (name, value) in by_class {
                let class: Class = name.parse().map_err(|_| invalid())?;
                // Named twice (in two spellings: names are read in any
                // case): refused, as the flag refuses it.
                if std::mem::replace(&mut named[class.index()], true) {
                    return Err(invalid());
                }
                timeouts.0[class.index()] = ms(value)?;
            }
            Ok(Change::Set(timeouts))
        }
        value => Ok(Change::Set(PerClass::all(ms(value)?))),
    }
}

fn unsigned(value: &Value, field: &'static str) -> Result<Change<u64>, PatchError> {
    match value {
        Value::Null => Ok(Change::Clear),
        Value::Number(n) if n.as_u64().is_some() => Ok(Change::Set(n.as_u64().unwrap_or_default())),
        _ => Err(PatchError::InvalidValue { field, expected: "a non-negative integer" }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<ThresholdPatch, PatchError> {
        parse_threshold_patch(s.as_bytes())
    }

    #[test]
    fn model_only_is_a_read() {
        let p = parse(r#"{"model":"m"}"#).unwrap();
        assert!(p.is_read());
        assert_eq!(p.model, "m");
    }

    #[test]
    fn absent_set_and_clear() {
        let p = parse(
            r#"{"model":"m","active_prefill_tokens_threshold":4096,"active_prefill_tokens_threshold_frac":null}"#,
        )
        .unwrap();
        assert_eq!(p.decode, Change::Unchanged);
        assert_eq!(p.prefill, Change::Set(4096));
        assert_eq!(p.prefill_frac, Change::Clear);
        assert!(!p.is_read());
        let mut t = BusyThresholds {
            active_decode_blocks_threshold: Some(0.5),
            active_prefill_tokens_threshold_frac: Some(2.0),
            ..Default::default()
        };
        p.apply(&mut t);
        assert_eq!(
            t,
            BusyThresholds {
                active_decode_blocks_threshold: Some(0.5),
                active_prefill_tokens_threshold: Some(4096),
                active_prefill_tokens_threshold_frac: None,
                active_waiting_requests_threshold: None,
            }
        );
        let q = parse(r#"{"model":"m","router_queue_timeout_ms":250}"#).unwrap();
        assert_eq!(q.queue_timeout_ms, Change::Set(PerClass::all(250)));
        assert!(!q.is_read());
        let by_class = parse(r#"{"model":"m","router_queue_timeout_ms":{"critical":5000,"sheddable":0}}"#).unwrap();
        assert_eq!(by_class.queue_timeout_ms, Change::Set(PerClass([5000, 0, 0])), "a class not named: 0");
        for bad in [
            r#"{"urgent":1}"#,
            r#"{"critical":-1}"#,
            r#"{"critical":86400001}"#,
            r#"{"critical":null}"#,
            "[1]",
            "1.5",
            r#"{"critical":5000,"CRITICAL":7}"#,
        ] {
            let body = format!(r#"{{"model":"m","router_queue_timeout_ms":{bad}}}"#);
            assert!(parse(&body).is_err(), "{body}");
        }
        assert_eq!(parse(r#"{"model":"m","router_queue_timeout_ms":null}"#).unwrap().queue_timeout_ms, Change::Clear);
        assert!(parse(r#"{"model":"m","router_queue_timeout_ms":86400001}"#).is_err());
        assert!(parse(r#"{"model":"m","router_queue_timeout_ms":-1}"#).is_err());
        let w = parse(r#"{"model":"m","active_waiting_requests_threshold":3}"#).unwrap();
        assert_eq!(w.waiting, Change::Set(3));
        w.apply(&mut t);
        assert_eq!(t.active_waiting_requests_threshold, Some(3));
        parse(r#"{"model":"m","active_waiting_requests_threshold":null}"#).unwrap().apply(&mut t);
        assert_eq!(t.active_waiting_requests_threshold, None);
    }

    #[test]
    fn invalid_values_are_errors() {
        for body in [
            r#"{"model":"m","active_decode_blocks_threshold":1.5}"#,
            r#"{"model":"m","active_decode_blocks_threshold":-0.1}"#,
            r#"{"model":"m","active_decode_blocks_threshold":"0.5"}"#,
            r#"{"model":"m","active_prefill_tokens_threshold":-1}"#,
            r#"{"model":"m","active_prefill_tokens_threshold":1.5}"#,
            r#"{"model":"m","active_prefill_tokens_threshold":true}"#,
            r#"{"model":"m","active_prefill_tokens_threshold_frac":1000001}"#,
            r#"{"model":"m","active_prefill_tokens_threshold_frac":[1]}"#,
            r#"{"model":"m","active_waiting_requests_threshold":-1}"#,
            r#"{"model":"m","active_waiting_requests_threshold":0.5}"#,
            r#"{"model":"m","active_waiting_requests_threshold":"3"}"#,
        ] {
            assert!(matches!(parse(body), Err(PatchError::InvalidValue { .. })), "{body}");
        }
        assert_eq!(
            parse(r#"{"model":"m","active_waiting_requests_threshold":-1}"#),
            Err(PatchError::InvalidValue { field: WAITING_FIELD, expected: "a non-negative integer" })
        );
        assert_eq!(
            parse(r#"{"model":"m","active_decode_blocks":0.5}"#),
            Err(PatchError::UnknownField("active_decode_blocks".into()))
        );
        assert_eq!(parse(r#"{"active_decode_blocks_threshold":0.5}"#), Err(PatchError::Model));
        assert_eq!(parse(r#"{"model":""}"#), Err(PatchError::Model));
        assert_eq!(parse(r#"{"model":3}"#), Err(PatchError::Model));
        assert_eq!(parse("[1]"), Err(PatchError::NotAnObject));
        assert!(matches!(parse("{"), Err(PatchError::Json(_))));
    }

    #[test]
    fn accepted_values_validate() {
        let p = parse(r#"{"model":"m","active_decode_blocks_threshold":1,"active_prefill_tokens_threshold_frac":1000000,"active_prefill_tokens_threshold":0}"#).unwrap();
        let mut t = BusyThresholds::default();
        p.apply(&mut t);
        assert!(t.validate().is_ok());
    }

    /// A key given twice, at the top or in the per-class object, is an
    /// error: a `Value` would keep the last (a set turned into a clear, or
    /// the change landing on the second `"model"`).
    #[test]
    fn a_key_given_twice_is_an_error() {
        for body in [
            r#"{"model":"a","active_decode_blocks_threshold":0.5,"active_decode_blocks_threshold":null}"#,
            r#"{"model":"a","model":"b","active_decode_blocks_threshold":0.5}"#,
            r#"{"model":"a","router_queue_timeout_ms":{"critical":10,"critical":20}}"#,
        ] {
            let error = parse(body).unwrap_err();
            assert!(matches!(error, PatchError::RepeatedKey(_)), "{body}: {error:?}");
            assert!(error.to_string().contains("given twice"), "{error}");
        }
        // The same keys in different objects are not repeats.
        assert!(parse(r#"{"model":"a","router_queue_timeout_ms":{"standard":10}}"#).is_ok());
    }
}
