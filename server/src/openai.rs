//! The OpenAI request and response shapes the simulated worker speaks: the
//! fields of `completions` and `chat.completions` requests (checked, with a
//! 400 naming the field when one has the wrong type), prompt-token counting,
//! the error body, and the bodies of full responses and SSE chunks.
//!
//! The fields checked, in one pass over the bytes by the frontend and the
//! simulated worker alike ([`request`]: no JSON tree, whose nodes take many
//! times a body's size), and on a parsed value by the reference that reader
//! is tested against ([`parse_request`], tests only), with the same rules
//! and messages ([`Field`]); `null` counts as absent for the optional ones:
//!
//! - `model`: a non-empty string (required) of at most [`MAX_MODEL_LEN`]
//!   bytes;
//! - `prompt` (completions, required): a string, an array of strings, an
//!   array of token ids (non-negative integers), or an array of arrays of
//!   token ids;
//! - `messages` (chat, required): a non-empty array of objects;
//! - `max_tokens`, `max_completion_tokens`: an integer from 1 to
//!   [`MAX_TOKENS_LIMIT`] (not `-1`, `"5"`, `1e12`, `5.0` or `0`);
//! - `stream`: a boolean;
//! - `stream_options`: an object, only with `stream: true` (as OpenAI); its
//!   `include_usage` a boolean.
//!
//! Every other field is left as it is. When several are wrong, the first in
//! the order above is named.
//!
//! At the crate root because the frontend (reading requests), the worker and
//! its simulator (answering them) and the load generator share these shapes.

use std::fmt;

use serde::Serialize;
#[cfg(test)]
use serde_json::Map;
use serde_json::{json, Value};

#[cfg(test)]
use crate::tokens::{content_value, prompt_value};

/// Tokens generated when a request gives no `max_tokens`.
pub const DEFAULT_MAX_TOKENS: u32 = 16;

/// The largest `max_tokens` (or `max_completion_tokens`) accepted:
/// 2^31 - 1, the largest count a signed 32-bit integer holds (what
/// OpenAI-compatible engines take). A request that fits this bound but not
/// the KV cache is refused later (400, context too long).
pub const MAX_TOKENS_LIMIT: u64 = (1 << 31) - 1;

/// The longest `model` accepted, in bytes: far above any model's name (a
/// registration names one of at most `--max-name-len`, 256 bytes by
/// default), and small enough that the copies of it a request makes
/// outside the body budget (its metric label, a 404 naming it) stay small.
pub const MAX_MODEL_LEN: usize = 64 * 1024;

/// The `type` of every 4xx error body: OpenAI's.
pub const INVALID_REQUEST_ERROR: &str = "invalid_request_error";

/// The `type` of a 5xx error body that is not a shedding answer (those keep
/// DESIGN's `Overloaded` and `Unavailable`): OpenAI's.
pub const SERVER_ERROR: &str = "server_error";

/// `{"error":{"message","type","param","code"}}`, OpenAI's error shape, is
/// written by the library (`loadgate::openai_error::body`, through
/// `api_error`), the one builder the frontend, the worker and an embedder's
/// refusals share; the shape test below checks it.
#[cfg(test)]
use loadgate::openai_error::body as error_body;

/// Why a request body is refused with 400: its message, and the field at
/// fault (`None` when the body as a whole is unusable).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidRequest {
    /// The field at fault, as OpenAI names it (`stream_options.include_usage`).
    pub param: Option<&'static str>,
    /// What is wrong, for the client.
    pub message: String,
}

impl InvalidRequest {
    /// The whole body is unusable (not JSON, not an object).
    pub fn body(message: impl Into<String>) -> Self {
        InvalidRequest { param: None, message: message.into() }
    }

    /// `stream_options` given without `stream: true`.
    pub fn stream_options_without_stream() -> Self {
        InvalidRequest {
            param: Some(Field::StreamOptions.param()),
            message: "\"stream_options\" is only allowed when \"stream\" is true".to_owned(),
        }
    }
}

