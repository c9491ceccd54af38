//! `loadgate::engines::StreamAssembler` against a reference model: streams
//! of chat or completions chunks (llama.cpp's opening role delta, text
//! pieces for several choices, two choices in one event, an index left out
//! for choice 0, reasoning, tool calls built up piece by piece with or
//! without arguments, finish reasons, usage, timings, comments, events
//! whose JSON spans several `data:` lines, LF, CRLF or CR line ends, a
//! byte-order mark, errors as data or as `event: error`), rendered to
//! server-sent events, cut into
//! arbitrary pieces and assembled, must give what the reference computes
//! from the structure: each choice's text and reasoning concatenated, its
//! last finish reason, its tool calls merged by index, the last usage; an
//! error event gives its status; a stream cut before `[DONE]` is
//! incomplete. Arbitrary bytes must never panic, must assemble the same
//! however they are cut, and an answer is always a JSON object.
//!
//! The parsed bound counts what is kept of the events, not the events
//! (under `cfg(fuzzing)` the assembler also checks its count of what it
//! keeps against a recount after every event). With a small bound (the
//! fuzzing-only `StreamAssembler::with_max_parsed`): the outcome is the
//! unbounded one or `TooLarge`, never anything else; arbitrary bytes still
//! assemble the same however they are cut; and an event that only replaces
//! what is kept (`id`, `created`, `model`: llama.cpp repeats them in every
//! chunk), sent any number of times, gives the outcome it gives sent twice.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use loadgate::engines::{AssembleError, Assembled, CompletionRoute, StreamAssembler};
use serde_json::{json, Value};

#[derive(Arbitrary, Debug)]
enum Input {
    Model { chat: bool, chunks: Vec<Chunk>, ending: Ending, style: Style, cuts: Vec<u16>, limit: Option<u16> },
    Raw { chat: bool, bytes: Vec<u8>, cuts: Vec<u16>, limit: Option<u16> },
}

/// How the events are written.
#[derive(Arbitrary, Debug)]
struct Style {
    /// 0: LF, 1: CRLF, 2: CR.
    eol: u8,
    bom: bool,
    /// Opens with llama.cpp's `{"role":"assistant","content":null}` delta.
    role_first: bool,
    /// Each event's JSON pretty-printed over several `data:` lines.
    multiline: bool,
    /// Leaves `index` out of choice 0.
    no_index: bool,
}

#[derive(Arbitrary, Debug)]
enum Chunk {
    Text {
        choice: u8,
        text: String,
        reasoning: bool,
    },
    /// Two choices' pieces in one event.
    Pair {
        first: String,
        second: String,
    },
    Timings(u32),
    Finish {
        choice: u8,
        reason: u8,
    },
    Usage(u32),
    /// Top-level members only (`id`, `created`, `model`), sent `1 + times % 8`
    /// times in a row.
    Meta {
        id: u8,
        times: u8,
    },
    Comment(String),
    ToolCall {
        choice: u8,
        call: u8,
        id: Option<String>,
        name: Option<String>,
        arguments: Option<String>,
    },
}

