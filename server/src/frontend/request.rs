//! What the proxy reads of an OpenAI request body: the model and, for the
//! router's own tracking (`--router-mode kv`), the prompt's size; and the
//! fields whose type it checks, so that a wrong one gets a 400 naming it
//! before any worker is asked (the rules and messages of
//! [`crate::openai`]'s module doc, which the worker applies too).
//!
//! Read in one pass over the bytes without building a JSON tree: a body of
//! 150 MB costs no second copy. Strings without escapes are borrowed from
//! the body; every field the proxy does not check is skipped. The counts are
//! those of [`crate::tokens::prompt_tokens`] on the parsed value.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use loadgate::metrics::Endpoint;

use crate::openai::{checked_token_limit, Field, InvalidRequest};

mod reading;
pub(crate) use self::reading::Reading;

/// The fields of a request the proxy uses.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct RequestHead {
    /// The non-empty `model`.
    pub(crate) model: String,
    /// Prompt tokens (0 unless counted).
    pub(crate) prompt_tokens: u64,
    /// `nvext.agent_hints.priority`, when asked for and given.
    pub(crate) priority: Option<i64>,
}

/// Reads the model (and, if `count_prompt`, the prompt tokens) of `body`,
/// checking the types of the fields of [`crate::openai`]'s module doc.
///
/// # Errors
///
/// The 400 to send: not JSON, not an object, or a field missing or of the
/// wrong type (named in `param`; the first in the module doc's order), as an
/// [`InvalidRequest`] or its message (`String`, from which
/// `reply::bad_request` recovers the field).
pub(crate) fn read_head<E: From<InvalidRequest>>(
    endpoint: Endpoint,
    body: &[u8],
    reading: Reading,
) -> Result<RequestHead, E> {
    read_request(endpoint, body, reading).map_err(E::from)
}

/// [`read_head`] with the error as an [`InvalidRequest`].
fn read_request(endpoint: Endpoint, body: &[u8], reading: Reading) -> Result<RequestHead, InvalidRequest> {
    let count_prompt = reading.prompt;
    let is_object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    if !is_object {
        return match serde_json::from_slice::<IgnoredAny>(body) {
            Ok(_) => Err(InvalidRequest::body("request body must be a JSON object")),
            Err(e) => Err(InvalidRequest::body(format!("request body is not valid JSON: {e}"))),
        };
    }
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let found = Fields { endpoint, count: count_prompt, nvext: reading.nvext_priority }
        .deserialize(&mut deserializer)
        .and_then(|found| deserializer.end().map(|()| found))
        .map_err(|e| InvalidRequest::body(format!("request body is not valid JSON: {e}")))?;
    let head = found.check(endpoint)?;
    Ok(if count_prompt { head } else { RequestHead { prompt_tokens: 0, ..head } })
}

/// A value of a type its field does not take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Wrong;

/// What was read of each checked field (`None`: absent; the last of a
/// repeated key wins, as in a parsed value).
struct Found<'de> {
    /// The model, or `None` when it is not a non-empty string.
    model: Option<Option<Cow<'de, str>>>,
    /// `prompt` (completions) or `messages` (chat): its tokens.
    prompt: Option<Result<u64, Wrong>>,
    /// Whether `max_tokens` is within bounds.
    max_tokens: Option<bool>,
    /// Whether `max_completion_tokens` is within bounds.
    max_completion_tokens: Option<bool>,
    /// `stream` (`Ok(None)`: null).
    stream: Option<Result<Option<bool>, Wrong>>,
    /// `stream_options`: whether it is given (not null), or the field at fault.
    stream_options: Option<Result<bool, Field>>,
    /// `nvext.agent_hints.priority` (read only when asked; `Err`: not an
    /// integer, or `nvext` or `agent_hints` not an object).
    priority: Result<Option<i64>, Wrong>,
}

