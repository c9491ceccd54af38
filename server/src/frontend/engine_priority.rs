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
//! Read as raw values, not a JSON tree: only the object levels on the way to
//! a priority are split into their entries; every other value is copied as
//! it came. A body is rewritten only when one of its priorities is out of
//! bounds (the head read tells whether it has any).

use std::borrow::Cow;
use std::fmt;

use loadgate::Class;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::frontend::priority::{NvextOrder, Priority};

/// The paths of the priorities an engine reads.
const PRIORITIES: [&[&str]; 2] = [&["priority"], &["nvext", "agent_hints", "priority"]];

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
            Some(b'"') => serde_json::from_str::<String>(text).ok().and_then(|s| s.trim().parse::<f64>().ok()),
            _ => text.parse::<f64>().ok(),
        };
        match number {
            // `Class` orders the highest first.
            Some(priority) if !priority.is_nan() && self.class_of(priority) >= self.class => None,
            _ => Some(self.edge()),
        }
    }

    /// `body` with every engine priority above the class replaced by the
    /// class's edge: `Ok(None)` when none is, `Err` when `body` is not a
    /// JSON object (the head read refused those already: nothing is sent
    /// unheld).
    pub(crate) fn hold(self, body: &[u8]) -> Result<Option<Vec<u8>>, NotAnObject> {
        let mut text = Cow::Borrowed(std::str::from_utf8(body).map_err(|_| NotAnObject)?);
        let mut changed = false;
        for path in PRIORITIES {
            if let Some(next) = replace_at(&text, path, &|value| self.replacement(value))? {
                text = Cow::Owned(next);
                changed = true;
            }
        }
        Ok(changed.then(|| text.into_owned().into_bytes()))
    }
}

/// A body that is not a JSON object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NotAnObject;

/// What replaces a priority (`None`: it stays).
type Fix<'a> = &'a dyn Fn(&RawValue) -> Option<i64>;

/// `object` (JSON text) with the value at `path` replaced where `fix` says,
/// at every key of that name (a repeated key too): `Ok(None)` when nothing
/// changed, `Err` when `object` is not an object.
fn replace_at(object: &str, path: &[&str], fix: Fix<'_>) -> Result<Option<String>, NotAnObject> {
    let mut out = String::new();
    let rewrite = Rewrite { path, fix, out: &mut out };
    let changed = serde_json::Deserializer::from_str(object).deserialize_map(rewrite).map_err(|_| NotAnObject)?;
    Ok(changed.then_some(out))
}

/// Writes an object's entries to `out` as they come (values copied as they
/// came, but the one at `path`), and says whether any changed.
struct Rewrite<'a> {
    path: &'a [&'a str],
    fix: Fix<'a>,
    out: &'a mut String,
}

impl<'de> Visitor<'de> for Rewrite<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let Rewrite { path, fix, out } = self;
        let (first, rest) = path.split_first().expect("a path names a key");
        let mut changed = false;
        out.push('{');
        while let Some((key, value)) = map.next_entry::<Cow<'de, str>, &'de RawValue>()? {
            if out.len() > 1 {
                out.push(',');
            }
            out.push_str(&serde_json::to_string(&key).map_err(serde::de::Error::custom)?);
            out.push(':');
            let fixed = match (key == *first, rest.is_empty()) {
                (false, _) => None,
                (true, true) => fix(value).map(|n| n.to_string()),
                // Not an object there (a string `nvext`): nothing inside.
                (true, false) => replace_at(value.get(), rest, fix).ok().flatten(),
            };
            changed |= fixed.is_some();
            out.push_str(fixed.as_deref().unwrap_or(value.get()));
        }
        out.push('}');
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{json, Value};

    use super::*;

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
            assert_eq!(ceiling.hold(body), Err(NotAnObject), "{body:?}");
        }
    }

    #[test]
    fn what_an_engine_might_read_as_a_higher_priority_is_lowered_too() {
        let ceiling = Ceiling::of(NvextOrder::Vllm, Class::Standard).unwrap();
        for value in ["\"-5\"", "\" -5 \"", "-5.0", "-1e3", "-9223372036854775809", "true", "{\"a\": 1}", "\"NaN\""] {
            let held = ceiling.hold(format!("{{\"priority\": {value}}}").as_bytes()).unwrap().map(String::from_utf8);
            assert_eq!(held, Some(Ok(r#"{"priority":0}"#.to_owned())), "{value}");
        }
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
        assert_eq!(held, r#"{"priority":0,"priority":0,"a\"b":"c","priority":0}"#);
    }
}