#[derive(Arbitrary, Debug)]
enum Ending {
    Done,
    Cut,
    Error(u16),
    /// `event: error` with the error object as its data.
    NamedError(u16),
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

/// Assembles `bytes` cut at `cuts` (offsets, modulo the length), keeping at
/// most `limit` bytes parsed (`None`: the real bound).
fn assemble(
    route: CompletionRoute,
    bytes: &[u8],
    cuts: &[u16],
    limit: Option<u16>,
) -> Result<Assembled, AssembleError> {
    let mut at: Vec<usize> = cuts.iter().map(|&c| usize::from(c) % (bytes.len() + 1)).collect();
    at.push(0);
    at.push(bytes.len());
    at.sort_unstable();
    at.dedup();
    let mut assembler = match limit {
        Some(limit) => StreamAssembler::with_max_parsed(route, usize::from(limit)),
        None => StreamAssembler::new(route),
    };
    for piece in at.windows(2) {
        assembler.push(&bytes[piece[0]..piece[1]])?;
        if assembler.ended() {
            break;
        }
    }
    assembler.finish()
}

/// A choice object for `index`, without the index for choice 0 when the
/// style says so.
fn choice_json(style: &Style, index: u8, mut members: Value) -> Value {
    if !(style.no_index && index == 0) {
        members["index"] = json!(index);
    }
    members
}

/// What the reference expects of a rendered stream.
#[derive(Default)]
struct Reference {
    choices: BTreeMap<u8, Expected>,
    usage: Option<u32>,
    timings: Option<u32>,
    /// The last `id` given.
    id: Option<String>,
    /// Whether a `created` (always 7) was given.
    created: bool,
}

/// The stream of `chunks` as server-sent events, and what the reference
/// expects of it. Each `Meta` is sent `1 + times % 8` times, at most twice
/// when `collapse`.
fn render(chat: bool, chunks: &[Chunk], ending: &Ending, style: &Style, collapse: bool) -> (String, Reference) {
    let eol = ["\n", "\r\n", "\r"][usize::from(style.eol % 3)];
    let mut stream = String::from(if style.bom { "\u{feff}" } else { "" });
    let event = |data: &Value, stream: &mut String| {
        if style.multiline {
            let pretty = serde_json::to_string_pretty(data).unwrap();
            for line in pretty.lines() {
                stream.push_str(&format!("data: {line}{eol}"));
            }
            stream.push_str(eol);
        } else {
            stream.push_str(&format!("data: {data}{eol}{eol}"));
        }
    };
    let mut reference = Reference::default();
    let expected = &mut reference.choices;
    if chat && style.role_first {
        expected.entry(0).or_default();
        let role =
            choice_json(style, 0, json!({"delta": {"role": "assistant", "content": null}, "finish_reason": null}));
        event(&json!({"choices": [role], "id": "x", "created": 7}), &mut stream);
        (reference.id, reference.created) = (Some("x".to_owned()), true);
    }
    for chunk in chunks {
        match chunk {
            Chunk::Pair { first, second } => {
                let key = if chat { "content" } else { "text" };
                let mut choices = Vec::new();
                for (index, text) in [(0u8, first), (1, second)] {
                    expected.entry(index).or_default().text.push_str(text);
                    let members = if chat { json!({"delta": {key: text}}) } else { json!({key: text}) };
                    choices.push(choice_json(style, index, members));
                }
                event(&json!({"choices": choices}), &mut stream);
            }
            Chunk::Timings(n) => {
                reference.timings = Some(*n);
                event(&json!({"choices": [], "timings": {"predicted_n": n}}), &mut stream);
            }
            Chunk::Text { choice, text, reasoning } => {
                let index = choice % 3;
                let slot = expected.entry(index).or_default();
                let members = if !chat {
                    slot.text.push_str(text);
                    json!({"text": text, "finish_reason": null})
                } else if *reasoning {
                    slot.reasoning.get_or_insert_with(String::new).push_str(text);
                    json!({"delta": {"reasoning_content": text}, "finish_reason": null})
                } else {
                    slot.text.push_str(text);
                    json!({"delta": {"content": text}, "finish_reason": null})
                };
                let choice = choice_json(style, index, members);
                event(&json!({"choices": [choice], "id": "x"}), &mut stream);
                reference.id = Some("x".to_owned());
            }
            Chunk::Finish { choice, reason } => {
                let index = choice % 3;
                let reason = REASONS[usize::from(reason % 3)];
                expected.entry(index).or_default().finish = Some(reason);
                let members = if chat {
                    json!({"delta": {}, "finish_reason": reason})
                } else {
                    json!({"text": "", "finish_reason": reason})
                };
                let choice = choice_json(style, index, members);
                event(&json!({"choices": [choice]}), &mut stream);
            }
            Chunk::Usage(tokens) => {
                reference.usage = Some(*tokens);
                event(&json!({"choices": [], "usage": {"completion_tokens": tokens}}), &mut stream);
            }
            Chunk::Meta { id, times } => {
                let id = format!("m{id}");
                let times = 1 + times % 8;
                for _ in 0..if collapse { times.min(2) } else { times } {
                    event(&json!({"choices": [], "id": id, "created": 7, "model": "m"}), &mut stream);
                }
                (reference.id, reference.created) = (Some(id), true);
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
                let mut function = json!({});
                if let Some(arguments) = arguments {
                    function["arguments"] = json!(arguments);
                    seen.2.get_or_insert_with(String::new).push_str(arguments);
                }
                if let Some(name) = name {
                    seen.1 = Some(name.clone());
                    function["name"] = json!(name);
                }
                delta["function"] = function;
                let choice = choice_json(style, index, json!({"delta": {"tool_calls": [delta]}}));
                event(&json!({"choices": [choice]}), &mut stream);
            }
        }
    }
    match ending {
        Ending::Done => stream.push_str(&format!("data: [DONE]{eol}{eol}")),
        Ending::Cut => {}
        Ending::Error(code) => event(&json!({"error": {"code": code, "message": "m"}}), &mut stream),
        Ending::NamedError(code) => {
            stream.push_str(&format!("event: error{eol}"));
            event(&json!({"code": code, "message": "m"}), &mut stream);
        }
    }
    (stream, reference)
}

fn model(chat: bool, chunks: &[Chunk], ending: &Ending, style: &Style, cuts: &[u16], limit: Option<u16>) {
    let (stream, reference) = render(chat, chunks, ending, style, false);
    let outcome = assemble(route(chat), stream.as_bytes(), cuts, None);
    if limit.is_some() {
        let bounded = assemble(route(chat), stream.as_bytes(), cuts, limit);
        assert!(
            bounded == outcome || bounded == Err(AssembleError::TooLarge),
            "{limit:?}: {bounded:?}, not {outcome:?}"
        );
        // What is kept is bounded, not the events: repeating one that only
        // replaces what is kept changes nothing past its second copy.
        let (collapsed, _) = render(chat, chunks, ending, style, true);
        let fewer = assemble(route(chat), collapsed.as_bytes(), cuts, limit);
        assert_eq!(fewer, bounded, "{limit:?}: an event repeated changed the outcome");
    }
    let answer = match (ending, outcome) {
        (Ending::Cut, Err(AssembleError::Incomplete)) => return,
        // `[DONE]` after no choice at all is malformed.
        (Ending::Done, Err(AssembleError::Malformed(_))) if reference.choices.is_empty() => return,
        (Ending::Error(code) | Ending::NamedError(code), Ok(Assembled::EngineError { status, body })) => {
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
    assert_eq!(answer.get("usage").map(|u| u["completion_tokens"].clone()), reference.usage.map(|u| json!(u)));
    assert_eq!(answer.get("timings").map(|t| t["predicted_n"].clone()), reference.timings.map(|n| json!(n)));
    assert_eq!(answer.get("id").and_then(Value::as_str), reference.id.as_deref());
    assert_eq!(answer.get("created").cloned(), reference.created.then(|| json!(7)));
    let choices = answer["choices"].as_array().unwrap();
    assert_eq!(choices.len(), reference.choices.len());
    for (choice, (index, want)) in choices.iter().zip(&reference.choices) {
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
            assert_eq!(call["type"], "function");
            assert_eq!(call.get("id").and_then(Value::as_str), id.as_deref());
            assert_eq!(call["function"].get("name").and_then(Value::as_str), name.as_deref());
            // As llama.cpp's unstreamed calls: arguments, "" when none came.
            assert_eq!(call["function"]["arguments"].as_str(), Some(arguments.as_deref().unwrap_or("")));
        }
    }
}

fn raw(chat: bool, bytes: &[u8], cuts: &[u16], limit: Option<u16>) {
    let whole = assemble(route(chat), bytes, &[], None);
    let cut = assemble(route(chat), bytes, cuts, None);
    assert_eq!(whole, cut, "the cut points changed the outcome");
    if limit.is_some() {
        let bounded = assemble(route(chat), bytes, &[], limit);
        assert!(bounded == whole || bounded == Err(AssembleError::TooLarge), "{limit:?}: {bounded:?}, not {whole:?}");
        assert_eq!(assemble(route(chat), bytes, cuts, limit), bounded, "{limit:?}: the cut points changed the outcome");
    }
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
    Input::Model { chat, chunks, ending, style, cuts, limit } => model(chat, &chunks, &ending, &style, &cuts, limit),
    Input::Raw { chat, bytes, cuts, limit } => raw(chat, &bytes, &cuts, limit),
});
