//! The one-pass reading checked against the parsed value: the counts of
//! `crate::tokens::prompt_tokens`, and the same 400s (and the same accepted
//! requests) as `crate::openai::parse_request`, the worker's reader.

use serde_json::{json, Value};

use super::*;
use crate::openai::{Api, BAD_REQUESTS, GOOD_REQUESTS};
use crate::tokens::prompt_tokens;

/// Count the prompt, no nvext.
const COUNT: Reading = Reading { prompt: true, nvext_priority: false };

fn head(endpoint: Endpoint, body: &str) -> Result<RequestHead, InvalidRequest> {
    read_request(endpoint, body.as_bytes(), COUNT)
}

#[test]
fn the_nvext_priority_is_read_only_when_asked() {
    let read = |body: &str, nvext_priority| {
        read_request(Endpoint::Completions, body.as_bytes(), Reading { prompt: false, nvext_priority })
            .map(|head| head.priority)
    };
    let body = r#"{"model":"m","prompt":"a","nvext":{"greed_sampling":true,"agent_hints":{"osl":5,"priority":-3}}}"#;
    assert_eq!(read(body, true), Ok(Some(-3)));
    assert_eq!(read(body, false), Ok(None));
    for absent in [
        r#"{"model":"m","prompt":"a"}"#,
        r#"{"model":"m","prompt":"a","nvext":null}"#,
        r#"{"model":"m","prompt":"a","nvext":{}}"#,
        r#"{"model":"m","prompt":"a","nvext":{"agent_hints":{"latency_sensitivity":1.2}}}"#,
    ] {
        assert_eq!(read(absent, true), Ok(None), "{absent}");
    }
    for wrong in [
        r#"{"model":"m","prompt":"a","nvext":{"agent_hints":{"priority":"high"}}}"#,
        r#"{"model":"m","prompt":"a","nvext":{"agent_hints":{"priority":1.5}}}"#,
        r#"{"model":"m","prompt":"a","nvext":{"agent_hints":{"priority":[1]}}}"#,
        r#"{"model":"m","prompt":"a","nvext":{"agent_hints":5}}"#,
        r#"{"model":"m","prompt":"a","nvext":[1]}"#,
        r#"{"model":"m","prompt":"a","nvext":5}"#,
    ] {
        // A clear 400 naming the field, not "not valid JSON".
        let error = read(wrong, true).expect_err(wrong);
        assert_eq!(error.param, Some("nvext.agent_hints.priority"), "{wrong}");
        assert!(error.message.starts_with("\"nvext.agent_hints.priority\" must be an integer"), "{}", error.message);
        assert_eq!(read(wrong, false), Ok(None), "unread when not asked: {wrong}");
    }
    // Any integer, as the header takes it: past 64 bits, the extreme of its
    // sign; the last of a repeated key wins.
    let priority = |value: &str| {
        read(&format!(r#"{{"model":"m","prompt":"a","nvext":{{"agent_hints":{{"priority":{value}}}}}}}"#), true)
    };
    assert_eq!(priority("9223372036854775808"), Ok(Some(i64::MAX)));
    assert_eq!(priority("18446744073709551615"), Ok(Some(i64::MAX)));
    assert_eq!(priority("-9223372036854775808"), Ok(Some(i64::MIN)));
    assert_eq!(priority("null"), Ok(None));
    let twice = r#"{"model":"m","prompt":"a","nvext":{"agent_hints":{"priority":1,"priority":-2}}}"#;
    assert_eq!(read(twice, true), Ok(Some(-2)));
    // The body's other fields are still checked first.
    let both = r#"{"prompt":"a","nvext":{"agent_hints":{"priority":"x"}}}"#;
    assert_eq!(read(both, true).expect_err(both).param, Some("model"));
}

fn endpoint(api: Api) -> Endpoint {
    match api {
        Api::Completions => Endpoint::Completions,
        Api::ChatCompletions => Endpoint::ChatCompletions,
    }
}

#[test]
fn counts_as_the_parsed_value_does() {
    let cases = [
        (Endpoint::Completions, json!({"model": "m", "prompt": "one two  three"})),
        (Endpoint::Completions, json!({"model": "m", "prompt": [1, 2, 3, 4]})),
        (Endpoint::Completions, json!({"model": "m", "prompt": []})),
        (Endpoint::Completions, json!({"model": "m", "prompt": ["a b", "c", "", " d  e "]})),
        (Endpoint::Completions, json!({"model": "m", "prompt": [[1, 2, 3], [4], []]})),
        (Endpoint::Completions, json!({"model": "m", "prompt": "esc\\\"aped\nwords \u{e9}t\u{e9}"})),
        (Endpoint::Completions, json!({"messages": [{"content": "not counted here"}], "model": "m", "prompt": "x"})),
        (
            Endpoint::ChatCompletions,
            json!({"model": "m", "messages": [
                {"role": "user", "content": "a b c"},
                {"content": [{"type": "text", "text": "d e"}, {"text": 5}, {"text": ["f g"]}, "loose", {"image": "x"}]},
                {"content": 3},
                {"content": {"text": "h"}},
                {"role": "system"},
            ]}),
        ),
        (Endpoint::ChatCompletions, json!({"model": "m", "messages": [{}], "prompt": "ignored"})),
        (
            Endpoint::ChatCompletions,
            json!({"model": "m", "tools": [{"type": "function", "function": {"name": "f", "description": "a b c",
                "parameters": {"type": "object", "required": ["x"], "n": 3, "ok": true}}}],
                "messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "c1",
                    "function": {"name": "f", "arguments": "{\"x\": \"lorem ipsum dolor\"}"}}]},
                    {"role": "tool", "content": "done"}]}),
        ),
        (Endpoint::Completions, json!({"model": "m", "prompt": "a", "tools": "not a chat: not counted"})),
    ];
    for (endpoint, value) in cases {
        let body = value.to_string();
        let read = head(endpoint, &body).unwrap();
        assert_eq!(read.model, "m");
        assert_eq!(read.prompt_tokens, prompt_tokens(endpoint, &value), "{body}");
        // Without counting, only the model is read (and the types checked).
        assert_eq!(read_request(endpoint, body.as_bytes(), Reading::default()).unwrap().prompt_tokens, 0);
    }
}

