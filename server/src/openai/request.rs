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

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use loadgate::metrics::Endpoint;

use crate::openai::{
    checked_token_limit, Api, Field, GenerationRequest, InvalidRequest, DEFAULT_MAX_TOKENS, MAX_MODEL_LEN,
};
use crate::tokens::words;

mod check;
mod reading;
mod text;
use self::check::{Check, Checked, Scalar, Wrong};
pub(crate) use self::reading::Reading;
use self::reading::{Within, NVEXT, PRIORITY_PARAM};
use self::text::AllText;

/// The fields of a request the proxy uses.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct RequestHead {
    /// The non-empty `model`.
    pub(crate) model: String,
    /// Prompt tokens (0 unless counted).
    pub(crate) prompt_tokens: u64,
    /// `nvext.agent_hints.priority`, when asked for and given.
    pub(crate) priority: Option<i64>,
    /// Whether it has a field an engine may read a priority from (a
    /// top-level `priority`, or `nvext`): see `frontend::engine_priority`.
    pub(crate) engine_priority: bool,
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

/// What the simulated worker needs of a request body, read in the same one
/// pass (the prompt's tokens counted): the answer of
/// [`crate::openai::parse_request`] on the parsed value, without the tree
/// (whose nodes take many times the body's size; the worker reads a body
/// before its cap admits it).
///
/// # Errors
///
/// The 400 to send, as [`read_head`]'s.
pub(crate) fn read_generation(api: Api, body: &[u8]) -> Result<GenerationRequest, InvalidRequest> {
    let endpoint = match api {
        Api::Completions => Endpoint::Completions,
        Api::ChatCompletions => Endpoint::ChatCompletions,
    };
    let read = read_fields(endpoint, body, Reading { prompt: true, nvext_priority: false })?;
    Ok(GenerationRequest {
        model: read.head.model,
        prompt_tokens: u32::try_from(read.head.prompt_tokens).unwrap_or(u32::MAX),
        max_tokens: read.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        stream: read.stream,
        include_usage: read.include_usage,
    })
}

/// A request read whole: its head and how to answer it.
struct Read {
    head: RequestHead,
    /// `max_tokens`, else `max_completion_tokens`, if given.
    max_tokens: Option<u32>,
    stream: bool,
    /// `stream_options.include_usage`.
    include_usage: bool,
}

/// [`read_head`] with the error as an [`InvalidRequest`].
fn read_request(endpoint: Endpoint, body: &[u8], reading: Reading) -> Result<RequestHead, InvalidRequest> {
    read_fields(endpoint, body, reading).map(|read| read.head)
}

/// Reads every checked field of `body`.
fn read_fields(endpoint: Endpoint, body: &[u8], reading: Reading) -> Result<Read, InvalidRequest> {
    let count_prompt = reading.prompt;
    // JSON is UTF-8 throughout, and serde_json checks only the strings it
    // reads, not those it skips: the whole body is checked first (as a
    // parsed value's reader does), so that no field passes unread with
    // bytes no engine would take.
    let body = std::str::from_utf8(body)
        .map_err(|e| InvalidRequest::body(format!("request body is not valid JSON: not UTF-8 ({e})")))?;
    let is_object = body.bytes().find(|b| !b.is_ascii_whitespace()) == Some(b'{');
    if !is_object {
        return match serde_json::from_str::<IgnoredAny>(body) {
            Ok(_) => Err(InvalidRequest::body("request body must be a JSON object")),
            Err(e) => Err(InvalidRequest::body(format!("request body is not valid JSON: {e}"))),
        };
    }
    let mut deserializer = serde_json::Deserializer::from_str(body);
    let found = Fields { endpoint, count: count_prompt, nvext: reading.nvext_priority }
        .deserialize(&mut deserializer)
        .and_then(|found| deserializer.end().map(|()| found))
        .map_err(|e| InvalidRequest::body(format!("request body is not valid JSON: {e}")))?;
    let read = found.check(endpoint)?;
    Ok(if count_prompt { read } else { Read { head: RequestHead { prompt_tokens: 0, ..read.head }, ..read } })
}

