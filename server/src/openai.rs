//! The OpenAI request and response shapes the simulated worker speaks:
//! prompt-token counting for `completions` and `chat.completions` requests,
//! and the bodies of full responses and SSE chunks.

use serde::Serialize;
use serde_json::{json, Value};

use crate::tokens::{content_value, prompt_value};

/// Tokens generated when a request gives no `max_tokens`.
pub const DEFAULT_MAX_TOKENS: u32 = 16;

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
    /// The `model` field (empty when absent).
    pub model: String,
    /// Prompt length in tokens.
    pub prompt_tokens: u32,
    /// Tokens to generate.
    pub max_tokens: u32,
    /// Whether the answer is an SSE stream.
    pub stream: bool,
}

/// Reads a request body.
///
/// Prompt tokens: the length of a token-id array prompt, otherwise the number
/// of whitespace-separated words (chat: of every message's content).
///
/// # Errors
///
/// A message for the client when the body is not a JSON object or lacks the
/// prompt (`prompt` / `messages`).
pub fn parse_request(api: Api, body: &[u8]) -> Result<GenerationRequest, String> {
    let value: Value = serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    let Some(obj) = value.as_object() else { return Err("the request body must be a JSON object".into()) };
    let model = obj.get("model").and_then(Value::as_str).unwrap_or_default().to_owned();
    let prompt_tokens = match api {
        Api::Completions => prompt_value(obj.get("prompt").ok_or("missing field `prompt`")?),
        Api::ChatCompletions => {
            let messages = obj.get("messages").and_then(Value::as_array).ok_or("missing array field `messages`")?;
            messages.iter().map(|m| m.get("content").map_or(0, content_value)).sum()
        }
    };
    let max_tokens = ["max_tokens", "max_completion_tokens"]
        .iter()
        .find_map(|k| obj.get(*k).and_then(Value::as_u64))
        .map_or(DEFAULT_MAX_TOKENS, |n| u32::try_from(n).unwrap_or(u32::MAX));
    let stream = obj.get("stream").and_then(Value::as_bool).unwrap_or(false);
    Ok(GenerationRequest { model, prompt_tokens: u32::try_from(prompt_tokens).unwrap_or(u32::MAX), max_tokens, stream })
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
    choices: [Value; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<UsageBody>,
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
}

impl ResponseId {
    /// A fresh id for a response of `model` at `api`.
    pub fn new(api: Api, model: &str) -> Self {
        let prefix = match api {
            Api::Completions => "cmpl",
            Api::ChatCompletions => "chatcmpl",
        };
        let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        ResponseId { api, id: format!("{prefix}-{:016x}", fastrand::u64(..)), model: model.to_owned(), created }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.api, chunk) {
            (Api::Completions, _) => "text_completion",
            (Api::ChatCompletions, false) => "chat.completion",
            (Api::ChatCompletions, true) => "chat.completion.chunk",
        }
    }

    fn body(&self, chunk: bool, choice: Value, usage: Option<Usage>) -> String {
        let body = Body {
            id: &self.id,
            object: self.object(chunk),
            created: self.created,
            model: &self.model,
            choices: [choice],
            usage: usage.map(UsageBody::from),
        };
        serde_json::to_string(&body).expect("serialising plain data cannot fail")
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
        self.body(false, choice, Some(usage))
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
        self.body(true, choice, None)
    }

    /// The last SSE chunk: the finish reason and the usage.
    pub fn final_chunk(&self, usage: Usage) -> String {
        let choice = match self.api {
            Api::Completions => json!({"index": 0, "text": "", "logprobs": null, "finish_reason": "length"}),
            Api::ChatCompletions => json!({"index": 0, "delta": {}, "finish_reason": "length"}),
        };
        self.body(true, choice, Some(usage))
    }
}

/// Frames a JSON text as one SSE event.
pub fn sse_event(json: &str) -> String {
    format!("data: {json}\n\n")
}

/// The SSE end-of-stream marker.
pub const SSE_DONE: &str = "data: [DONE]\n\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_words_token_ids_and_chat_contents() {
        let r = parse_request(Api::Completions, br#"{"model":"m","prompt":"a b  c\nd","max_tokens":3}"#).unwrap();
        assert_eq!((r.prompt_tokens, r.max_tokens, r.stream, r.model.as_str()), (4, 3, false, "m"));
        let r = parse_request(Api::Completions, br#"{"prompt":[1,2,3,4,5],"stream":true}"#).unwrap();
        assert_eq!((r.prompt_tokens, r.max_tokens, r.stream), (5, DEFAULT_MAX_TOKENS, true));
        let r = parse_request(
            Api::ChatCompletions,
            br#"{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi there you"}]}]}"#,
        )
        .unwrap();
        assert_eq!(r.prompt_tokens, 5);
        assert!(parse_request(Api::ChatCompletions, br#"{"prompt":"x"}"#).is_err());
        assert!(parse_request(Api::Completions, b"not json").is_err());
    }

    #[test]
    fn full_response_carries_usage() {
        let id = ResponseId::new(Api::Completions, "m");
        let body = id.full("x", Usage { prompt_tokens: 3, completion_tokens: 2 });
        assert!(body.contains(r#""usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}"#), "{body}");
    }
}
