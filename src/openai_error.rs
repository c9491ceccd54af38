//! OpenAI-shaped error bodies, `{"error":{"message","type","param","code"}}`
//! with `code` the HTTP status sent and `param` the request field at fault
//! (`null` when none): the one set the library's refusals (`Refusal`,
//! `Routed`) and the `loadgate` binary answer with, byte for byte. Plain
//! strings (feature `openai-error`, written by `serde_json`): any HTTP stack
//! can send them (as `application/json`).
//!
//! `type` is OpenAI's [`INVALID_REQUEST_ERROR`] for a client error (an
//! unknown model, a body without a model), the [`Rejection`]'s own
//! (`Overloaded`, `Unavailable`) for a shedding answer, and OpenAI's
//! [`SERVER_ERROR`] for a gateway error.
//!
//! # Examples
//!
//! ```
//! use loadgate::openai_error;
//!
//! assert_eq!(
//!     openai_error::unknown_model(Some("gpt-9")),
//!     r#"{"error":{"message":"model \"gpt-9\" not found","type":"invalid_request_error","param":"model","code":404}}"#
//! );
//! assert_eq!(
//!     openai_error::body("a \"quote\"", "Overloaded", None, 529),
//!     r#"{"error":{"message":"a \"quote\"","type":"Overloaded","param":null,"code":529}}"#
//! );
//! ```

use std::io::Write as _;

use crate::rejection::Rejection;

/// The `type` of every 4xx error body: OpenAI's.
pub const INVALID_REQUEST_ERROR: &str = "invalid_request_error";

/// The `type` of a 5xx error body that is not a shedding answer (those keep
/// `Overloaded` and `Unavailable`): OpenAI's.
pub const SERVER_ERROR: &str = "server_error";

/// The 404 status of an unknown model.
pub const UNKNOWN_MODEL_STATUS: u16 = 404;

/// `{"error":{"message","type","param","code"}}`, in OpenAI's field order,
/// with `code` the status sent. Every string is escaped as JSON requires
/// (as `serde_json` writes it), so a message may echo client input.
pub fn body(message: &str, kind: &str, param: Option<&str>, code: u16) -> String {
    let mut out = Vec::with_capacity(64 + message.len());
    out.extend_from_slice(br#"{"error":{"message":"#);
    push_json_string(&mut out, message);
    out.extend_from_slice(br#","type":"#);
    push_json_string(&mut out, kind);
    out.extend_from_slice(br#","param":"#);
    match param {
        Some(param) => push_json_string(&mut out, param),
        None => out.extend_from_slice(b"null"),
    }
    // Writing to a Vec cannot fail.
    let _ = write!(out, r#","code":{code}}}}}"#);
    // Only UTF-8 went in (the pieces above and serde_json's strings).
    String::from_utf8(out).unwrap_or_default()
}

/// The 404 body of a request for a model nobody serves: `model "<name>" not
/// found` (the name quoted as Rust's `{:?}` writes it), or `model not found`
/// without a name; `param` is `model`.
pub fn unknown_model(model: Option<&str>) -> String {
    body(&unknown_model_message(model), INVALID_REQUEST_ERROR, Some("model"), UNKNOWN_MODEL_STATUS)
}

/// The message of [`unknown_model`]'s body.
pub fn unknown_model_message(model: Option<&str>) -> String {
    match model {
        Some(model) => format!("model {model:?} not found"),
        None => "model not found".to_owned(),
    }
}

/// The 400 body of a request without a usable `"model"` (absent, not a
/// string, or empty; or a body that is not a JSON object).
pub fn invalid_model() -> String {
    body(r#""model" must be a non-empty string"#, INVALID_REQUEST_ERROR, Some("model"), 400)
}

/// The body of a shedding answer: the rejection's message and type, `code`
/// its status.
pub fn rejection(rejection: Rejection) -> String {
    body(rejection.message(), rejection.error_type(), None, rejection.status())
}

/// Appends `text` as a JSON string, as `serde_json` writes it.
fn push_json_string(out: &mut Vec<u8>, text: &str) {
    // Serialising a str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, text);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{json, Value};

    use super::*;

    /// What `serde_json` writes for the same body (`json!` keeps the field
    /// order only with `preserve_order`, so the fields are written one by one).
    fn serde_body(message: &str, kind: &str, param: Option<&str>, code: u16) -> String {
        let field = |v: &str| serde_json::to_string(v).unwrap();
        let param = param.map_or("null".to_owned(), field);
        format!(r#"{{"error":{{"message":{},"type":{},"param":{param},"code":{code}}}}}"#, field(message), field(kind))
    }

    #[test]
    fn the_shapes() {
        let parsed: Value = serde_json::from_str(&unknown_model(None)).unwrap();
        assert_eq!(
            parsed,
            json!({"error": {"message": "model not found", "type": "invalid_request_error", "param": "model", "code": 404}})
        );
        let parsed: Value = serde_json::from_str(&invalid_model()).unwrap();
        assert_eq!(parsed["error"]["message"], r#""model" must be a non-empty string"#);
        assert_eq!((parsed["error"]["param"].as_str(), parsed["error"]["code"].as_u64()), (Some("model"), Some(400)));
        assert_eq!(
            rejection(Rejection::Unavailable),
            r#"{"error":{"message":"No worker is available for this model","type":"Unavailable","param":null,"code":503}}"#
        );
        let odd = "a\"b\\c\u{8}\t\n\u{c}\r\u{1}\u{1f}\u{7f}é/😀";
        assert_eq!(body(odd, SERVER_ERROR, Some(odd), 502), serde_body(odd, SERVER_ERROR, Some(odd), 502));
        let name = "gpt\"9\n";
        let parsed: Value = serde_json::from_str(&unknown_model(Some(name))).unwrap();
        assert_eq!(parsed["error"]["message"], format!("model {name:?} not found"));
    }

    proptest! {
        #[test]
        fn every_body_is_what_serde_json_writes(message in any::<String>(), param in any::<Option<String>>(), code in 100u16..1000) {
            prop_assert_eq!(
                body(&message, INVALID_REQUEST_ERROR, param.as_deref(), code),
                serde_body(&message, INVALID_REQUEST_ERROR, param.as_deref(), code)
            );
        }
    }
}
