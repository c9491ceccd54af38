//! The worker's reading of requests (counts, the 400 naming a field) and
//! the shapes of its error, response and SSE chunk bodies.

use super::*;

#[test]
fn counts_words_token_ids_and_chat_contents() {
    let r = parse_request(Api::Completions, br#"{"model":"m","prompt":"a b  c\nd","max_tokens":3}"#).unwrap();
    assert_eq!((r.prompt_tokens, r.max_tokens, r.stream, r.model.as_str()), (4, 3, false, "m"));
    let r = parse_request(Api::Completions, br#"{"model":"m","prompt":[1,2,3,4,5],"stream":true}"#).unwrap();
    assert_eq!((r.prompt_tokens, r.max_tokens, r.stream, r.include_usage), (5, DEFAULT_MAX_TOKENS, true, false));
    let r = parse_request(
        Api::ChatCompletions,
        br#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi there you"}]}]}"#,
    )
    .unwrap();
    assert_eq!(r.prompt_tokens, 5);
    let r = parse_request(Api::ChatCompletions, br#"{"model":"m","messages":[{}],"max_completion_tokens":7}"#);
    assert_eq!(r.unwrap().max_tokens, 7);
    let body = br#"{"model":"m","prompt":"a","stream":true,"stream_options":{"include_usage":true}}"#;
    assert!(parse_request(Api::Completions, body).unwrap().include_usage);
}

#[test]
fn a_wrong_type_is_a_400_naming_the_field() {
    for (api, body, param) in BAD_REQUESTS {
        let error = parse_request(*api, body.as_bytes()).unwrap_err();
        assert_eq!(error.param, Some(*param), "{body}: {error}");
        assert!(error.message.contains(&format!("\"{param}\"")), "the message names it: {error}");
    }
    for (api, body) in GOOD_REQUESTS {
        assert!(parse_request(*api, body.as_bytes()).is_ok(), "{body}");
    }
    for body in ["not json", "[1]", "\"m\"", ""] {
        let error = parse_request(Api::Completions, body.as_bytes()).unwrap_err();
        assert_eq!(error.param, None, "{body}");
    }
    // Passed on as its message, an error keeps its field.
    for field in Field::ALL {
        let message: String = field.invalid().into();
        assert_eq!(InvalidRequest::from(&message), field.invalid());
    }
    let message = String::from(InvalidRequest::stream_options_without_stream());
    assert_eq!(InvalidRequest::from(message).param, Some("stream_options"));
    assert_eq!(InvalidRequest::from("request body must be a JSON object").param, None);
}

#[test]
fn the_error_body_is_openais_shape() {
    let body: Value = serde_json::from_str(&error_body("no", INVALID_REQUEST_ERROR, Some("stream"), 400)).unwrap();
    assert_eq!(
        body,
        json!({"error": {"message": "no", "type": "invalid_request_error", "param": "stream", "code": 400}})
    );
    assert_eq!(
        error_body("a \"quote\"", "Overloaded", None, 529),
        r#"{"error":{"message":"a \"quote\"","type":"Overloaded","param":null,"code":529}}"#,
        "OpenAI's order"
    );
    let body: Value = serde_json::from_str(&error_body("no", SERVER_ERROR, None, 502)).unwrap();
    assert_eq!(body["error"]["param"], Value::Null);
    assert!(body["error"].as_object().unwrap().contains_key("param"));
}

#[test]
fn full_response_carries_usage() {
    let id = ResponseId::new(Api::Completions, "m");
    let body = id.full("x", Usage { prompt_tokens: 3, completion_tokens: 2 });
    assert!(body.contains(r#""usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}"#), "{body}");
}

#[test]
fn chunks_carry_usage_only_in_the_usage_chunk() {
    let usage = Usage { prompt_tokens: 3, completion_tokens: 2 };
    for api in [Api::Completions, Api::ChatCompletions] {
        let plain = ResponseId::new(api, "m");
        for chunk in [plain.chunk("x", true), plain.chunk("y", false), plain.finish_chunk()] {
            let chunk: Value = serde_json::from_str(&chunk).unwrap();
            assert!(chunk.get("usage").is_none(), "{chunk}");
            assert_eq!(chunk["choices"].as_array().unwrap().len(), 1);
        }
        let counted = plain.with_usage_chunk(true);
        for chunk in [counted.chunk("x", true), counted.finish_chunk()] {
            let chunk: Value = serde_json::from_str(&chunk).unwrap();
            assert_eq!(chunk["usage"], Value::Null, "present and null: {chunk}");
        }
        let last: Value = serde_json::from_str(&counted.usage_chunk(usage)).unwrap();
        assert_eq!(last["choices"], json!([]));
        assert_eq!(last["usage"], json!({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}));
        assert_eq!(last["id"], serde_json::from_str::<Value>(&counted.chunk("x", false)).unwrap()["id"]);
    }
}
