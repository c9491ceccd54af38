//! [`Ceiling`]: the engine priorities a request's body may carry to its
//! engine, held to the request's class. With `--priority-from-nvext` the
//! frontend knows the engine's order, and a body's top-level `priority`
//! (vLLM's and SGLang's own field) or `nvext.agent_hints.priority` (which
//! Dynamo hands the engine as that priority) that ranks above the class
//! the frontend gave the request (a tenant's `max_class`, a trusted
//! header's lower class) is lowered to the class's edge before the body
//! goes to a worker. Without it a capped tenant would be lowered at the
//! frontend and still jump the engine's queue.
//!
//! Read in one pass over the bytes, as the head read is: every value off a
//! priority's path is skipped unread, and a priority is taken as the raw
//! text it came as, with its place in the body. Nothing is copied unless a
//! priority is above the class ([`Edits`]); then the body is written once,
//! with those values replaced, into a copy the body budget counts first.
//! What cannot be read on a priority's path (an `nvext` whose keys are not
//! text) is refused rather than sent unchecked.

use std::borrow::Cow;
use std::fmt;

use loadgate::Class;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::frontend::priority::{NvextOrder, Priority};

/// The highest engine priority a request of a class below `critical` may
/// carry, in its engine's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ceiling {
    order: NvextOrder,
    class: Class,
}

impl Ceiling {
    /// The ceiling of `class` in `order`; `None` for `critical` (any
    /// priority may go to the engine).
    pub(crate) fn of(order: NvextOrder, class: Class) -> Option<Ceiling> {
        (class != Class::Critical).then_some(Ceiling { order, class })
    }

    /// What a request of `class` may carry to its engine as a priority
    /// under `priority`'s rules (`None`: anything, or the engine's order is
    /// not known).
    pub(crate) fn for_request(priority: &Priority, class: Class) -> Option<Ceiling> {
        Ceiling::of(priority.nvext?, class)
    }

    /// The class an engine gives `priority` (as `Priority::nvext_class`,
    /// by its sign; a number past 64 bits, or with a fraction, too).
    fn class_of(self, priority: f64) -> Class {
        let sign = if priority < 0.0 { -1 } else { i32::from(priority > 0.0) };
        let first = match self.order {
            NvextOrder::Vllm => -sign,
            NvextOrder::Sglang => sign,
        };
        match first {
            1 => Class::Critical,
            0 => Class::Standard,
            _ => Class::Sheddable,
        }
    }

    /// The highest priority of the class: 0 for standard, the first step
    /// below it for sheddable.
    fn edge(self) -> i64 {
        match (self.class, self.order) {
            (Class::Sheddable, NvextOrder::Vllm) => 1,
            (Class::Sheddable, NvextOrder::Sglang) => -1,
            _ => 0,
        }
    }

    /// What to put in place of `value`, if it may rank above the class:
    /// a number above it, or a string an engine may read as one (`"-5"`),
    /// or anything else but null and numbers (null is the engine's default,
    /// standard; the edge is never above the class).
    fn replacement(self, value: &RawValue) -> Option<i64> {
        let text = value.get();
        let number = match text.as_bytes().first() {
            Some(b'n') => return None,
            // A string longer than any number worth reading is not decoded
            // (a copy of it): the edge.
            Some(b'"') if text.len() > MAX_STRING => None,
            Some(b'"') => serde_json::from_str::<String>(text).ok().and_then(|s| s.trim().parse::<f64>().ok()),
            _ => text.parse::<f64>().ok(),
        };
        match number {
            // `Class` orders the highest first.
            Some(priority) if !priority.is_nan() && self.class_of(priority) >= self.class => None,
            _ => Some(self.edge()),
        }
    }

    /// The edits that hold `body`'s engine priorities to the class (none:
    /// it goes as it came).
    ///
    /// # Errors
    ///
    /// [`Unreadable`]: not a JSON object, an object on a priority's path
    /// that does not parse, or more than [`MAX_EDITS`] priorities above the
    /// class (keys repeated).
    pub(crate) fn edits(self, body: &[u8]) -> Result<Edits, Unreadable> {
        let mut edits = Vec::new();
        let find = Find { level: Level::Top, base: body.as_ptr() as usize, ceiling: self, edits: &mut edits };
        serde_json::Deserializer::from_slice(body).deserialize_map(find).map_err(Unreadable::from)?;
        Ok(Edits(edits))
    }
}

/// The longest priority given as a string (with its quotes) that is read
/// as the number it may spell.
const MAX_STRING: usize = 64;

/// The most priorities one body may need lowered (one per key on a path;
/// more are keys repeated, which a client has no use for).
pub(crate) const MAX_EDITS: usize = 16;

