//! Token arithmetic for the router's own load tracking (`--router-mode kv`):
//! prompt tokens of an OpenAI request, KV blocks, and generated tokens seen
//! in a streamed SSE body (the usage chunk and `[DONE]` are not tokens).
//!
//! At the crate root because the frontend's tracking and the OpenAI request
//! readers share it. The counts on a parsed value are the references the
//! one-pass reader (`openai/request.rs`) is tested against.

#[cfg(test)]
use loadgate::metrics::Endpoint;
#[cfg(test)]
use serde_json::Value;

/// Tokens per KV block the router assumes.
pub const BLOCK_SIZE: u64 = 16;

/// KV blocks holding `tokens` tokens.
pub fn blocks_for(tokens: u64) -> u64 {
    tokens.div_ceil(BLOCK_SIZE)
}

/// Prompt tokens of a request: the length of a token-id array prompt,
/// otherwise its [`words`] (for chat, of every message's content and tool
/// calls, and of the tools). The reference that the one-pass reading
/// (`openai/request.rs`) is tested against.
#[cfg(test)]
pub fn prompt_tokens(endpoint: Endpoint, request: &Value) -> u64 {
    match endpoint {
        Endpoint::Completions => request.get("prompt").map_or(0, prompt_value),
        Endpoint::ChatCompletions => {
            let message =
                |m: &Value| m.get("content").map_or(0, content_value) + m.get("tool_calls").map_or(0, all_text);
            let messages = request.get("messages").and_then(Value::as_array).map_or(0, |m| m.iter().map(message).sum());
            messages + request.get("tools").map_or(0, all_text)
        }
    }
}

/// A value rendered into the prompt whole (`tools`, `tool_calls`): the
/// words of its strings, keys included; a number or a literal one each.
#[cfg(test)]
fn all_text(value: &Value) -> u64 {
    match value {
        Value::String(s) => words(s),
        Value::Array(items) => items.iter().map(all_text).sum(),
        Value::Object(map) => map.iter().map(|(k, v)| words(k) + all_text(v)).sum(),
        _ => 1,
    }
}

/// Bytes of a word that count as one prompt token: a longer word counts
/// one token per this many bytes. So text without spaces (base64, a URL,
/// minified JSON, Chinese) is not one token however long: a client cannot
/// pass a long prompt off as short to the line's token limits. Words of
/// ordinary prose count one each, as before.
pub const WORD_BYTES: usize = 8;

/// Prompt tokens of a string: each whitespace-separated word one per
/// [`WORD_BYTES`] bytes, at least one.
pub fn words(s: &str) -> u64 {
    s.split_whitespace().map(|word| word.len().div_ceil(WORD_BYTES) as u64).sum()
}

/// A completions `prompt`: a string, token ids, or a batch of either.
#[cfg(test)]
pub(crate) fn prompt_value(prompt: &Value) -> u64 {
    match prompt {
        Value::String(s) => words(s),
        Value::Array(items) if items.iter().all(Value::is_number) => items.len() as u64,
        Value::Array(items) => items.iter().map(prompt_value).sum(),
        _ => 0,
    }
}

/// A chat message `content`: a string or a list of parts with `text`.
#[cfg(test)]
pub(crate) fn content_value(content: &Value) -> u64 {
    match content {
        Value::String(s) => words(s),
        Value::Array(parts) => parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).map(words).sum(),
        _ => 0,
    }
}

/// Counts the generated tokens of a streamed SSE body across body chunks,
/// whichever way the chunks split it: one per `data:` line, except
/// `data: [DONE]` and the usage chunk that ends a stream with
/// `stream_options.include_usage` (`"choices": []`), which carry none. (The
/// chunk with the finish reason counts: engines such as vLLM put the last
/// token in it; the simulated worker's carries none, so its count is one
/// over, as an estimate of KV use may be.)
///
/// Only the current line is kept, and at most [`MAX_LINE`] bytes of it: a
/// longer `data:` line counts as a token unread.
#[derive(Debug, Default)]
pub struct SseEvents {
    count: u64,
    /// The current line so far (at most [`MAX_LINE`] bytes of it).
    line: Vec<u8>,
    /// The current line is longer than [`MAX_LINE`].
    long: bool,
}

/// The longest line read to classify (a usage chunk is a few hundred bytes).
pub const MAX_LINE: usize = 16 * 1024;

const MARKER: &[u8] = b"data:";