impl InvalidRequest {
    /// `model` longer than [`MAX_MODEL_LEN`].
    pub fn model_too_long() -> Self {
        InvalidRequest {
            param: Some(Field::Model.param()),
            message: format!("\"model\" must be at most {MAX_MODEL_LEN} bytes"),
        }
    }

    /// The 400 for `message`, naming the field when the message is one of
    /// those this module makes for a field (so that an error passed on as
    /// its message keeps its `param`).
    pub fn from_message(message: impl Into<String>) -> Self {
        let message = message.into();
        let known = Field::ALL
            .iter()
            .map(|field| field.invalid())
            .chain([Self::stream_options_without_stream(), Self::model_too_long()]);
        let param = known.into_iter().find(|known| known.message == message).and_then(|known| known.param);
        InvalidRequest { param, message }
    }
}

impl From<InvalidRequest> for String {
    fn from(error: InvalidRequest) -> Self {
        error.message
    }
}

impl From<String> for InvalidRequest {
    fn from(message: String) -> Self {
        InvalidRequest::from_message(message)
    }
}

impl From<&String> for InvalidRequest {
    fn from(message: &String) -> Self {
        InvalidRequest::from_message(message.as_str())
    }
}

impl From<&InvalidRequest> for InvalidRequest {
    fn from(error: &InvalidRequest) -> Self {
        error.clone()
    }
}

impl From<&str> for InvalidRequest {
    fn from(message: &str) -> Self {
        InvalidRequest::from_message(message)
    }
}

impl fmt::Display for InvalidRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// A request field that is checked (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// `model`.
    Model,
    /// `prompt` (completions).
    Prompt,
    /// `messages` (chat).
    Messages,
    /// `max_tokens`.
    MaxTokens,
    /// `max_completion_tokens`.
    MaxCompletionTokens,
    /// `stream`.
    Stream,
    /// `stream_options`.
    StreamOptions,
    /// `stream_options.include_usage`.
    IncludeUsage,
}

impl Field {
    /// Every checked field, in the module doc's order.
    pub const ALL: [Field; 8] = [
        Field::Model,
        Field::Prompt,
        Field::Messages,
        Field::MaxTokens,
        Field::MaxCompletionTokens,
        Field::Stream,
        Field::StreamOptions,
        Field::IncludeUsage,
    ];

    /// The field's name in `param`.
    pub fn param(self) -> &'static str {
        match self {
            Field::Model => "model",
            Field::Prompt => "prompt",
            Field::Messages => "messages",
            Field::MaxTokens => "max_tokens",
            Field::MaxCompletionTokens => "max_completion_tokens",
            Field::Stream => "stream",
            Field::StreamOptions => "stream_options",
            Field::IncludeUsage => "stream_options.include_usage",
        }
    }

    /// What the field must be.
    fn expected(self) -> &'static str {
        match self {
            Field::Model => "a non-empty string",
            Field::Prompt => "a string, an array of strings, an array of token ids or an array of arrays of token ids",
            Field::Messages => "a non-empty array of message objects",
            // Spelled out: MAX_TOKENS_LIMIT.
            Field::MaxTokens | Field::MaxCompletionTokens => "an integer from 1 to 2147483647",
            Field::Stream | Field::IncludeUsage => "a boolean",
            Field::StreamOptions => "an object",
        }
    }

    /// The 400 for this field: missing (when required) or of the wrong type.
    pub fn invalid(self) -> InvalidRequest {
        InvalidRequest {
            param: Some(self.param()),
            message: format!("\"{}\" must be {}", self.param(), self.expected()),
        }
    }
}

/// Which OpenAI endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/chat/completions`.
    ChatCompletions,
}

/// What the engine needs from a request body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenerationRequest {
    /// The `model` field.
    pub model: String,
    /// Prompt length in tokens.
    pub prompt_tokens: u32,
    /// Tokens to generate.
    pub max_tokens: u32,
    /// Whether the answer is an SSE stream.
    pub stream: bool,
    /// `stream_options.include_usage`: the stream ends with a chunk of the
    /// usage alone.
    pub include_usage: bool,
}