/// What was read of each checked field (`None`: absent; the last of a
/// repeated key wins, as in a parsed value).
struct Found<'de> {
    /// The model, or the 400 when it is not a non-empty string within
    /// [`MAX_MODEL_LEN`].
    model: Option<Result<Cow<'de, str>, InvalidRequest>>,
    /// `prompt` (completions) or `messages` (chat): its tokens.
    prompt: Option<Result<u64, Wrong>>,
    /// A chat's `tools` (rendered into the prompt): their tokens.
    tools: u64,
    /// `max_tokens` (`Ok(None)`: null), or out of bounds.
    max_tokens: Option<Result<Option<u32>, Wrong>>,
    /// `max_completion_tokens`, the same.
    max_completion_tokens: Option<Result<Option<u32>, Wrong>>,
    /// `stream` (`Ok(None)`: null).
    stream: Option<Result<Option<bool>, Wrong>>,
    /// `stream_options`: `include_usage` if it is given (not null), or the
    /// field at fault.
    stream_options: Option<Result<Option<bool>, Field>>,
    /// `nvext.agent_hints.priority` (read only when asked; `Err`: not an
    /// integer, or `nvext` or `agent_hints` not an object).
    priority: Result<Option<i64>, Wrong>,
    /// A top-level `priority` or an `nvext` was seen.
    engine_priority: bool,
}

impl<'de> Found<'de> {
    /// The request, or the first field at fault in the module doc's order.
    fn check(self, endpoint: Endpoint) -> Result<Read, InvalidRequest> {
        let model = self.model.unwrap_or_else(|| Err(Field::Model.invalid()))?;
        let prompt_field = match endpoint {
            Endpoint::Completions => Field::Prompt,
            Endpoint::ChatCompletions => Field::Messages,
        };
        let Some(Ok(prompt_tokens)) = self.prompt else { return Err(prompt_field.invalid()) };
        let prompt_tokens = prompt_tokens.saturating_add(self.tools);
        let Ok(max_tokens) = self.max_tokens.unwrap_or(Ok(None)) else { return Err(Field::MaxTokens.invalid()) };
        let Ok(max_completion_tokens) = self.max_completion_tokens.unwrap_or(Ok(None)) else {
            return Err(Field::MaxCompletionTokens.invalid());
        };
        let stream = match self.stream {
            Some(Err(Wrong)) => return Err(Field::Stream.invalid()),
            Some(Ok(stream)) => stream.unwrap_or(false),
            None => false,
        };
        let include_usage = match self.stream_options {
            Some(Err(field)) => return Err(field.invalid()),
            Some(Ok(Some(_))) if !stream => return Err(InvalidRequest::stream_options_without_stream()),
            Some(Ok(include_usage)) => include_usage.unwrap_or(false),
            None => false,
        };
        let Ok(priority) = self.priority else {
            return Err(InvalidRequest {
                param: Some(PRIORITY_PARAM),
                message: format!(
                    "\"{PRIORITY_PARAM}\" must be an integer (and \"nvext\" and its \"agent_hints\" objects)"
                ),
            });
        };
        Ok(Read {
            head: RequestHead {
                model: model.into_owned(),
                prompt_tokens,
                priority,
                engine_priority: self.engine_priority,
            },
            max_tokens: max_tokens.or(max_completion_tokens),
            stream,
            include_usage,
        })
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
            tools: 0,
            max_tokens: None,
            max_completion_tokens: None,
            stream: None,
            stream_options: None,
            priority: Ok(None),
            engine_priority: false,
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
                ("tools", Endpoint::ChatCompletions) if count => found.tools = map.next_value_seed(Checked(AllText))?,
                ("max_tokens", _) => found.max_tokens = Some(map.next_value_seed(Checked(TokenLimit))?),
                ("max_completion_tokens", _) => {
                    found.max_completion_tokens = Some(map.next_value_seed(Checked(TokenLimit))?);
                }
                ("stream", _) => found.stream = Some(map.next_value_seed(Checked(Flag))?),
                ("stream_options", _) => found.stream_options = Some(map.next_value_seed(Checked(StreamOptions))?),
                ("nvext", _) if self.nvext => {
                    found.engine_priority = true;
                    found.priority = map.next_value_seed(Checked(NVEXT))?;
                }
                ("nvext" | "priority", _) => {
                    found.engine_priority = true;
                    map.next_value::<IgnoredAny>()?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(found)
    }
}

/// `model`: a non-empty string of at most [`MAX_MODEL_LEN`] bytes, borrowed
/// when it has no escapes (`Err`: the 400 for anything else; a name past
/// the bound is never copied).
struct Model;

impl<'de> Check<'de> for Model {
    type Out = Result<Cow<'de, str>, InvalidRequest>;