/// Why a body's priorities could not be held (the 400 to send).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Unreadable(pub(crate) String);

impl From<serde_json::Error> for Unreadable {
    fn from(error: serde_json::Error) -> Self {
        Unreadable(format!("could not read the request's priorities (priority, nvext.agent_hints.priority): {error}"))
    }
}

/// One priority to replace: its bytes `at..at + len` in the body, and the
/// priority put there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Edit {
    at: usize,
    len: usize,
    priority: i64,
}

/// The priorities of a body to replace, in the body's order.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Edits(Vec<Edit>);

impl Edits {
    /// Whether the body goes as it came.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The length of `body` once edited.
    pub(crate) fn len_of(&self, body: &[u8]) -> usize {
        self.0.iter().fold(body.len(), |len, edit| len - edit.len + digits(edit.priority))
    }

    /// Writes `body`, edited, to `out`.
    pub(crate) fn apply(&self, body: &[u8], out: &mut Vec<u8>) {
        let mut from = 0;
        for edit in &self.0 {
            out.extend_from_slice(&body[from..edit.at]);
            out.extend_from_slice(edit.priority.to_string().as_bytes());
            from = edit.at + edit.len;
        }
        out.extend_from_slice(&body[from..]);
    }
}

/// The length of `n` written in decimal.
fn digits(n: i64) -> usize {
    n.to_string().len()
}

/// The object levels on a priority's path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    /// The body: `priority`, and `nvext` on the way to the other.
    Top,
    /// `nvext`: `agent_hints` on the way.
    Nvext,
    /// `nvext.agent_hints`: `priority`.
    Hints,
}

impl Level {
    /// What `key` holds at this level: a priority (`None`), the next
    /// level on the way to one, or nothing of interest.
    fn step(self, key: &str) -> Option<Option<Level>> {
        match (self, key) {
            (Level::Top | Level::Hints, "priority") => Some(None),
            (Level::Top, "nvext") => Some(Some(Level::Nvext)),
            (Level::Nvext, "agent_hints") => Some(Some(Level::Hints)),
            _ => None,
        }
    }
}

/// Finds the priorities above the ceiling in one object level (anything
/// else there: nothing inside), adding their edits.
struct Find<'e> {
    level: Level,
    /// The address of the body's first byte: raw values are slices of it.
    base: usize,
    ceiling: Ceiling,
    edits: &'e mut Vec<Edit>,
}

impl<'de> serde::de::DeserializeSeed<'de> for Find<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Find<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Find { level, base, ceiling, edits } = self;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match level.step(&key) {
                Some(None) => {
                    let value = map.next_value::<&'de RawValue>()?;
                    if let Some(priority) = ceiling.replacement(value) {
                        if edits.len() == MAX_EDITS {
                            return Err(serde::de::Error::custom(format!("more than {MAX_EDITS} priorities")));
                        }
                        let text = value.get();
                        edits.push(Edit { at: text.as_ptr() as usize - base, len: text.len(), priority });
                    }
                }
                Some(Some(next)) => {
                    map.next_value_seed(Find { level: next, base, ceiling, edits: &mut *edits })?;
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }

    // Not an object where one was on the way (`"nvext": "x"`): nothing
    // inside.
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{json, Value};

    use super::*;

    impl Ceiling {
        /// `body` edited (`None`: as it came), the length as `len_of` says.
        fn hold(self, body: &[u8]) -> Result<Option<Vec<u8>>, Unreadable> {
            let edits = self.edits(body)?;
            if edits.is_empty() {
                return Ok(None);
            }
            let mut out = Vec::new();
            edits.apply(body, &mut out);
            assert_eq!(out.len(), edits.len_of(body));
            Ok(Some(out))
        }
    }