/// Reads a request body, checking the fields of the module doc, from its
/// parsed value: the reference that the one-pass reader
/// ([`request::read_generation`], which the simulated worker uses) is
/// tested against.
///
/// Prompt tokens: the length of a token-id array prompt, otherwise the number
/// of whitespace-separated words (chat: of every message's content).
///
/// # Errors
///
/// The 400 to send: the body is not a JSON object, or a field is missing or
/// of the wrong type (named in `param`).
#[cfg(test)]
pub fn parse_request(api: Api, body: &[u8]) -> Result<GenerationRequest, InvalidRequest> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| InvalidRequest::body(format!("request body is not valid JSON: {e}")))?;
    let Some(obj) = value.as_object() else { return Err(InvalidRequest::body("request body must be a JSON object")) };
    let model = match obj.get("model") {
        Some(Value::String(model)) if model.len() > MAX_MODEL_LEN => return Err(InvalidRequest::model_too_long()),
        Some(Value::String(model)) if !model.is_empty() => model.clone(),
        _ => return Err(Field::Model.invalid()),
    };
    let prompt_tokens = match api {
        Api::Completions => match obj.get("prompt") {
            Some(prompt) if is_prompt(prompt) => prompt_value(prompt),
            _ => return Err(Field::Prompt.invalid()),
        },
        Api::ChatCompletions => match obj.get("messages") {
            Some(Value::Array(messages)) if !messages.is_empty() && messages.iter().all(Value::is_object) => {
                messages.iter().map(|m| m.get("content").map_or(0, content_value)).sum()
            }
            _ => return Err(Field::Messages.invalid()),
        },
    };
    let max_tokens = token_limit(obj, Field::MaxTokens)?;
    let max_completion_tokens = token_limit(obj, Field::MaxCompletionTokens)?;
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(stream)) => Some(*stream),
        Some(_) => return Err(Field::Stream.invalid()),
    };
    let include_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => None,
        Some(Value::Object(options)) => match options.get("include_usage") {
            None | Some(Value::Null) => Some(false),
            Some(Value::Bool(include)) => Some(*include),
            Some(_) => return Err(Field::IncludeUsage.invalid()),
        },
        Some(_) => return Err(Field::StreamOptions.invalid()),
    };
    let stream = stream.unwrap_or(false);
    if include_usage.is_some() && !stream {
        return Err(InvalidRequest::stream_options_without_stream());
    }
    Ok(GenerationRequest {
        model,
        prompt_tokens: u32::try_from(prompt_tokens).unwrap_or(u32::MAX),
        max_tokens: max_tokens.or(max_completion_tokens).unwrap_or(DEFAULT_MAX_TOKENS),
        stream,
        include_usage: include_usage.unwrap_or(false),
    })
}

/// A completions `prompt` of one of the four shapes.
#[cfg(test)]
fn is_prompt(prompt: &Value) -> bool {
    let is_ids = |v: &Value| v.as_array().is_some_and(|ids| ids.iter().all(Value::is_u64));
    match prompt {
        Value::String(_) => true,
        Value::Array(items) => items.iter().all(Value::is_string) || is_ids(prompt) || items.iter().all(is_ids),
        _ => false,
    }
}

/// `max_tokens` or `max_completion_tokens`: absent, or within 1 ..=
/// [`MAX_TOKENS_LIMIT`].
#[cfg(test)]
fn token_limit(obj: &Map<String, Value>, field: Field) -> Result<Option<u32>, InvalidRequest> {
    match obj.get(field.param()) {
        None | Some(Value::Null) => Ok(None),
        Some(n) => checked_token_limit(n.as_u64()).map(Some).ok_or_else(|| field.invalid()),
    }
}