impl SseEvents {
    /// Feeds one body chunk; returns the total tokens seen so far.
    pub fn feed(&mut self, chunk: &[u8]) -> u64 {
        let mut rest = chunk;
        while !rest.is_empty() {
            let (piece, ended) = match rest.iter().position(|&b| b == b'\n') {
                Some(at) => (&rest[..at], true),
                None => (rest, false),
            };
            let room = MAX_LINE - self.line.len();
            self.line.extend_from_slice(&piece[..piece.len().min(room)]);
            self.long |= piece.len() > room;
            rest = &rest[piece.len() + usize::from(ended)..];
            if ended {
                self.end_line();
            }
        }
        self.count
    }

    /// Counts the line just ended if it is a token, and starts the next.
    fn end_line(&mut self) {
        let line = self.line.strip_suffix(b"\r").unwrap_or(&self.line);
        if let Some(data) = line.strip_prefix(MARKER) {
            if self.long || carries_a_token(data) {
                self.count += 1;
            }
        }
        self.line.clear();
        self.long = false;
    }
}

/// Whether an event's data is a chunk that carries a token: neither
/// `[DONE]` nor a chunk whose `choices` is empty.
fn carries_a_token(data: &[u8]) -> bool {
    /// The part of a chunk that tells (`None`: absent or null).
    #[derive(serde::Deserialize)]
    struct Chunk {
        choices: Option<Vec<serde::de::IgnoredAny>>,
    }
    let data = data.trim_ascii();
    if data == b"[DONE]" {
        return false;
    }
    !matches!(serde_json::from_slice::<Chunk>(data), Ok(Chunk { choices: Some(choices) }) if choices.is_empty())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A word counts one token per 8 bytes: prose as before, text without
    /// spaces by its length (it counted one however long).
    #[test]
    fn a_long_word_counts_by_its_length() {
        assert_eq!(words("the quick brown fox"), 4);
        assert_eq!(words("internationalization"), 3);
        assert_eq!(words(&"x".repeat(20_000)), 2_500);
        assert_eq!(words(&"负".repeat(8)), 3, "24 bytes");
        assert_eq!(words(" \n\t "), 0);
    }

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
        // Two tokens, the finish chunk, the usage chunk, [DONE].
        let body = concat!(
            "data: {\"choices\":[{\"text\":\"a\"}]}\n\n",
            "data:{\"choices\":[{\"text\":\"b\"}],\"usage\":null}\r\n\r\n",
            "data: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"length\"}]}\n\n",
            "data: {\"id\":\"x\",\"choices\": [ ],\"usage\":{\"completion_tokens\":2}}\n\n",
            "data: [DONE]\n\n",
        )
        .as_bytes();
        for cut in 0..body.len() {
            let mut events = SseEvents::default();
            events.feed(&body[..cut]);
            assert_eq!(events.feed(&body[cut..]), 3, "split at {cut}");
        }
        let mut bytewise = SseEvents::default();
        for byte in body {
            bytewise.feed(std::slice::from_ref(byte));
        }
        assert_eq!(bytewise.feed(b""), 3);
    }

    #[test]
    fn a_long_line_counts_unread_and_is_not_kept() {
        let mut events = SseEvents::default();
        let long = format!("data: {{\"choices\":[],\"pad\":\"{}\"}}\n", "x".repeat(4 * MAX_LINE));
        assert_eq!(events.feed(long.as_bytes()), 1);
        assert!(events.line.capacity() <= 2 * MAX_LINE);
        // Other lines (comments, event names) count nothing.
        assert_eq!(events.feed(b": keep-alive\nevent: x\n\ndata: {}\n"), 2);
    }

    #[test]
    fn the_simulated_workers_streams_count_their_tokens_plus_the_finish_chunk() {
        use crate::openai::{sse_event, Api, ResponseId, Usage, SSE_DONE};
        for include_usage in [false, true] {
            let id = ResponseId::new(Api::ChatCompletions, "m").with_usage_chunk(include_usage);
            let mut body: String = (0..5).map(|i| sse_event(&id.chunk("t", i == 0))).collect();
            body.push_str(&sse_event(&id.finish_chunk()));
            if include_usage {
                body.push_str(&sse_event(&id.usage_chunk(Usage { prompt_tokens: 1, completion_tokens: 5 })));
            }
            body.push_str(SSE_DONE);
            assert_eq!(SseEvents::default().feed(body.as_bytes()), 6, "{body}");
        }
    }
}