impl<'de> Found<'de> {
    /// The head, or the first field at fault in the module doc's order.
    fn check(self, endpoint: Endpoint) -> Result<RequestHead, InvalidRequest> {
        let Some(Some(model)) = self.model else { return Err(Field::Model.invalid()) };
        let prompt_field = match endpoint {
            Endpoint::Completions => Field::Prompt,
            Endpoint::ChatCompletions => Field::Messages,
        };
        let Some(Ok(prompt_tokens)) = self.prompt else { return Err(prompt_field.invalid()) };
        if self.max_tokens == Some(false) {
            return Err(Field::MaxTokens.invalid());
        }
        if self.max_completion_tokens == Some(false) {
            return Err(Field::MaxCompletionTokens.invalid());
        }
        let stream = match self.stream {
            Some(Err(Wrong)) => return Err(Field::Stream.invalid()),
            Some(Ok(stream)) => stream.unwrap_or(false),
            None => false,
        };
        match self.stream_options {
            Some(Err(field)) => return Err(field.invalid()),
            Some(Ok(true)) if !stream => return Err(InvalidRequest::stream_options_without_stream()),
            _ => {}
        }
        let Ok(priority) = self.priority else {
            return Err(InvalidRequest {
                param: Some(PRIORITY_PARAM),
                message: format!(
                    "\"{PRIORITY_PARAM}\" must be an integer (and \"nvext\" and its \"agent_hints\" objects)"
                ),
            });
        };
        Ok(RequestHead { model: model.into_owned(), prompt_tokens, priority })
    }
}

/// The top-level object.
struct Fields {
    endpoint: Endpoint,
    /// Count the prompt's tokens (else only check its shape).
    count: bool,
    /// Read `nvext.agent_hints.priority`.
    nvext: bool,
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
        let mut found = Found {
            model: None,
            prompt: None,
            max_tokens: None,
            max_completion_tokens: None,
            stream: None,
            stream_options: None,
            priority: Ok(None),
        };
        let count = self.count;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match (&*key, self.endpoint) {
                ("model", _) => found.model = Some(map.next_value_seed(Checked(Model))?),
                ("prompt", Endpoint::Completions) => {
                    found.prompt = Some(map.next_value_seed(Checked(Prompt { count }))?)
                }
                ("messages", Endpoint::ChatCompletions) => {
                    found.prompt = Some(map.next_value_seed(Checked(Messages { count }))?);
                }
                ("max_tokens", _) => found.max_tokens = Some(map.next_value_seed(Checked(TokenLimit))?),
                ("max_completion_tokens", _) => {
                    found.max_completion_tokens = Some(map.next_value_seed(Checked(TokenLimit))?);
                }
                ("stream", _) => found.stream = Some(map.next_value_seed(Checked(Flag))?),
                ("stream_options", _) => found.stream_options = Some(map.next_value_seed(Checked(StreamOptions))?),
                ("nvext", _) if self.nvext => found.priority = map.next_value_seed(Checked(NVEXT))?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(found)
    }
}

/// A JSON value that is not a container, as a [`Check`] sees it.
#[derive(Clone, Copy, Debug)]
enum Scalar<'a> {
    Null,
    Bool(bool),
    /// A non-negative integer.
    Unsigned(u64),
    /// A negative integer.
    Negative(i64),
    /// A number with a fraction or exponent (or past 64 bits).
    OtherNumber,
    Str(&'a str),
}