/// An integer `max_tokens` within 1 ..= [`MAX_TOKENS_LIMIT`] (`None`: not an
/// integer of that range).
pub fn checked_token_limit(n: Option<u64>) -> Option<u32> {
    n.filter(|n| (1..=MAX_TOKENS_LIMIT).contains(n)).and_then(|n| u32::try_from(n).ok())
}

/// The filler text of output token `index`.
pub fn filler_token(index: u32) -> &'static str {
    const WORDS: [&str; 8] = [" the", " quick", " brown", " fox", " jumps", " over", " lazy", " dogs"];
    WORDS[index as usize % WORDS.len()]
}

/// Token usage of one response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
}

/// `usage` as OpenAI orders it: prompt, completion, total.
#[derive(Serialize)]
struct UsageBody {
    prompt_tokens: u32,
    completion_tokens: u32,
    total_tokens: u64,
}

impl From<Usage> for UsageBody {
    fn from(u: Usage) -> Self {
        UsageBody {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u64::from(u.prompt_tokens) + u64::from(u.completion_tokens),
        }
    }
}

/// A response or chunk body, fields in OpenAI's order.
#[derive(Serialize)]
struct Body<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: &'a [Value],
    /// Absent (`None`), `null` (`Some(None)`: a chunk of a stream that ends
    /// with its usage), or the usage.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<UsageBody>>,
}

/// Identity shared by every body of one response.
#[derive(Clone, Debug)]
pub struct ResponseId {
    /// Endpoint.
    pub api: Api,
    /// `id` field.
    pub id: String,
    /// `model` field.
    pub model: String,
    /// `created` field (Unix seconds).
    pub created: u64,
    /// The stream ends with a usage chunk (`stream_options.include_usage`):
    /// every other chunk then says `"usage": null`, as OpenAI's do.
    pub include_usage: bool,
}

impl ResponseId {
    /// A fresh id for a response of `model` at `api`.
    pub fn new(api: Api, model: &str) -> Self {
        let prefix = match api {
            Api::Completions => "cmpl",
            Api::ChatCompletions => "chatcmpl",
        };
        let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        ResponseId {
            api,
            id: format!("{prefix}-{:016x}", fastrand::u64(..)),
            model: model.to_owned(),
            created,
            include_usage: false,
        }
    }

    /// The same, for a stream that ends with a usage chunk or not.
    pub fn with_usage_chunk(mut self, include_usage: bool) -> Self {
        self.include_usage = include_usage;
        self
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.api, chunk) {
            (Api::Completions, _) => "text_completion",
            (Api::ChatCompletions, false) => "chat.completion",
            (Api::ChatCompletions, true) => "chat.completion.chunk",
        }
    }

    fn body(&self, chunk: bool, choices: &[Value], usage: Option<Option<Usage>>) -> String {
        let body = Body {
            id: &self.id,
            object: self.object(chunk),
            created: self.created,
            model: &self.model,
            choices,
            usage: usage.map(|u| u.map(UsageBody::from)),
        };
        serde_json::to_string(&body).expect("serialising plain data cannot fail")
    }

    /// `"usage": null` on a chunk of a stream that ends with its usage.
    fn chunk_usage(&self) -> Option<Option<Usage>> {
        self.include_usage.then_some(None)
    }

    /// A complete (non-streaming) response body.
    pub fn full(&self, text: &str, usage: Usage) -> String {
        let choice = match self.api {
            Api::Completions => json!({"index": 0, "text": text, "logprobs": null, "finish_reason": "length"}),
            Api::ChatCompletions => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "length",
            }),
        };
        self.body(false, &[choice], Some(Some(usage)))
    }

    /// One SSE chunk carrying `text` (the first chunk of a chat stream also
    /// carries the assistant role).
    pub fn chunk(&self, text: &str, first: bool) -> String {
        let choice = match self.api {
            Api::Completions => json!({"index": 0, "text": text, "logprobs": null, "finish_reason": null}),
            Api::ChatCompletions if first => {
                json!({"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": null})
            }
            Api::ChatCompletions => json!({"index": 0, "delta": {"content": text}, "finish_reason": null}),
        };
        self.body(true, &[choice], self.chunk_usage())
    }

    /// The chunk with the finish reason (no token, no usage).
    pub fn finish_chunk(&self) -> String {
        let choice = match self.api {
            Api::Completions => json!({"index": 0, "text": "", "logprobs": null, "finish_reason": "length"}),
            Api::ChatCompletions => json!({"index": 0, "delta": {}, "finish_reason": "length"}),
        };
        self.body(true, &[choice], self.chunk_usage())
    }

    /// The usage chunk that ends a stream with `include_usage`: `"choices":
    /// []` and the usage of the whole request.
    pub fn usage_chunk(&self, usage: Usage) -> String {
        self.body(true, &[], Some(Some(usage)))
    }
}

