//! What the proxy reads of an OpenAI request body: the model and, for the
//! router's own tracking (`--router-mode kv`), the prompt's size.
//!
//! Read in one pass over the bytes without building a JSON tree: a body of
//! 150 MB costs no second copy. Strings without escapes are borrowed from
//! the body; every field the proxy does not need is skipped. The counts are
//! those of [`crate::tokens::prompt_tokens`] on the parsed value.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use loadgate::metrics::Endpoint;

/// The fields of a request the proxy uses.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct RequestHead {
    /// The non-empty `model`.
    pub(crate) model: String,
    /// Prompt tokens (0 unless counted).
    pub(crate) prompt_tokens: u64,
}

/// Reads the model (and, if `count_prompt`, the prompt tokens) of `body`.
///
/// # Errors
///
/// The message for a 400: not JSON, not an object, or no non-empty string
/// `model`.
pub(crate) fn read_head(endpoint: Endpoint, body: &[u8], count_prompt: bool) -> Result<RequestHead, String> {
    let is_object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    if !is_object {
        return match serde_json::from_slice::<IgnoredAny>(body) {
            Ok(_) => Err("request body must be a JSON object".to_owned()),
            Err(e) => Err(format!("request body is not valid JSON: {e}")),
        };
    }
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let fields = Fields { endpoint, count_prompt }
        .deserialize(&mut deserializer)
        .and_then(|fields| deserializer.end().map(|()| fields))
        .map_err(|e| format!("request body is not valid JSON: {e}"))?;
    match fields.model {
        Some(model) if !model.is_empty() => Ok(RequestHead { model: model.into_owned(), prompt_tokens: fields.prompt }),
        _ => Err("\"model\" must be a non-empty string".to_owned()),
    }
}

/// The top-level object.
struct Fields {
    endpoint: Endpoint,
    count_prompt: bool,
}

struct Found<'de> {
    model: Option<Cow<'de, str>>,
    prompt: u64,
}

impl<'de> DeserializeSeed<'de> for Fields {
    type Value = Found<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Found<'de>, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Fields {
    type Value = Found<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found<'de>, A::Error> {
        let mut found = Found { model: None, prompt: 0 };
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match (&*key, self.endpoint) {
                ("model", _) => found.model = map.next_value_seed(MaybeStr)?,
                ("prompt", Endpoint::Completions) if self.count_prompt => {
                    found.prompt = map.next_value_seed(Count(Shape::Prompt))?;
                }
                ("messages", Endpoint::ChatCompletions) if self.count_prompt => {
                    found.prompt = map.next_value_seed(Count(Shape::Messages))?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(found)
    }
}

/// A string (borrowed when it has no escapes), or `None` for any other value.
struct MaybeStr;

impl<'de> DeserializeSeed<'de> for MaybeStr {
    type Value = Option<Cow<'de, str>>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MaybeStr {
    type Value = Option<Cow<'de, str>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Some(Cow::Borrowed(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Some(Cow::Owned(v.to_owned())))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        IgnoredAny.visit_seq(seq).map(|_| None)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        IgnoredAny.visit_map(map).map(|_| None)
    }
}

/// Which counting rule applies to a value.
#[derive(Clone, Copy)]
enum Shape {
    /// A completions `prompt`: a string (words), token ids (their number),
    /// or a batch of either (the sum).
    Prompt,
    /// Chat `messages`: the sum over each message's `content`.
    Messages,
    /// One message: only its `content` counts.
    Message,
    /// A `content`: a string, or parts whose `text` strings count.
    Content,
    /// One part of a `content`: only its string `text` counts.
    Part,
    /// A part's `text`: words if it is a string.
    Text,
}

/// Counts tokens of one value by its [`Shape`]; any value of another type
/// counts 0 (and is skipped).
struct Count(Shape);

impl<'de> DeserializeSeed<'de> for Count {
    type Value = u64;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<u64, D::Error> {
        deserializer.deserialize_any(self)
    }
}

fn words(s: &str) -> u64 {
    s.split_whitespace().count() as u64
}

