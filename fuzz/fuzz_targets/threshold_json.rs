//! The `POST /busy_threshold` body parser against a reference built on
//! `serde_json::Value`: same verdict, same patch, and the values it accepts
//! are exactly those `BusyThresholds::validate` accepts.
#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use loadgate::patch::{parse_threshold_patch, Change, PatchError, ThresholdPatch};
use loadgate::{BusyThresholds, PerClass};
use serde_json::{Map, Value};

const DECODE: &str = "active_decode_blocks_threshold";
const PREFILL: &str = "active_prefill_tokens_threshold";
const FRAC: &str = "active_prefill_tokens_threshold_frac";
const WAITING: &str = "active_waiting_requests_threshold";
const QUEUE_TIMEOUT: &str = "router_queue_timeout_ms";

/// Bodies that are mostly well formed, so the fuzzer spends its time on the
/// field rules rather than on JSON syntax.
#[derive(Arbitrary, Debug)]
enum Body {
    Raw(Vec<u8>),
    Object(Vec<(Key, Json)>),
}

#[derive(Arbitrary, Debug)]
enum Key {
    Model,
    Decode,
    Prefill,
    Frac,
    Waiting,
    QueueTimeout,
    Other(String),
}

#[derive(Arbitrary, Debug)]
enum Json {
    Null,
    Bool(bool),
    Unsigned(u64),
    Signed(i64),
    Float(f64),
    /// A number as text: exponents, leading zeros, huge values.
    NumberText(String),
    Str(String),
    Array,
    /// An object of values by key (the per-class queue timeouts).
    ByClass(Vec<(ClassKey, Json)>),
}

#[derive(Arbitrary, Debug)]
enum ClassKey {
    Critical,
    Standard,
    Sheddable,
    Other(String),
}

impl Body {
    /// The body, and whether one of its objects names a key twice (known
    /// for the objects built here; `None` for raw bytes).
    fn bytes(self) -> (Vec<u8>, Option<bool>) {
        match self {
            Body::Raw(bytes) => (bytes, None),
            Body::Object(fields) => {
                let mut out = String::from("{");
                let mut keys = Vec::new();
                let mut repeats = false;
                for (i, (key, value)) in fields.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let key = match key {
                        Key::Model => "model".to_owned(),
                        Key::Decode => DECODE.to_owned(),
                        Key::Prefill => PREFILL.to_owned(),
                        Key::Frac => FRAC.to_owned(),
                        Key::Waiting => WAITING.to_owned(),
                        Key::QueueTimeout => QUEUE_TIMEOUT.to_owned(),
                        Key::Other(k) => k,
                    };
                    out.push_str(&Value::String(key.clone()).to_string());
                    out.push(':');
                    let (text, inner) = value.text();
                    out.push_str(&text);
                    repeats |= inner || keys.contains(&key);
                    keys.push(key);
                }
                out.push('}');
                (out.into_bytes(), Some(repeats))
            }
        }
    }
}

impl Json {
    /// Its JSON text, and whether an object in it names a key twice.
    fn text(self) -> (String, bool) {
        let text = match self {
            Json::Null => "null".to_owned(),
            Json::Bool(b) => b.to_string(),
            Json::Unsigned(n) => n.to_string(),
            Json::Signed(n) => n.to_string(),
            Json::Float(f) => serde_json::to_string(&f).unwrap(),
            Json::NumberText(t) => t.chars().filter(|c| "0123456789.eE+-".contains(*c)).collect(),
            Json::Str(s) => Value::String(s).to_string(),
            Json::Array => "[1]".to_owned(),
            Json::ByClass(fields) => {
                let mut keys = Vec::new();
                let mut repeats = false;
                let items: Vec<String> = fields
                    .into_iter()
                    .map(|(key, value)| {
                        let key = match key {
                            ClassKey::Critical => "critical".to_owned(),
                            ClassKey::Standard => "standard".to_owned(),
                            ClassKey::Sheddable => "sheddable".to_owned(),
                            ClassKey::Other(k) => k,
                        };
                        repeats |= keys.contains(&key);
                        keys.push(key.clone());
                        // Flat values only: a nested object is one more
                        // invalid value, and bounds the recursion.
                        let value = match value {
                            Json::ByClass(_) => "{}".to_owned(),
                            other => other.text().0,
                        };
                        format!("{}:{value}", Value::String(key))
                    })
                    .collect();
                return (format!("{{{}}}", items.join(",")), repeats);
            }
        };
        (text, false)
    }
}