#[test]
fn refuses_what_the_proxy_refused() {
    let not_object = Err(InvalidRequest::body("request body must be a JSON object"));
    assert_eq!(head(Endpoint::Completions, "[1, 2]"), not_object);
    assert_eq!(head(Endpoint::Completions, " \"m\""), not_object);
    for body in ["", "{", "{\"model\": \"m\"} trailing", "nope", "{\"model\": \"m\", }", "{\"stream\": \"yes\", "] {
        let error = head(Endpoint::Completions, body).unwrap_err();
        assert!(error.message.starts_with("request body is not valid JSON"), "{body}: {error}");
        assert_eq!(error.param, None);
    }
    let no_model =
        Err(InvalidRequest { param: Some("model"), message: "\"model\" must be a non-empty string".to_owned() });
    for body in [r#"{}"#, r#"{"model": ""}"#, r#"{"model": 5}"#, r#"{"model": {"name": "m"}}"#, r#"{"model": ["m"]}"#] {
        assert_eq!(head(Endpoint::ChatCompletions, body), no_model, "{body}");
    }
    // The last of a repeated key wins, as in a parsed value.
    let value: Value = serde_json::from_str(r#"{"model": "a", "model": "b"}"#).unwrap();
    assert_eq!(value["model"], "b");
    let body = r#"{"model": "a", "model": "b", "prompt": 5, "prompt": "x"}"#;
    assert_eq!(head(Endpoint::Completions, body).unwrap().model, "b");
    assert_eq!(head(Endpoint::Completions, r#"{"model": "caf\u00e9", "prompt": ""}"#).unwrap().model, "café");
}

#[test]
fn a_wrong_type_is_a_400_naming_the_field_as_the_worker_says() {
    for (api, body) in GOOD_REQUESTS {
        for count in [true, false] {
            assert!(
                read_request(endpoint(*api), body.as_bytes(), Reading { prompt: count, nvext_priority: false }).is_ok(),
                "{body}"
            );
        }
    }
    for (api, body, param) in BAD_REQUESTS {
        for count in [true, false] {
            let error = read_request(endpoint(*api), body.as_bytes(), Reading { prompt: count, nvext_priority: false })
                .unwrap_err();
            assert_eq!(error.param, Some(*param), "{body}: {error}");
            // The same 400 as the worker's (which reads a parsed value).
            assert_eq!(Err(error), crate::openai::parse_request(*api, body.as_bytes()).map(|_| ()), "{body}");
        }
    }
}

#[test]
fn an_error_passed_on_as_its_message_keeps_its_field() {
    let message = read_head::<String>(Endpoint::Completions, br#"{"model":"m","prompt":"a","stream":"yes"}"#, COUNT);
    assert_eq!(InvalidRequest::from(&message.unwrap_err()).param, Some("stream"));
}

#[test]
fn a_large_prompt_is_read_without_a_tree() {
    let body = format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(8 << 20));
    let read = read_request(Endpoint::Completions, body.as_bytes(), COUNT).unwrap();
    // One word of 8 MiB: a token per 8 bytes.
    assert_eq!(
        read,
        RequestHead { model: "m".to_owned(), prompt_tokens: 1 << 20, priority: None, engine_priority: false }
    );
    let ids = format!(r#"{{"model":"m","prompt":[{}0]}}"#, "1,".repeat(1 << 20));
    assert_eq!(read_request(Endpoint::Completions, ids.as_bytes(), COUNT).unwrap().prompt_tokens, (1 << 20) + 1);
}

/// The simulated worker's reading, in one pass, answers every request as
/// the reference on the parsed value does (`crate::openai::parse_request`):
/// the same fields, or the same 400.
#[test]
fn the_workers_reading_answers_as_the_parsed_value() {
    let mut cases: Vec<(Api, String)> = GOOD_REQUESTS.iter().map(|(api, body)| (*api, (*body).to_owned())).collect();
    cases.extend(BAD_REQUESTS.iter().map(|(api, body, _)| (*api, (*body).to_owned())));
    for tail in [
        r#""max_tokens":7"#,
        r#""max_completion_tokens":9"#,
        r#""max_tokens":null,"max_completion_tokens":9"#,
        r#""max_tokens":3,"max_completion_tokens":9"#,
        r#""max_tokens":0"#,
        r#""stream":true"#,
        r#""stream":null"#,
        r#""stream":true,"stream_options":{"include_usage":true}"#,
        r#""stream":true,"stream_options":{"include_usage":false}"#,
        r#""stream":true,"stream_options":null"#,
        r#""stream":false,"stream_options":{}"#,
        r#""stream_options":{"include_usage":null}"#,
    ] {
        cases.push((Api::Completions, format!(r#"{{"model":"m","prompt":[1,2,3],{tail}}}"#)));
        cases.push((Api::ChatCompletions, format!(r#"{{"model":"m","messages":[{{"content":"a b"}}],{tail}}}"#)));
    }
    cases.push((Api::Completions, format!(r#"{{"model":"m","prompt":"{}"}}"#, "w ".repeat(70_000))));
    for (api, body) in cases {
        assert_eq!(read_generation(api, body.as_bytes()), crate::openai::parse_request(api, body.as_bytes()), "{body}");
    }
}

/// A chat's `tools` and its messages' `tool_calls` are rendered into the
/// prompt by engines: they count (they counted 0, so a client could queue
/// a long prompt as an empty one). Found by a review.
#[test]
fn tools_and_tool_calls_count() {
    let args = format!("{{\"text\": \"{}\"}}", "lorem ipsum dolor sit amet ".repeat(400));
    let body = json!({"model": "m", "tools": [{"type": "function", "function": {"name": "f",
        "description": "lorem ipsum dolor sit amet ".repeat(400)}}],
        "messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "f", "arguments": args}}]}]});
    let tokens = head(Endpoint::ChatCompletions, &body.to_string()).unwrap().prompt_tokens;
    assert!(tokens >= 4_000, "about 4,000 words of tools and arguments: {tokens}");
}

/// An `nvext.agent_hints.priority` integer past 64 bits is the extreme of
/// its sign, as the docs say (and as in `x-loadgate-priority`); serde_json
/// reads it (and `-0`) as a float, which was refused with a 400. A
/// fraction or an exponent within 64 bits is still refused. Found by a
/// review.
#[test]
fn an_nvext_priority_past_64_bits_is_the_extreme_of_its_sign() {
    let priority = |value: &str| {
        let body = format!(r#"{{"model":"m","prompt":"a","nvext":{{"agent_hints":{{"priority":{value}}}}}}}"#);
        read_request(Endpoint::Completions, body.as_bytes(), Reading { prompt: false, nvext_priority: true })
            .map(|head| head.priority)
    };
    assert_eq!(priority("18446744073709551616"), Ok(Some(i64::MAX)), "one past u64::MAX");
    assert_eq!(priority("-9223372036854775809"), Ok(Some(i64::MIN)), "one below i64::MIN");
    assert_eq!(priority("-0"), Ok(Some(0)));
    assert_eq!(priority("-9223372036854775808"), Ok(Some(i64::MIN)));
    assert!(priority("1.5").is_err() && priority("2e3").is_err());
}

/// A model's name past `MAX_MODEL_LEN` is a 400 naming `model` in both
/// readers (never copied by the one pass); one at the bound is read.
#[test]
fn a_model_name_past_the_bound_is_refused() {
    use crate::openai::{parse_request, MAX_MODEL_LEN};
    let body = |len: usize| format!(r#"{{"model":"{}","prompt":"a"}}"#, "m".repeat(len));
    let long = body(MAX_MODEL_LEN + 1);
    let error = head(Endpoint::Completions, &long).unwrap_err();
    assert_eq!(error, InvalidRequest::model_too_long());
    assert_eq!(error.param, Some("model"));
    assert_eq!(parse_request(Api::Completions, long.as_bytes()), Err(InvalidRequest::model_too_long()));
    assert_eq!(InvalidRequest::from_message(error.message.clone()), error, "its param survives as a message");
    // Escaped (read through serde_json's scratch), too.
    let escaped = format!(r#"{{"model":"\\{}","prompt":"a"}}"#, "m".repeat(MAX_MODEL_LEN));
    assert_eq!(head(Endpoint::Completions, &escaped), Err(InvalidRequest::model_too_long()));
    let at_bound = body(MAX_MODEL_LEN);
    assert_eq!(head(Endpoint::Completions, &at_bound).map(|h| h.model.len()), Ok(MAX_MODEL_LEN));
    assert!(parse_request(Api::Completions, at_bound.as_bytes()).is_ok());
}

/// Found by a review: bytes that are not UTF-8 in a field the reader skips
/// (serde_json checks only the strings it reads) passed the frontend and
/// the simulated worker as valid JSON, to be refused, or not, by whatever
/// engine got them. Both readers refuse them, without a `param`.
#[test]
fn a_body_that_is_not_utf8_is_not_json_wherever_the_bytes_are() {
    use crate::openai::parse_request;
    for bytes in [
        &b"{\"model\":\"m\",\"prompt\":\"a\",\"user\":\"\xff\"}"[..],
        b"{\"model\":\"m\",\"prompt\":\"a\",\"x\":{\"y\":[\"\xc3\"]}}",
        b"{\"model\":\"m\",\"messages\":[{\"role\":\"\xed\xa0\x80\"}]}",
        b"[\"\xff\"]",
    ] {
        for endpoint in [Endpoint::Completions, Endpoint::ChatCompletions] {
            let error = read_request(endpoint, bytes, COUNT).expect_err(&String::from_utf8_lossy(bytes));
            assert!(error.message.starts_with("request body is not valid JSON"), "{error}");
            assert_eq!(error.param, None);
        }
        assert!(parse_request(Api::ChatCompletions, bytes).is_err(), "the reference refuses it too");
    }
}