impl<'de> Visitor<'de> for Count {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        Ok(match self.0 {
            Shape::Prompt | Shape::Content | Shape::Text => words(v),
            Shape::Messages | Shape::Message | Shape::Part => 0,
        })
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<u64, E> {
        Ok(0)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<u64, E> {
        Ok(0)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<u64, E> {
        Ok(0)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<u64, E> {
        Ok(0)
    }

    fn visit_unit<E: de::Error>(self) -> Result<u64, E> {
        Ok(0)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<u64, A::Error> {
        match self.0 {
            Shape::Prompt => {
                // Token ids when every item is a number; else the items' sum.
                let (mut len, mut sum, mut all_numbers) = (0u64, 0u64, true);
                while let Some(item) = seq.next_element_seed(PromptItemVisitor)? {
                    len += 1;
                    match item {
                        PromptItem::NUMBER => {}
                        count => {
                            all_numbers = false;
                            sum = sum.saturating_add(count.0);
                        }
                    }
                }
                Ok(if all_numbers { len } else { sum })
            }
            Shape::Messages | Shape::Content => {
                let item = if matches!(self.0, Shape::Messages) { Shape::Message } else { Shape::Part };
                let mut sum = 0u64;
                while let Some(count) = seq.next_element_seed(Count(item))? {
                    sum = sum.saturating_add(count);
                }
                Ok(sum)
            }
            Shape::Message | Shape::Part | Shape::Text => IgnoredAny.visit_seq(seq).map(|_| 0),
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<u64, A::Error> {
        let wanted = match self.0 {
            Shape::Message => Some(("content", Shape::Content)),
            Shape::Part => Some(("text", Shape::Text)),
            _ => None,
        };
        let Some((field, shape)) = wanted else { return IgnoredAny.visit_map(map).map(|_| 0) };
        let mut count = 0;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key == field {
                count = map.next_value_seed(Count(shape))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(count)
    }
}

/// One item of a prompt array: a number (for the token-id rule), or any
/// other value with its own prompt count.
#[derive(Clone, Copy, PartialEq, Eq)]
struct PromptItem(u64, bool);

impl PromptItem {
    const NUMBER: PromptItem = PromptItem(0, true);
}

/// Reads one [`PromptItem`].
struct PromptItemVisitor;

impl<'de> DeserializeSeed<'de> for PromptItemVisitor {
    type Value = PromptItem;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<PromptItem, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PromptItemVisitor {
    type Value = PromptItem;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<PromptItem, E> {
        Ok(PromptItem::NUMBER)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<PromptItem, E> {
        Ok(PromptItem::NUMBER)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<PromptItem, E> {
        Ok(PromptItem::NUMBER)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<PromptItem, E> {
        Count(Shape::Prompt).visit_str(v).map(|n| PromptItem(n, false))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<PromptItem, E> {
        Ok(PromptItem(0, false))
    }

    fn visit_unit<E: de::Error>(self) -> Result<PromptItem, E> {
        Ok(PromptItem(0, false))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<PromptItem, A::Error> {
        Count(Shape::Prompt).visit_seq(seq).map(|n| PromptItem(n, false))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<PromptItem, A::Error> {
        IgnoredAny.visit_map(map).map(|_| PromptItem(0, false))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::tokens::prompt_tokens;

    fn head(endpoint: Endpoint, body: &str) -> Result<RequestHead, String> {
        read_head(endpoint, body.as_bytes(), true)
    }

    #[test]
    fn counts_as_the_parsed_value_does() {
        let cases = [
            (Endpoint::Completions, json!({"model": "m", "prompt": "one two  three"})),
            (Endpoint::Completions, json!({"model": "m", "prompt": [1, 2, 3, 4]})),
            (Endpoint::Completions, json!({"model": "m", "prompt": []})),
            (Endpoint::Completions, json!({"model": "m", "prompt": ["a b", "c", [1, 2], 7, null, {"x": 1}]})),
            (Endpoint::Completions, json!({"model": "m", "prompt": [[1, 2, 3], [4]]})),
            (Endpoint::Completions, json!({"model": "m", "prompt": {"a": "b c"}})),
            (Endpoint::Completions, json!({"model": "m", "prompt": "esc\\\"aped\nwords \u{e9}t\u{e9}"})),
            (Endpoint::Completions, json!({"model": "m"})),
            (Endpoint::Completions, json!({"messages": [{"content": "not counted here"}], "model": "m"})),
            (
                Endpoint::ChatCompletions,
                json!({"model": "m", "messages": [
                    {"role": "user", "content": "a b c"},
                    {"content": [{"type": "text", "text": "d e"}, {"text": 5}, "loose", {"image": "x"}]},
                    {"content": 3},
                    "not a message",
                    {"role": "system"},
                ]}),
            ),
            (Endpoint::ChatCompletions, json!({"model": "m", "messages": "no"})),
            (Endpoint::ChatCompletions, json!({"model": "m", "prompt": "ignored"})),
        ];
        for (endpoint, value) in cases {
            let body = value.to_string();
            let read = head(endpoint, &body).unwrap();
            assert_eq!(read.model, "m");
            assert_eq!(read.prompt_tokens, prompt_tokens(endpoint, &value), "{body}");
            // Without counting, only the model is read.
            assert_eq!(read_head(endpoint, body.as_bytes(), false).unwrap().prompt_tokens, 0);
        }
    }

    #[test]
    fn refuses_what_the_proxy_refused() {
        let not_object = Err("request body must be a JSON object".to_owned());
        assert_eq!(head(Endpoint::Completions, "[1, 2]"), not_object);
        assert_eq!(head(Endpoint::Completions, " \"m\""), not_object);
        for body in ["", "{", "{\"model\": \"m\"} trailing", "nope", "{\"model\": \"m\", }"] {
            let error = head(Endpoint::Completions, body).unwrap_err();
            assert!(error.starts_with("request body is not valid JSON"), "{body}: {error}");
        }
        let no_model = Err("\"model\" must be a non-empty string".to_owned());
        for body in
            [r#"{}"#, r#"{"model": ""}"#, r#"{"model": 5}"#, r#"{"model": {"name": "m"}}"#, r#"{"model": ["m"]}"#]
        {
            assert_eq!(head(Endpoint::ChatCompletions, body), no_model, "{body}");
        }
        // The last of a repeated key wins, as in a parsed value.
        let value: Value = serde_json::from_str(r#"{"model": "a", "model": "b"}"#).unwrap();
        assert_eq!(value["model"], "b");
        assert_eq!(head(Endpoint::Completions, r#"{"model": "a", "model": "b"}"#).unwrap().model, "b");
        assert_eq!(head(Endpoint::Completions, r#"{"model": "caf\u00e9"}"#).unwrap().model, "café");
    }

    #[test]
    fn a_large_prompt_is_read_without_a_tree() {
        let body = format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(8 << 20));
        let read = read_head(Endpoint::Completions, body.as_bytes(), true).unwrap();
        assert_eq!(read, RequestHead { model: "m".to_owned(), prompt_tokens: 1 });
    }
}
