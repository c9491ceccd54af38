//! Token arithmetic for the router's own load tracking (`--router-mode kv`):
//! prompt tokens of an OpenAI request, KV blocks, and generated tokens seen
//! in a streamed SSE body.

use serde_json::Value;

#[cfg(test)]
use loadgate::metrics::Endpoint;

/// Tokens per KV block the router assumes.
pub const BLOCK_SIZE: u64 = 16;

/// KV blocks holding `tokens` tokens.
pub fn blocks_for(tokens: u64) -> u64 {
    tokens.div_ceil(BLOCK_SIZE)
}

/// Prompt tokens of a request: the length of a token-id array prompt,
/// otherwise the number of whitespace-separated words (for chat, of every
/// message's content). The reference that the frontend's one-pass reading
/// (`frontend/request.rs`) is tested against.
#[cfg(test)]
pub fn prompt_tokens(endpoint: Endpoint, request: &Value) -> u64 {
    match endpoint {
        Endpoint::Completions => request.get("prompt").map_or(0, prompt_value),
        Endpoint::ChatCompletions => request
            .get("messages")
            .and_then(Value::as_array)
            .map_or(0, |messages| messages.iter().filter_map(|m| m.get("content")).map(content_value).sum()),
    }
}

fn words(s: &str) -> u64 {
    s.split_whitespace().count() as u64
}

/// A completions `prompt`: a string, token ids, or a batch of either.
pub(crate) fn prompt_value(prompt: &Value) -> u64 {
    match prompt {
        Value::String(s) => words(s),
        Value::Array(items) if items.iter().all(Value::is_number) => items.len() as u64,
        Value::Array(items) => items.iter().map(prompt_value).sum(),
        _ => 0,
    }
}

/// A chat message `content`: a string or a list of parts with `text`.
pub(crate) fn content_value(content: &Value) -> u64 {
    match content {
        Value::String(s) => words(s),
        Value::Array(parts) => parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).map(words).sum(),
        _ => 0,
    }
}

/// Counts SSE events (`data:` lines) across body chunks, whichever way the
/// chunks split them. Each event carries one generated token (the final
/// `data: [DONE]` counts too; it arrives as the response ends).
#[derive(Debug, Default)]
pub struct SseEvents {
    count: u64,
    /// The end of the previous chunk, for a marker split across chunks.
    carry: Vec<u8>,
}

const MARKER: &[u8] = b"data:";

impl SseEvents {
    /// Feeds one body chunk; returns the total events seen so far.
    pub fn feed(&mut self, chunk: &[u8]) -> u64 {
        let mut joined = std::mem::take(&mut self.carry);
        joined.extend_from_slice(chunk);
        self.count += joined.windows(MARKER.len()).filter(|w| *w == MARKER).count() as u64;
        // Keep the last len-1 bytes: they may begin a marker but cannot hold a whole one.
        let keep = joined.len().min(MARKER.len() - 1);
        self.carry = joined[joined.len() - keep..].to_vec();
        self.count
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn prompt_tokens_by_shape() {
        let c = Endpoint::Completions;
        assert_eq!(prompt_tokens(c, &json!({"prompt": "a b  c\nd"})), 4);
        assert_eq!(prompt_tokens(c, &json!({"prompt": [1, 2, 3]})), 3);
        assert_eq!(prompt_tokens(c, &json!({"prompt": ["a b", "c"]})), 3);
        assert_eq!(prompt_tokens(c, &json!({"prompt": [[1, 2], [3]]})), 3);
        assert_eq!(prompt_tokens(c, &json!({})), 0);
        let chat = json!({"messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "one two three"}]}
        ]});
        assert_eq!(prompt_tokens(Endpoint::ChatCompletions, &chat), 5);
    }

    #[test]
    fn blocks_round_up() {
        assert_eq!(blocks_for(0), 0);
        assert_eq!(blocks_for(1), 1);
        assert_eq!(blocks_for(16), 1);
        assert_eq!(blocks_for(17), 2);
    }

    #[test]
    fn sse_events_across_any_split() {
        let body = b"data: {\"a\":1}\n\ndata: {\"a\":2}\n\ndata: [DONE]\n\n";
        for cut in 0..body.len() {
            let mut events = SseEvents::default();
            events.feed(&body[..cut]);
            assert_eq!(events.feed(&body[cut..]), 3, "split at {cut}");
        }
    }
}
