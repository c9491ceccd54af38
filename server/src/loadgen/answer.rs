//! [`Tail`]: what `bench` keeps of a response body while it reads it — its
//! last bytes, never the whole of it (a frontend that streams without end
//! must not grow the load generator) — and whether the body was whole.
//!
//! A 2xx counts as served only when its body came to its end: a stream's
//! last event is `data: [DONE]`, a whole answer is a JSON object (its last
//! byte `}`). A body that stops before (a connection closed mid-stream, a
//! close-delimited answer cut short) is a failed request, not a completion.

/// The bytes kept of a body's end: enough for a stream's last events (the
/// usage chunk and `[DONE]`).
const TAIL: usize = 4096;

/// The end of a response body, as it was read.
#[derive(Debug, Default)]
pub(crate) struct Tail {
    bytes: Vec<u8>,
}

impl Tail {
    /// The next `chunk` of the body.
    pub(crate) fn push(&mut self, chunk: &[u8]) {
        if chunk.len() >= TAIL {
            self.bytes.clear();
            self.bytes.extend_from_slice(&chunk[chunk.len() - TAIL..]);
            return;
        }
        let over = (self.bytes.len() + chunk.len()).saturating_sub(TAIL);
        self.bytes.drain(..over);
        self.bytes.extend_from_slice(chunk);
    }

    /// Whether the body came to its end: `data: [DONE]` last when
    /// `stream` (the space after `data:` optional, as in any SSE field),
    /// else a JSON object's closing brace.
    pub(crate) fn is_whole(&self, stream: bool) -> bool {
        let body = self.bytes.trim_ascii_end();
        match stream {
            true => {
                let last_line = body.rsplit(|b| *b == b'\n').next().unwrap_or_default();
                last_line.strip_prefix(b"data:").is_some_and(|data| data.trim_ascii() == b"[DONE]")
            }
            false => body.ends_with(b"}"),
        }
    }

    /// The last `"completion_tokens":N` in the body (JSON or SSE), 0 if
    /// none.
    pub(crate) fn completion_tokens(&self) -> u64 {
        const KEY: &[u8] = b"\"completion_tokens\":";
        let text = &self.bytes;
        let Some(at) = text.windows(KEY.len()).rposition(|w| w == KEY) else { return 0 };
        text[at + KEY.len()..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .fold(0u64, |n, b| n.saturating_mul(10).saturating_add(u64::from(b - b'0')))
    }
}

/// Reads `response`'s body to its end, keeping its tail; `first` is called
/// at its first bytes.
///
/// # Errors
///
/// The body broke off (the transport's error).
pub(crate) async fn read_body(
    response: &mut reqwest::Response,
    mut first: impl FnMut(),
) -> Result<Tail, reqwest::Error> {
    let mut tail = Tail::default();
    let mut started = false;
    while let Some(chunk) = response.chunk().await? {
        if !std::mem::replace(&mut started, true) {
            first();
        }
        tail.push(&chunk);
    }
    Ok(tail)
}

/// The error counted for a 2xx whose body did not come to its end.
pub(crate) fn cut_short(stream: bool) -> std::io::Error {
    let what = match stream {
        true => "a 2xx stream ended without data: [DONE]",
        false => "a 2xx answer ended before its JSON did",
    };
    std::io::Error::new(std::io::ErrorKind::UnexpectedEof, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tail_of(chunks: &[&[u8]]) -> Tail {
        let mut tail = Tail::default();
        chunks.iter().for_each(|c| tail.push(c));
        tail
    }

    #[test]
    fn completion_tokens_of_json_and_sse() {
        let json = tail_of(&[br#"{"usage":{"prompt_tokens":3,"completion_tokens":17,"total_tokens":20}}"#]);
        assert_eq!(json.completion_tokens(), 17);
        assert!(json.is_whole(false));
        let sse = tail_of(&[b"data: {\"usage\":{\"completion_tokens\":", b"9}}\n\n", b"data: [DONE]\n\n"]);
        assert_eq!(sse.completion_tokens(), 9);
        assert!(sse.is_whole(true));
        assert!(tail_of(&[b"data:{}\r\n\r\ndata:[DONE]\r\n\r\n"]).is_whole(true), "no space, CRLF lines");
    }

    #[test]
    fn a_body_cut_short_is_not_whole() {
        assert!(!tail_of(&[b"data: {\"choices\":[]}\n\n"]).is_whole(true));
        assert!(!tail_of(&[b"{\"choices\":[{\"text\":\"a"]).is_whole(false));
        assert!(!Tail::default().is_whole(true));
        assert!(!tail_of(&[b"data: {\"text\":\"[DONE]\"}\n\n"]).is_whole(true));
        assert!(!tail_of(&[b"data: {}\n\n: [DONE]\n\n"]).is_whole(true), "a comment is no event");
    }

    #[test]
    fn only_the_tail_is_kept() {
        let mut tail = Tail::default();
        for _ in 0..1000 {
            tail.push(&[b'x'; 1000]);
        }
        tail.push(b"\n\ndata: [DONE]\n\n");
        assert!(tail.bytes.len() <= TAIL);
        assert!(tail.is_whole(true));
        tail.push(&vec![b'y'; 3 * TAIL]);
        assert_eq!(tail.bytes.len(), TAIL);
    }
}
