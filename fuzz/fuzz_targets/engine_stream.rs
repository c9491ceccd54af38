//! `loadgate::engines::StreamAssembler` against a reference model: streams
//! of chat or completions chunks (text pieces for several choices,
//! reasoning, tool calls built up piece by piece, finish reasons, usage,
//! comments, CRLF line ends), rendered to server-sent events, cut into
//! arbitrary pieces and assembled, must give what the reference computes
//! from the structure: each choice's text and reasoning concatenated, its
//! last finish reason, its tool calls merged by index, the last usage; an
//! error event gives its status; a stream cut before `[DONE]` is
//! incomplete. Arbitrary bytes must never panic, must assemble the same
//! however they are cut, and an answer is always a JSON object.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use loadgate::engines::{AssembleError, Assembled, CompletionRoute, StreamAssembler};
use serde_json::{json, Value};

#[derive(Arbitrary, Debug)]
enum Input {
    Model { chat: bool, chunks: Vec<Chunk>, ending: Ending, crlf: bool, cuts: Vec<u16> },
    Raw { chat: bool, bytes: Vec<u8>, cuts: Vec<u16> },
}

#[derive(Arbitrary, Debug)]
enum Chunk {
    Text { choice: u8, text: String, reasoning: bool },
    Finish { choice: u8, reason: u8 },
    Usage(u32),
    Comment(String),
    ToolCall { choice: u8, call: u8, id: Option<String>, name: Option<String>, arguments: String },
}

#[derive(Arbitrary, Debug)]
enum Ending {
    Done,
    Cut,
    Error(u16),
}

const REASONS: [&str; 3] = ["stop", "length", "tool_calls"];

/// What the reference expects of one choice.
#[derive(Default, Debug)]
struct Expected {
    text: String,
    reasoning: Option<String>,
    finish: Option<&'static str>,
    /// By index: the id, the name, the arguments.
    calls: BTreeMap<u8, (Option<String>, Option<String>, Option<String>)>,
}

/// `text` without line breaks (for a comment line).
fn one_line(text: &str) -> String {
    text.chars().filter(|c| *c != '\n' && *c != '\r').collect()
}

fn route(chat: bool) -> CompletionRoute {
    if chat {
        CompletionRoute::ChatCompletions
    } else {
        CompletionRoute::Completions
    }
}

/// Assembles `bytes` cut at `cuts` (offsets, modulo the length).
fn assemble(route: CompletionRoute, bytes: &[u8], cuts: &[u16]) -> Result<Assembled, AssembleError> {
    let mut at: Vec<usize> = cuts.iter().map(|&c| usize::from(c) % (bytes.len() + 1)).collect();
    at.push(0);
    at.push(bytes.len());
    at.sort_unstable();
    at.dedup();
    let mut assembler = StreamAssembler::new(route);
    for piece in at.windows(2) {
        assembler.push(&bytes[piece[0]..piece[1]])?;
        if assembler.ended() {
            break;
        }
    }
    assembler.finish()
}