/// Whole milliseconds of the queue timeout, 0 to a day, read from the
/// number's text.
fn queue_ms(value: &Value) -> Option<u64> {
    let text = number_text(value)?;
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let ms: u64 = text.parse().ok()?;
    (ms <= 86_400_000).then_some(ms)
}

/// A number field's value read from its JSON text, independently of
/// `Number::as_f64` / `as_u64`.
fn number_text(value: &Value) -> Option<String> {
    match value {
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// What the reference expects: the patch, or `None` for an error.
fn reference(value: &Value) -> Option<ThresholdPatch> {
    let fields: &Map<String, Value> = value.as_object()?;
    let mut patch = ThresholdPatch {
        model: String::new(),
        decode: Change::Unchanged,
        prefill: Change::Unchanged,
        prefill_frac: Change::Unchanged,
        waiting: Change::Unchanged,
        queue_timeout_ms: Change::Unchanged,
    };
    let mut model = None;
    for (key, value) in fields {
        match key.as_str() {
            "model" => model = Some(value.as_str().filter(|m| !m.is_empty())?.to_owned()),
            DECODE | FRAC => {
                let change = match value {
                    Value::Null => Change::Clear,
                    _ => {
                        let v: f64 = number_text(value)?.parse().ok()?;
                        // The range validate() accepts, asked of validate().
                        let probe = if key == DECODE {
                            BusyThresholds { active_decode_blocks_threshold: Some(v), ..Default::default() }
                        } else {
                            BusyThresholds { active_prefill_tokens_threshold_frac: Some(v), ..Default::default() }
                        };
                        probe.validate().ok()?;
                        Change::Set(v)
                    }
                };
                if key == DECODE {
                    patch.decode = change;
                } else {
                    patch.prefill_frac = change;
                }
            }
            QUEUE_TIMEOUT => {
                patch.queue_timeout_ms = match value {
                    Value::Null => Change::Clear,
                    Value::Object(by_class) => {
                        // A class not named: 0; names as `Class`'s, any
                        // ASCII case; each at most once.
                        let mut ms = [0; 3];
                        let mut named = [false; 3];
                        for (name, value) in by_class {
                            let i = ["critical", "standard", "sheddable"]
                                .iter()
                                .position(|c| c.eq_ignore_ascii_case(name))?;
                            if std::mem::replace(&mut named[i], true) {
                                return None;
                            }
                            ms[i] = queue_ms(value)?;
                        }
                        Change::Set(PerClass(ms))
                    }
                    _ => Change::Set(PerClass::all(queue_ms(value)?)),
                };
            }
            PREFILL | WAITING => {
                let change = match value {
                    Value::Null => Change::Clear,
                    _ => {
                        let text = number_text(value)?;
                        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
                            return None;
                        }
                        Change::Set(text.parse().ok()?)
                    }
                };
                if key == PREFILL {
                    patch.prefill = change;
                } else {
                    patch.waiting = change;
                }
            }
            _ => return None,
        }
    }
    patch.model = model?;
    Some(patch)
}

fn same(a: &ThresholdPatch, b: &ThresholdPatch) -> bool {
    let f = |c: Change<f64>| match c {
        Change::Set(v) => Change::Set(v.to_bits()),
        Change::Clear => Change::Clear,
        Change::Unchanged => Change::Unchanged,
    };
    a.model == b.model
        && f(a.decode) == f(b.decode)
        && a.prefill == b.prefill
        && f(a.prefill_frac) == f(b.prefill_frac)
        && a.waiting == b.waiting
        && a.queue_timeout_ms == b.queue_timeout_ms
}

/// The patch written back as JSON.
fn to_json(patch: &ThresholdPatch) -> Vec<u8> {
    let mut fields = Map::new();
    fields.insert("model".into(), Value::String(patch.model.clone()));
    let mut put = |key: &str, change: Option<Value>| {
        if let Some(v) = change {
            fields.insert(key.into(), v);
        }
    };
    let float = |c: Change<f64>| match c {
        Change::Unchanged => None,
        Change::Clear => Some(Value::Null),
        Change::Set(v) => Some(serde_json::Number::from_f64(v).unwrap().into()),
    };
    put(DECODE, float(patch.decode));
    put(FRAC, float(patch.prefill_frac));
    let whole = |c: Change<u64>| match c {
        Change::Unchanged => None,
        Change::Clear => Some(Value::Null),
        Change::Set(v) => Some(v.into()),
    };
    put(PREFILL, whole(patch.prefill));
    put(WAITING, whole(patch.waiting));
    put(
        QUEUE_TIMEOUT,
        match patch.queue_timeout_ms {
            Change::Unchanged => None,
            Change::Clear => Some(Value::Null),
            Change::Set(ms) => Some(Value::Object(
                ["critical", "standard", "sheddable"]
                    .iter()
                    .zip(ms.0)
                    .map(|(c, v)| ((*c).to_owned(), v.into()))
                    .collect(),
            )),
        },
    );
    serde_json::to_vec(&Value::Object(fields)).unwrap()
}

fuzz_target!(|data: &[u8]| {
    let Ok(body) = Body::arbitrary_take_rest(Unstructured::new(data)) else { return };
    let (body, repeats) = body.bytes();
    let got = parse_threshold_patch(&body);
    let Ok(value) = serde_json::from_slice::<Value>(&body) else {
        assert!(matches!(got, Err(PatchError::Json(_))), "{:?}: {got:?}", String::from_utf8_lossy(&body));
        return;
    };
    if !value.is_object() {
        assert_eq!(got, Err(PatchError::NotAnObject));
        return;
    }
    // A key given twice is refused whatever else the body holds (`Value`
    // keeps the last: the reference below cannot see it).
    let refused_as_repeat = matches!(got, Err(PatchError::RepeatedKey(_)));
    match repeats {
        Some(repeats) => assert_eq!(refused_as_repeat, repeats, "{value}: {got:?}"),
        // Raw bytes: a repeat the parser found is not checked here.
        None if refused_as_repeat => return,
        None => {}
    }
    if refused_as_repeat {
        return;
    }
    match (reference(&value), &got) {
        (Some(expected), Ok(patch)) => {
            assert!(same(&expected, patch), "{value}: expected {expected:?}, got {patch:?}");
            // Whatever it accepts, applied to any thresholds, validates.
            let mut t = BusyThresholds {
                active_decode_blocks_threshold: Some(0.5),
                active_prefill_tokens_threshold: Some(7),
                active_prefill_tokens_threshold_frac: Some(2.0),
                active_waiting_requests_threshold: Some(4),
            };
            patch.apply(&mut t);
            assert!(t.validate().is_ok(), "{value}: {t:?}");
            assert_eq!(patch.is_read(), fields_given(&value) == 0);
            // And it reads back what it would write.
            let again = parse_threshold_patch(&to_json(patch)).expect("re-parse");
            assert!(same(patch, &again), "{patch:?} -> {again:?}");
        }
        (None, Err(_)) => {}
        (expected, got) => panic!("{value}: reference {expected:?}, parser {got:?}"),
    }
});

fn fields_given(value: &Value) -> usize {
    value.as_object().map_or(0, |o| o.keys().filter(|k| *k != "model").count())
}