    /// The reference: the same rule on a parsed tree.
    fn reference(ceiling: Ceiling, mut body: Value) -> Value {
        let lower = |value: &mut Value| {
            let number = match &*value {
                Value::Null => return,
                Value::Number(n) => n.as_f64(),
                Value::String(s) => s.trim().parse::<f64>().ok(),
                _ => None,
            };
            let above = match number.filter(|n| !n.is_nan()) {
                None => true,
                Some(n) => match ceiling.order {
                    NvextOrder::Vllm => n < 0.0 || (ceiling.class == Class::Sheddable && n == 0.0),
                    NvextOrder::Sglang => n > 0.0 || (ceiling.class == Class::Sheddable && n == 0.0),
                },
            };
            if above {
                let edge = match (ceiling.class, ceiling.order) {
                    (Class::Sheddable, NvextOrder::Vllm) => 1,
                    (Class::Sheddable, NvextOrder::Sglang) => -1,
                    _ => 0,
                };
                *value = json!(edge);
            }
        };
        if let Some(priority) = body.get_mut("priority") {
            lower(priority);
        }
        if let Some(priority) =
            body.get_mut("nvext").and_then(|n| n.get_mut("agent_hints")).and_then(|a| a.get_mut("priority"))
        {
            lower(priority);
        }
        body
    }

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (-1e20f64..1e20).prop_map(Value::from),
            "[ -0-9a-z.]{0,6}".prop_map(Value::from),
        ]
    }

    /// Objects whose keys are mostly the ones on a priority's path.
    fn tree() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(3, 24, 4, |inner| {
            let key = prop_oneof![Just("priority"), Just("nvext"), Just("agent_hints"), Just("model"), Just("x")];
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
                prop::collection::btree_map(key.prop_map(str::to_owned), inner, 0..4)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    /// A body: maybe a top-level priority, maybe an `nvext` (on a
    /// priority's path, or any tree), other fields, in any order.
    fn body() -> impl Strategy<Value = Value> {
        let hints = (prop::option::of(leaf()), tree()).prop_map(|(priority, x)| {
            let mut hints = json!({ "x": x });
            if let Some(priority) = priority {
                hints["priority"] = priority;
            }
            hints
        });
        let nvext = prop_oneof![hints.prop_map(|h| json!({ "agent_hints": h, "y": 1 })), tree()];
        (prop::option::of(leaf()), prop::option::of(nvext), tree()).prop_map(|(priority, nvext, model)| {
            let mut body = json!({ "model": model });
            if let Some(priority) = priority {
                body["priority"] = priority;
            }
            if let Some(nvext) = nvext {
                body["nvext"] = nvext;
            }
            body
        })
    }

    proptest! {
        #[test]
        fn holding_matches_the_reference_on_a_parsed_tree(body in body(), sglang in any::<bool>(), sheddable in any::<bool>()) {
            let order = if sglang { NvextOrder::Sglang } else { NvextOrder::Vllm };
            let class = if sheddable { Class::Sheddable } else { Class::Standard };
            let ceiling = Ceiling::of(order, class).unwrap();
            let text = serde_json::to_string_pretty(&body).unwrap();
            let expected = reference(ceiling, body.clone());
            match ceiling.hold(text.as_bytes()).unwrap() {
                Some(held) => {
                    prop_assert_ne!(&expected, &body, "rewritten with nothing to lower");
                    prop_assert_eq!(serde_json::from_slice::<Value>(&held).unwrap(), expected);
                }
                None => prop_assert_eq!(expected, body),
            }
        }
    }

    fn hold(order: NvextOrder, class: Class, body: &Value) -> Option<Value> {
        let ceiling = Ceiling::of(order, class)?;
        ceiling.hold(body.to_string().as_bytes()).unwrap().map(|b| serde_json::from_slice(&b).unwrap())
    }

    #[test]
    fn a_priority_above_the_class_is_lowered_to_its_edge() {
        let body = json!({"model": "m", "priority": -5, "nvext": {"agent_hints": {"priority": -7, "x": 1}, "y": [1]}});
        let held = hold(NvextOrder::Vllm, Class::Standard, &body).expect("lowered");
        assert_eq!(held["priority"], 0);
        assert_eq!(held["nvext"]["agent_hints"]["priority"], 0);
        assert_eq!(
            (&held["nvext"]["agent_hints"]["x"], &held["nvext"]["y"]),
            (&json!(1), &json!([1])),
            "the rest kept"
        );
        assert_eq!(held["model"], "m");
        let held = hold(NvextOrder::Vllm, Class::Sheddable, &body).unwrap();
        assert_eq!((&held["priority"], &held["nvext"]["agent_hints"]["priority"]), (&json!(1), &json!(1)));
        // SGLang: higher first.
        let body = json!({"priority": 3, "nvext": {"agent_hints": {"priority": 0}}});
        let held = hold(NvextOrder::Sglang, Class::Sheddable, &body).unwrap();
        assert_eq!((&held["priority"], &held["nvext"]["agent_hints"]["priority"]), (&json!(-1), &json!(-1)));
        assert_eq!(hold(NvextOrder::Sglang, Class::Standard, &body).unwrap()["priority"], 0);
    }

    #[test]
    fn priorities_within_the_class_are_left_as_they_came() {
        let within = json!({"priority": 9, "nvext": {"agent_hints": {"priority": null}}, "n": 1.50});
        assert_eq!(hold(NvextOrder::Vllm, Class::Sheddable, &within), None);
        assert_eq!(hold(NvextOrder::Vllm, Class::Standard, &json!({"priority": 0})), None);
        assert_eq!(hold(NvextOrder::Vllm, Class::Critical, &json!({"priority": -9})), None, "critical: anything");
        assert_eq!(hold(NvextOrder::Vllm, Class::Standard, &json!({"model": "m"})), None);
        assert_eq!(hold(NvextOrder::Vllm, Class::Standard, &json!({"nvext": "not an object"})), None);
        // Not a JSON object at all: refused (the head read refused it first).
        let ceiling = Ceiling::of(NvextOrder::Vllm, Class::Standard).unwrap();
        for body in [&b"[1]"[..], b"{\"priority\": -1", b"\xff", b"{\"\\ud800\": 1}"] {
            assert!(ceiling.hold(body).is_err(), "{body:?}");
        }
    }

    #[test]
    fn what_an_engine_might_read_as_a_higher_priority_is_lowered_too() {
        let ceiling = Ceiling::of(NvextOrder::Vllm, Class::Standard).unwrap();
        for value in ["\"-5\"", "\" -5 \"", "-5.0", "-1e3", "-9223372036854775809", "true", "{\"a\": 1}", "\"NaN\""] {
            let held = ceiling.hold(format!("{{\"priority\": {value}}}").as_bytes()).unwrap().map(String::from_utf8);
            assert_eq!(held, Some(Ok(r#"{"priority": 0}"#.to_owned())), "{value}");
        }
        let long = format!("\"{}\"", "9".repeat(MAX_STRING));
        let held = ceiling.hold(format!("{{\"priority\": {long}}}").as_bytes()).unwrap().map(String::from_utf8);
        assert_eq!(held, Some(Ok(r#"{"priority": 0}"#.to_owned())), "a long string is not decoded");
        for value in ["\"5\"", "5.5", "1e30", "9223372036854775808", "-0", "-0.0", "\"x\"".replace('x', "0").as_str()] {
            assert_eq!(
                ceiling.hold(format!("{{\"priority\": {value}}}").as_bytes()),
                Ok(None),
                "{value}: not above standard"
            );
        }
    }

    #[test]
    fn a_repeated_key_is_lowered_at_every_place_and_escaped_keys_survive() {
        let body = br#"{"priority": -1, "pr\u0069ority": -2, "a\"b": "c", "priority": -3}"#;
        let ceiling = Ceiling::of(NvextOrder::Vllm, Class::Standard).unwrap();
        let held = String::from_utf8(ceiling.hold(body).unwrap().unwrap()).unwrap();
        assert_eq!(held, r#"{"priority": 0, "pr\u0069ority": 0, "a\"b": "c", "priority": 0}"#);
    }

    /// Found by a review: an `nvext` whose key could not be read (a lone
    /// surrogate escape, which the head read skips unread) was taken as
    /// nothing to hold, and its priority went to the engine as it came.
    #[test]
    fn an_nvext_that_cannot_be_read_is_refused_not_sent_unchecked() {
        let ceiling = Ceiling::of(NvextOrder::Vllm, Class::Standard).unwrap();
        let body = br#"{"model":"m","prompt":"hi","nvext":{"\ud800":0,"agent_hints":{"priority":-100}}}"#;
        let refused = ceiling.edits(body).unwrap_err();
        assert!(refused.0.contains("priorities"), "{refused:?}");
        let body = b"{\"nvext\":{\"agent_hints\":{\"x\xff\":1,\"priority\":-100}}}";
        assert!(ceiling.edits(body).is_err(), "a key that is not UTF-8 on the way");
    }

    /// Found by a review: a body with bytes that are not UTF-8 in a string
    /// off the priorities' paths (which the head read skips unread) was
    /// refused as not an object.
    #[test]
    fn what_is_off_the_paths_is_not_read() {
        let ceiling = Ceiling::of(NvextOrder::Vllm, Class::Standard).unwrap();
        let body = b"{\"model\":\"m\",\"user\":\"\xff\",\"priority\":0,\"nvext\":{\"x\":\"\xfe\"}}";
        assert_eq!(ceiling.edits(body), Ok(Edits(Vec::new())));
        let lowered = b"{\"user\":\"\xff\",\"priority\":-3}";
        assert_eq!(ceiling.hold(lowered).unwrap().unwrap(), b"{\"user\":\"\xff\",\"priority\":0}");
    }

    #[test]
    fn keys_repeated_past_the_bound_are_refused() {
        let ceiling = Ceiling::of(NvextOrder::Vllm, Class::Standard).unwrap();
        let body = |n: usize| format!("{{{}}}", [r#""priority":-1"#].repeat(n).join(","));
        assert_eq!(ceiling.edits(body(MAX_EDITS).as_bytes()).map(|e| e.0.len()), Ok(MAX_EDITS));
        assert!(ceiling.edits(body(MAX_EDITS + 1).as_bytes()).is_err());
        assert_eq!(ceiling.edits(br#"{"priority":0}"#), Ok(Edits(Vec::new())));
    }
}