fn model(chat: bool, chunks: &[Chunk], ending: &Ending, crlf: bool, cuts: &[u16]) {
    let eol = if crlf { "\r\n" } else { "\n" };
    let mut stream = String::new();
    let event = |data: &Value, stream: &mut String| {
        stream.push_str(&format!("data: {data}{eol}{eol}"));
    };
    let mut expected: BTreeMap<u8, Expected> = BTreeMap::new();
    let mut usage = None;
    for chunk in chunks {
        match chunk {
            Chunk::Text { choice, text, reasoning } => {
                let index = choice % 3;
                let slot = expected.entry(index).or_default();
                let choice = if !chat {
                    slot.text.push_str(text);
                    json!({"index": index, "text": text, "finish_reason": null})
                } else if *reasoning {
                    slot.reasoning.get_or_insert_with(String::new).push_str(text);
                    json!({"index": index, "delta": {"reasoning_content": text}, "finish_reason": null})
                } else {
                    slot.text.push_str(text);
                    json!({"index": index, "delta": {"content": text}, "finish_reason": null})
                };
                event(&json!({"choices": [choice], "id": "x"}), &mut stream);
            }
            Chunk::Finish { choice, reason } => {
                let index = choice % 3;
                let reason = REASONS[usize::from(reason % 3)];
                expected.entry(index).or_default().finish = Some(reason);
                let choice = if chat {
                    json!({"index": index, "delta": {}, "finish_reason": reason})
                } else {
                    json!({"index": index, "text": "", "finish_reason": reason})
                };
                event(&json!({"choices": [choice]}), &mut stream);
            }
            Chunk::Usage(tokens) => {
                usage = Some(*tokens);
                event(&json!({"choices": [], "usage": {"completion_tokens": tokens}}), &mut stream);
            }
            Chunk::Comment(text) => stream.push_str(&format!(":{}{eol}{eol}", one_line(text))),
            Chunk::ToolCall { choice, call, id, name, arguments } => {
                if !chat {
                    continue;
                }
                let (index, call) = (choice % 3, call % 4);
                let slot = expected.entry(index).or_default();
                let seen = slot.calls.entry(call).or_default();
                let mut delta = json!({"index": call});
                if let Some(id) = id {
                    seen.0 = Some(id.clone());
                    delta["id"] = json!(id);
                }
                let mut function = json!({"arguments": arguments});
                seen.2.get_or_insert_with(String::new).push_str(arguments);
                if let Some(name) = name {
                    seen.1 = Some(name.clone());
                    function["name"] = json!(name);
                }
                delta["function"] = function;
                let choice = json!({"index": index, "delta": {"tool_calls": [delta]}});
                event(&json!({"choices": [choice]}), &mut stream);
            }
        }
    }
    match ending {
        Ending::Done => stream.push_str(&format!("data: [DONE]{eol}{eol}")),
        Ending::Cut => {}
        Ending::Error(code) => event(&json!({"error": {"code": code, "message": "m"}}), &mut stream),
    }
    let outcome = assemble(route(chat), stream.as_bytes(), cuts);
    let answer = match (ending, outcome) {
        (Ending::Cut, Err(AssembleError::Incomplete)) => return,
        (Ending::Error(code), Ok(Assembled::EngineError { status, body })) => {
            let want = if (400..=599).contains(code) { *code } else { 500 };
            assert_eq!(status, want);
            let body: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(body["error"]["code"], json!(code));
            return;
        }
        (Ending::Done, Ok(Assembled::Answer(answer))) => answer,
        (ending, outcome) => panic!("{ending:?} gave {outcome:?}"),
    };
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(answer["object"], if chat { "chat.completion" } else { "text_completion" });
    assert_eq!(answer.get("usage").map(|u| u["completion_tokens"].clone()), usage.map(|u| json!(u)));
    let choices = answer["choices"].as_array().unwrap();
    assert_eq!(choices.len(), expected.len());
    for (choice, (index, want)) in choices.iter().zip(&expected) {
        assert_eq!(choice["index"], json!(index));
        assert_eq!(choice.get("finish_reason").and_then(Value::as_str), want.finish);
        if !chat {
            assert_eq!(choice["text"].as_str().unwrap_or(""), want.text);
            continue;
        }
        let message = &choice["message"];
        assert_eq!(message["role"], "assistant");
        assert_eq!(message["content"].as_str().unwrap(), want.text);
        assert_eq!(message.get("reasoning_content").and_then(Value::as_str), want.reasoning.as_deref());
        let calls = message.get("tool_calls").and_then(Value::as_array).cloned().unwrap_or_default();
        assert_eq!(calls.len(), want.calls.len());
        for (call, (_, (id, name, arguments))) in calls.iter().zip(&want.calls) {
            assert!(call.get("index").is_none());
            assert_eq!(call.get("id").and_then(Value::as_str), id.as_deref());
            assert_eq!(call["function"].get("name").and_then(Value::as_str), name.as_deref());
            assert_eq!(call["function"].get("arguments").and_then(Value::as_str), arguments.as_deref());
        }
    }
}

fn raw(chat: bool, bytes: &[u8], cuts: &[u16]) {
    let whole = assemble(route(chat), bytes, &[]);
    let cut = assemble(route(chat), bytes, cuts);
    assert_eq!(whole, cut, "the cut points changed the outcome");
    match whole {
        Ok(Assembled::Answer(answer)) => {
            let answer: Value = serde_json::from_slice(&answer).unwrap();
            assert!(answer["choices"].is_array());
            assert!(answer["object"].is_string());
        }
        Ok(Assembled::EngineError { status, body }) => {
            assert!((400..=599).contains(&status));
            assert!(serde_json::from_slice::<Value>(&body).unwrap().get("error").is_some());
        }
        Err(_) => {}
    }
}

fuzz_target!(|input: Input| match input {
    Input::Model { chat, chunks, ending, crlf, cuts } => model(chat, &chunks, &ending, crlf, &cuts),
    Input::Raw { chat, bytes, cuts } => raw(chat, &bytes, &cuts),
});