/// What one field (or part of one) takes: each JSON type is read by one
/// method, and any type whose method is left out is [`wrong`](Check::wrong)
/// (a container is then skipped). Read through [`Checked`].
trait Check<'de>: Sized {
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
struct Checked<C>(C);

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

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<C::Out, E> {
        Ok(self.0.scalar(Scalar::OtherNumber))
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

fn words(s: &str) -> u64 {
    s.split_whitespace().count() as u64
}

/// `model`: a non-empty string, borrowed when it has no escapes (`None`:
/// anything else).
struct Model;

impl<'de> Check<'de> for Model {
    type Out = Option<Cow<'de, str>>;

    fn wrong(self) -> Self::Out {
        None
    }

    fn borrowed_str(self, value: &'de str) -> Self::Out {
        (!value.is_empty()).then_some(Cow::Borrowed(value))
    }

    fn scalar(self, value: Scalar<'_>) -> Self::Out {
        match value {
            Scalar::Str(s) if !s.is_empty() => Some(Cow::Owned(s.to_owned())),
            _ => None,
        }
    }
}

/// `stream`, `include_usage`: a boolean or null (`Ok(None)`).
#[derive(Clone, Copy)]
struct Flag;

impl Check<'_> for Flag {
    type Out = Result<Option<bool>, Wrong>;

    fn wrong(self) -> Self::Out {
        Err(Wrong)
    }

    fn scalar(self, value: Scalar<'_>) -> Self::Out {
        match value {
            Scalar::Null => Ok(None),
            Scalar::Bool(b) => Ok(Some(b)),
            _ => Err(Wrong),
        }
    }
}

/// `max_tokens`, `max_completion_tokens`: null, or an integer within
/// bounds (true).
struct TokenLimit;

impl Check<'_> for TokenLimit {
    type Out = bool;

    fn wrong(self) -> bool {
        false
    }

    fn scalar(self, value: Scalar<'_>) -> bool {
        match value {
            Scalar::Null => true,
            Scalar::Unsigned(n) => checked_token_limit(Some(n)).is_some(),
            _ => false,
        }
    }
}

/// `stream_options`: null (`Ok(false)`), or an object whose
/// `include_usage` is a boolean or null (`Ok(true)`); else the field at fault.
struct StreamOptions;

impl<'de> Check<'de> for StreamOptions {
    type Out = Result<bool, Field>;

    fn wrong(self) -> Self::Out {
        Err(Field::StreamOptions)
    }

    fn scalar(self, value: Scalar<'_>) -> Self::Out {
        match value {
            Scalar::Null => Ok(false),
            _ => self.wrong(),
        }
    }

    fn map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Out, A::Error> {
        let include_usage = Within { key: "include_usage", inner: Flag }.map(map)?;
        Ok(include_usage.map(|_| true).map_err(|Wrong| Field::IncludeUsage))
    }
}

/// The `param` of a priority in the body.
const PRIORITY_PARAM: &str = "nvext.agent_hints.priority";

/// An object (or null) of which only `key` is read, with `inner` (every
/// other field skipped unread; the last of a repeated key wins).
#[derive(Clone, Copy)]
struct Within<C> {
    key: &'static str,
    inner: C,
}

/// `nvext`, as far as `agent_hints.priority`.
const NVEXT: Within<Within<Priority>> =
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
struct Priority;

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
            _ => self.wrong(),
        }
    }
}

/// A completions `prompt`: a string (its words), an array of strings (the
/// sum), of token ids (their number) or of arrays of token ids (the sum of
/// their numbers). Words are counted only if `count`.
struct Prompt {
    count: bool,
}

/// One item of a prompt array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Item {
    /// A string of this many words.
    Words(u64),
    /// A token id.
    Id,
    /// An array of this many token ids.
    Ids(u64),
    /// Anything else.
    Wrong,
}

impl<'de> Check<'de> for Prompt {
    type Out = Result<u64, Wrong>;

    fn wrong(self) -> Self::Out {
        Err(Wrong)
    }

    fn scalar(self, value: Scalar<'_>) -> Self::Out {
        match value {
            Scalar::Str(s) => Ok(if self.count { words(s) } else { 0 }),
            _ => Err(Wrong),
        }
    }

    fn seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Out, A::Error> {
        // Every item of one kind: their sum (a token id counts 1).
        let (mut first, mut total) = (None, 0u64);
        while let Some(item) = seq.next_element_seed(Checked(PromptItem { count: self.count }))? {
            let kind = std::mem::discriminant(&item);
            if item == Item::Wrong || *first.get_or_insert(kind) != kind {
                return IgnoredAny.visit_seq(seq).map(|_| Err(Wrong));
            }
            total = total.saturating_add(match item {
                Item::Words(n) | Item::Ids(n) => n,
                Item::Id => 1,
                Item::Wrong => 0,
            });
        }
        Ok(Ok(total))
    }
}