    fn wrong(self) -> Self::Out {
        Err(Field::Model.invalid())
    }

    fn borrowed_str(self, value: &'de str) -> Self::Out {
        model_name(value).map(Cow::Borrowed)
    }

    fn scalar(self, value: Scalar<'_>) -> Self::Out {
        match value {
            Scalar::Str(s) => model_name(s).map(|s| Cow::Owned(s.to_owned())),
            _ => self.wrong(),
        }
    }
}

/// `name` if it is a model's name: not empty, within [`MAX_MODEL_LEN`].
fn model_name(name: &str) -> Result<&str, InvalidRequest> {
    match name.len() {
        0 => Err(Field::Model.invalid()),
        len if len > MAX_MODEL_LEN => Err(InvalidRequest::model_too_long()),
        _ => Ok(name),
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

/// `max_tokens`, `max_completion_tokens`: null (`Ok(None)`), or an
/// integer within bounds.
struct TokenLimit;

impl Check<'_> for TokenLimit {
    type Out = Result<Option<u32>, Wrong>;

    fn wrong(self) -> Self::Out {
        Err(Wrong)
    }

    fn scalar(self, value: Scalar<'_>) -> Self::Out {
        match value {
            Scalar::Null => Ok(None),
            Scalar::Unsigned(n) => checked_token_limit(Some(n)).map(Some).ok_or(Wrong),
            _ => Err(Wrong),
        }
    }
}

/// `stream_options`: null (`Ok(None)`), or an object whose `include_usage`
/// is a boolean or null (`Ok(Some(include_usage))`, null false); else the
/// field at fault.
struct StreamOptions;

impl<'de> Check<'de> for StreamOptions {
    type Out = Result<Option<bool>, Field>;

    fn wrong(self) -> Self::Out {
        Err(Field::StreamOptions)
    }

    fn scalar(self, value: Scalar<'_>) -> Self::Out {
        match value {
            Scalar::Null => Ok(None),
            _ => self.wrong(),
        }
    }

    fn map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Out, A::Error> {
        let include_usage = Within { key: "include_usage", inner: Flag }.map(map)?;
        Ok(include_usage.map(|include| Some(include.unwrap_or(false))).map_err(|Wrong| Field::IncludeUsage))
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

/// One message: an object (`None`: anything else); the words of its
/// `content` and of its `tool_calls` (rendered into the prompt).
struct Message {
    count: bool,
}

impl<'de> Check<'de> for Message {
    type Out = Option<u64>;

    fn wrong(self) -> Option<u64> {
        None
    }

    fn map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<u64>, A::Error> {
        let (mut tokens, mut calls) = (0, 0);
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if self.count && key == "content" {
                tokens = map.next_value_seed(Checked(Content))?;
            } else if self.count && key == "tool_calls" {
                calls = map.next_value_seed(Checked(AllText))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Some(tokens.saturating_add(calls)))
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
