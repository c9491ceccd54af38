//! [`list_models`]: the models an engine serves, from its OpenAI
//! `GET /v1/models` (`{"data": [{"id": ...}, ...]}`; llama.cpp names its
//! model by the GGUF file's path).

use std::time::Duration;

use anyhow::Context as _;
use serde_json::Value;

use crate::engines::fetch::get_text;

/// Most model ids taken from one engine.
pub const MAX_MODELS: usize = 64;
/// Longest model id, in bytes.
pub const MAX_MODEL_ID: usize = 256;
/// Largest `/v1/models` body read.
const MAX_BODY: usize = 1 << 20;

/// The ids of GET {base}/v1/models (bounded: at most 64 ids, each <= 256 bytes, body capped).
///
/// In the engine's order, without duplicates.
///
/// # Errors
///
/// No answer within `timeout`, a failed status, a body over 1 MiB or not
/// JSON in OpenAI's shape, no id at all, more than [`MAX_MODELS`] ids, or an
/// empty id or one over [`MAX_MODEL_ID`] bytes.
pub async fn list_models(client: &reqwest::Client, base_url: &str, timeout: Duration) -> anyhow::Result<Vec<String>> {
    let url = format!("{base_url}/v1/models");
    let body = tokio::time::timeout(timeout, get_text(client, &url, MAX_BODY))
        .await
        .map_err(|_| anyhow::anyhow!("GET {url}: no answer within {timeout:?}"))?
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    parse_models(&body).with_context(|| format!("GET {url}"))
}

/// The ids of a `/v1/models` body.
fn parse_models(body: &str) -> anyhow::Result<Vec<String>> {
    let value: Value = serde_json::from_str(body).context("not JSON")?;
    let Some(data) = value.get("data").and_then(Value::as_array) else {
        anyhow::bail!("no `data` list (not an OpenAI /v1/models answer)");
    };
    let mut ids: Vec<String> = Vec::new();
    for entry in data {
        let Some(id) = entry.get("id").and_then(Value::as_str) else {
            anyhow::bail!("a `data` entry without a string `id`");
        };
        if id.is_empty() || id.len() > MAX_MODEL_ID {
            anyhow::bail!(
                "model id of {} bytes (1 to {MAX_MODEL_ID} allowed): name the model with model=NAME",
                id.len()
            );
        }
        if !ids.iter().any(|known| known == id) {
            if ids.len() == MAX_MODELS {
                anyhow::bail!("more than {MAX_MODELS} models listed: name the one to serve with model=NAME");
            }
            ids.push(id.to_owned());
        }
    }
    if ids.is_empty() {
        anyhow::bail!("no model listed");
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_come_in_order_without_duplicates() {
        // llama.cpp's answer (samples/tiny-v1-models.json, shortened).
        let llama = r#"{"models":[{"name":"models/tiny-random-llama.gguf"}],"object":"list",
            "data":[{"id":"models/tiny-random-llama.gguf","object":"model","owned_by":"llamacpp"}]}"#;
        assert_eq!(parse_models(llama).unwrap(), ["models/tiny-random-llama.gguf"]);
        let two = r#"{"data":[{"id":"b"},{"id":"a"},{"id":"b"}]}"#;
        assert_eq!(parse_models(two).unwrap(), ["b", "a"]);
    }

    #[test]
    fn bad_lists_are_refused() {
        let many =
            format!(r#"{{"data":[{}]}}"#, (0..65).map(|i| format!(r#"{{"id":"m{i}"}}"#)).collect::<Vec<_>>().join(","));
        let long = format!(r#"{{"data":[{{"id":"{}"}}]}}"#, "x".repeat(257));
        for (body, says) in [
            ("nope", "not JSON"),
            (r#"{"object":"list"}"#, "no `data`"),
            (r#"{"data":[]}"#, "no model"),
            (r#"{"data":[{"id":7}]}"#, "without a string"),
            (r#"{"data":[{"id":""}]}"#, "0 bytes"),
            (long.as_str(), "257 bytes"),
            (many.as_str(), "more than 64"),
        ] {
            let error = format!("{:#}", parse_models(body).unwrap_err());
            assert!(error.contains(says), "{body}: {error}");
        }
    }
}