/// Frames a JSON text as one SSE event.
pub fn sse_event(json: &str) -> String {
    format!("data: {json}\n\n")
}

/// The SSE end-of-stream marker.
pub const SSE_DONE: &str = "data: [DONE]\n\n";

/// Requests with one field of the wrong type (or missing), and the field
/// the 400 must name: the cases both readers (this one and the frontend's
/// one pass) are tested on.
#[cfg(test)]
pub(crate) const BAD_REQUESTS: &[(Api, &str, &str)] = &[
    (Api::Completions, r#"{"prompt":"a"}"#, "model"),
    (Api::Completions, r#"{"model":"","prompt":"a"}"#, "model"),
    (Api::Completions, r#"{"model":5,"prompt":"a"}"#, "model"),
    (Api::Completions, r#"{"model":null,"prompt":"a"}"#, "model"),
    (Api::Completions, r#"{"model":["m"],"prompt":"a"}"#, "model"),
    (Api::Completions, r#"{"model":"m","prompt":"a","stream":"yes"}"#, "stream"),
    (Api::Completions, r#"{"model":"m","prompt":"a","stream":1}"#, "stream"),
    (Api::Completions, r#"{"model":"m","prompt":"a","stream":[true]}"#, "stream"),
    (Api::Completions, r#"{"model":"m","prompt":"a","max_tokens":-1}"#, "max_tokens"),
    (Api::Completions, r#"{"model":"m","prompt":"a","max_tokens":"5"}"#, "max_tokens"),
    (Api::Completions, r#"{"model":"m","prompt":"a","max_tokens":1e12}"#, "max_tokens"),
    (Api::Completions, r#"{"model":"m","prompt":"a","max_tokens":1000000000000}"#, "max_tokens"),
    (Api::Completions, r#"{"model":"m","prompt":"a","max_tokens":2147483648}"#, "max_tokens"),
    (Api::Completions, r#"{"model":"m","prompt":"a","max_tokens":0}"#, "max_tokens"),
    (Api::Completions, r#"{"model":"m","prompt":"a","max_tokens":5.0}"#, "max_tokens"),
    (Api::Completions, r#"{"model":"m","prompt":"a","max_tokens":{"n":5}}"#, "max_tokens"),
    (Api::ChatCompletions, r#"{"model":"m","messages":[{}],"max_completion_tokens":-1}"#, "max_completion_tokens"),
    (Api::ChatCompletions, r#"{"model":"m","messages":[{}],"max_completion_tokens":"5"}"#, "max_completion_tokens"),
    (Api::Completions, r#"{"model":"m"}"#, "prompt"),
    (Api::Completions, r#"{"model":"m","prompt":null}"#, "prompt"),
    (Api::Completions, r#"{"model":"m","prompt":5}"#, "prompt"),
    (Api::Completions, r#"{"model":"m","prompt":true}"#, "prompt"),
    (Api::Completions, r#"{"model":"m","prompt":{"text":"a"}}"#, "prompt"),
    (Api::Completions, r#"{"model":"m","prompt":["a",1]}"#, "prompt"),
    (Api::Completions, r#"{"model":"m","prompt":[1,-2]}"#, "prompt"),
    (Api::Completions, r#"{"model":"m","prompt":[1,2.5]}"#, "prompt"),
    (Api::Completions, r#"{"model":"m","prompt":[[1],"a"]}"#, "prompt"),
    (Api::Completions, r#"{"model":"m","prompt":[["a"]]}"#, "prompt"),
    (Api::Completions, r#"{"model":"m","prompt":[[[1]]]}"#, "prompt"),
    (Api::Completions, r#"{"model":"m","prompt":[null]}"#, "prompt"),
    (Api::ChatCompletions, r#"{"model":"m"}"#, "messages"),
    (Api::ChatCompletions, r#"{"model":"m","messages":[]}"#, "messages"),
    (Api::ChatCompletions, r#"{"model":"m","messages":"hi"}"#, "messages"),
    (Api::ChatCompletions, r#"{"model":"m","messages":{"role":"user"}}"#, "messages"),
    (Api::ChatCompletions, r#"{"model":"m","messages":[{"content":"a"},"b"]}"#, "messages"),
    (Api::ChatCompletions, r#"{"model":"m","messages":[[]]}"#, "messages"),
    (Api::Completions, r#"{"model":"m","prompt":"a","stream":true,"stream_options":true}"#, "stream_options"),
    (Api::Completions, r#"{"model":"m","prompt":"a","stream":true,"stream_options":[]}"#, "stream_options"),
    (
        Api::Completions,
        r#"{"model":"m","prompt":"a","stream":true,"stream_options":{"include_usage":"yes"}}"#,
        "stream_options.include_usage",
    ),
    (Api::Completions, r#"{"model":"m","prompt":"a","stream_options":{"include_usage":true}}"#, "stream_options"),
    (
        Api::ChatCompletions,
        r#"{"model":"m","messages":[{}],"stream":false,"stream_options":{"include_usage":true}}"#,
        "stream_options",
    ),
    (Api::ChatCompletions, r#"{"model":"m","messages":[{}],"stream_options":{}}"#, "stream_options"),
    // The first in the module doc's order is named.
    (Api::Completions, r#"{"stream":"yes","max_tokens":0,"prompt":5,"model":7}"#, "model"),
    (Api::Completions, r#"{"stream":"yes","max_tokens":0,"prompt":5,"model":"m"}"#, "prompt"),
    (Api::Completions, r#"{"stream":"yes","max_tokens":0,"prompt":"a","model":"m"}"#, "max_tokens"),
];

/// Requests that pass (types right; every other field left alone).
#[cfg(test)]
pub(crate) const GOOD_REQUESTS: &[(Api, &str)] = &[
    (Api::Completions, r#"{"model":"m","prompt":""}"#),
    (Api::Completions, r#"{"model":"m","prompt":[]}"#),
    (Api::Completions, r#"{"model":"m","prompt":["a b",""]}"#),
    (Api::Completions, r#"{"model":"m","prompt":[0,1,4294967296]}"#),
    (Api::Completions, r#"{"model":"m","prompt":[[1,2],[],[3]]}"#),
    (Api::Completions, r#"{"model":"m","prompt":"a","max_tokens":1,"max_completion_tokens":2147483647}"#),
    (Api::Completions, r#"{"model":"m","prompt":"a","max_tokens":null,"stream":null,"stream_options":null}"#),
    (Api::Completions, r#"{"model":"m","prompt":"a","stream":true,"stream_options":{"include_usage":true}}"#),
    (Api::Completions, r#"{"model":"m","prompt":"a","stream":true,"stream_options":{"include_usage":null,"x":1}}"#),
    (Api::Completions, r#"{"model":"m","prompt":"a","temperature":"hot","n":"x","messages":5,"user":[1]}"#),
    (Api::ChatCompletions, r#"{"model":"m","messages":[{"role":"user","content":5},{}],"prompt":7}"#),
    (Api::ChatCompletions, r#"{"model":"m","messages":[{"content":[{"text":"a b"},"x",{"text":3}]}]}"#),
];

pub(crate) mod request;
#[cfg(test)]
mod tests;