/// One item of a prompt array.
struct PromptItem {
    count: bool,
}

impl<'de> Check<'de> for PromptItem {
    type Out = Item;

    fn wrong(self) -> Item {
        Item::Wrong
    }

    fn scalar(self, value: Scalar<'_>) -> Item {
        match value {
            Scalar::Str(s) => Item::Words(if self.count { words(s) } else { 0 }),
            Scalar::Unsigned(_) => Item::Id,
            _ => Item::Wrong,
        }
    }

    fn seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Item, A::Error> {
        let mut ids = 0u64;
        while let Some(is_id) = seq.next_element_seed(Checked(TokenId))? {
            if !is_id {
                return IgnoredAny.visit_seq(seq).map(|_| Item::Wrong);
            }
            ids += 1;
        }
        Ok(Item::Ids(ids))
    }
}

/// A token id: a non-negative integer.
struct TokenId;

impl Check<'_> for TokenId {
    type Out = bool;

    fn wrong(self) -> bool {
        false
    }

    fn scalar(self, value: Scalar<'_>) -> bool {
        matches!(value, Scalar::Unsigned(_))
    }
}

/// Chat `messages`: a non-empty array of objects; the sum of their
/// contents' words (if `count`).
struct Messages {
    count: bool,
}

impl<'de> Check<'de> for Messages {
    type Out = Result<u64, Wrong>;

    fn wrong(self) -> Self::Out {
        Err(Wrong)
    }

    fn seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Out, A::Error> {
        let (mut messages, mut total) = (0usize, 0u64);
        while let Some(message) = seq.next_element_seed(Checked(Message { count: self.count }))? {
            let Some(tokens) = message else { return IgnoredAny.visit_seq(seq).map(|_| Err(Wrong)) };
            messages += 1;
            total = total.saturating_add(tokens);
        }
        Ok(if messages == 0 { Err(Wrong) } else { Ok(total) })
    }
}

/// One message: an object (`None`: anything else); its `content`'s words.
struct Message {
    count: bool,
}

impl<'de> Check<'de> for Message {
    type Out = Option<u64>;

    fn wrong(self) -> Option<u64> {
        None
    }

    fn map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<u64>, A::Error> {
        let mut tokens = 0;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if self.count && key == "content" {
                tokens = map.next_value_seed(Checked(Content))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Some(tokens))
    }
}

/// A message's `content` (not checked): the words of a string, or of the
/// string `text`s of its parts; 0 for anything else.
struct Content;

impl<'de> Check<'de> for Content {
    type Out = u64;

    fn wrong(self) -> u64 {
        0
    }

    fn scalar(self, value: Scalar<'_>) -> u64 {
        match value {
            Scalar::Str(s) => words(s),
            _ => 0,
        }
    }

    fn seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<u64, A::Error> {
        let mut total = 0u64;
        while let Some(tokens) = seq.next_element_seed(Checked(Part))? {
            total = total.saturating_add(tokens);
        }
        Ok(total)
    }
}

/// One part of a content: the words of its string `text`.
struct Part;

impl<'de> Check<'de> for Part {
    type Out = u64;

    fn wrong(self) -> u64 {
        0
    }

    fn map<A: MapAccess<'de>>(self, mut map: A) -> Result<u64, A::Error> {
        let mut tokens = 0;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key == "text" {
                tokens = map.next_value_seed(Checked(Text))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(tokens)
    }
}

/// A part's `text`: the words of a string; 0 for anything else.
struct Text;

impl Check<'_> for Text {
    type Out = u64;

    fn wrong(self) -> u64 {
        0
    }

    fn scalar(self, value: Scalar<'_>) -> u64 {
        match value {
            Scalar::Str(s) => words(s),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests;
