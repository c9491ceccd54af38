//! [`EngineSpec`]: one real inference engine named on the command line,
//! `KIND=URL[,model=NAME]` (`llamacpp=127.0.0.1:8080,model=tiny`).

use std::fmt;
use std::str::FromStr;

use loadgate::engines::EngineKind;

/// An engine to scrape and route to: its kind, where it listens, and the
/// model it serves when given (else the ids of its `/v1/models`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineSpec {
    /// Which engine it is (decides the metric names and `/slots`).
    pub kind: EngineKind,
    /// Its base URL, without a trailing `/` (`http://` added when no scheme was given).
    pub base_url: String,
    /// The model it serves (`model=NAME`), when given.
    pub model: Option<String>,
}

impl fmt::Display for EngineSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.kind, self.base_url)?;
        match &self.model {
            Some(model) => write!(f, ",model={model}"),
            None => Ok(()),
        }
    }
}

impl FromStr for EngineSpec {
    type Err = String;

    /// `KIND=URL[,model=NAME]`. The URL is `HOST:PORT` or `http(s)://HOST:PORT[/PREFIX]`;
    /// options are comma-separated (so a model name cannot hold a comma).
    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let spec = spec.trim();
        let Some((kind, rest)) = spec.split_once('=') else {
            return Err(format!("engine `{spec}`: expected KIND=URL[,model=NAME] (e.g. llamacpp=127.0.0.1:8080)"));
        };
        let kind: EngineKind = kind.trim().parse().map_err(|e| format!("engine `{spec}`: {e}"))?;
        let mut parts = rest.split(',');
        let url = parts.next().unwrap_or_default().trim();
        if has_credentials(url) {
            // Not echoed: the message would show the password.
            return Err(format!(
                "engine `{kind}=…`: a URL with credentials (USER:PASSWORD@) is not supported: loadgate \
                 sends an engine no credentials, and its URL shows in logs and in a sidecar's /health"
            ));
        }
        let base_url = base_url(url).map_err(|e| format!("engine `{spec}`: {e}"))?;
        let mut model = None;
        for option in parts {
            let (key, value) = option.split_once('=').unwrap_or((option, ""));
            match key.trim() {
                "model" if model.is_some() => return Err(format!("engine `{spec}`: model= given twice")),
                "model" if value.trim().is_empty() => return Err(format!("engine `{spec}`: empty model name")),
                "model" => model = Some(value.trim().to_owned()),
                other => return Err(format!("engine `{spec}`: unknown option `{other}` (the only one is model=NAME)")),
            }
        }
        Ok(EngineSpec { kind, base_url, model })
    }
}

/// `url` as a base URL: `http://` added without a scheme, no trailing `/`;
/// only http (loadgate's HTTP client speaks no TLS: an https engine could
/// never be reached, so it is refused here rather than retried until the
/// start deadline), with a host, a port other than 0, no query or fragment.
fn base_url(url: &str) -> Result<String, String> {
    if url.trim_end_matches('/').is_empty() {
        return Err("empty URL".to_owned());
    }
    let full = with_scheme(url);
    let base = full.trim_end_matches('/').to_owned();
    let parsed = reqwest::Url::parse(&full).map_err(|e| format!("invalid URL `{url}`: {e}"))?;
    match parsed.scheme() {
        "http" => {}
        "https" => {
            return Err(format!(
                "URL `{url}`: https is not supported (loadgate talks plain HTTP to engines; give their http address)"
            ))
        }
        _ => return Err(format!("URL `{url}`: only http is supported")),
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(format!("URL `{url}` has no host"));
    }
    if parsed.port() == Some(0) {
        return Err(format!("URL `{url}` has port 0 (no engine listens there)"));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(format!("URL `{url}`: a base URL has no query or fragment"));
    }
    Ok(base)
}

/// `url` with `http://` added when it names no scheme.
fn with_scheme(url: &str) -> String {
    if url.contains("://") {
        url.to_owned()
    } else {
        format!("http://{url}")
    }
}

/// Whether `url` carries a user name or a password (`USER:PASSWORD@HOST`):
/// the HTTP client would send them as Basic auth, and every message that
/// names the URL (logs, scrape errors in a sidecar's unauthenticated
/// `/health`) would show them.
fn has_credentials(url: &str) -> bool {
    reqwest::Url::parse(&with_scheme(url))
        .is_ok_and(|parsed| !parsed.username().is_empty() || parsed.password().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(spec: &str) -> Result<EngineSpec, String> {
        spec.parse()
    }

    #[test]
    fn kind_url_and_model_are_read() {
        let spec = parse("llamacpp=127.0.0.1:8080").unwrap();
        assert_eq!(
            spec,
            EngineSpec { kind: EngineKind::LlamaCpp, base_url: "http://127.0.0.1:8080".into(), model: None }
        );
        let spec = parse(" vLLM=http://gpu-1:8000/prefix/,model=meta/llama-3 ").unwrap();
        assert_eq!(spec.kind, EngineKind::Vllm);
        assert_eq!(spec.base_url, "http://gpu-1:8000/prefix");
        assert_eq!(spec.model.as_deref(), Some("meta/llama-3"));
        assert_eq!(spec.to_string(), "vllm=http://gpu-1:8000/prefix,model=meta/llama-3");
        assert_eq!(parse("sglang=localhost:30000").unwrap().kind, EngineKind::Sglang);
        assert_eq!(parse("llama.cpp=h:1,model=models/tiny.gguf").unwrap().model.as_deref(), Some("models/tiny.gguf"));
    }

    #[test]
    fn mistakes_are_named() {
        for (spec, says) in [
            ("127.0.0.1:8080", "expected KIND=URL"),
            ("tgi=127.0.0.1:8080", "tgi=127.0.0.1:8080"),
            ("vllm=", "empty URL"),
            ("vllm=,model=m", "empty URL"),
            ("vllm=h:1,model=", "empty model name"),
            ("vllm=h:1,model=a,model=b", "given twice"),
            ("vllm=h:1,dp=2", "unknown option `dp`"),
            ("vllm=ftp://h:1", "only http is supported"),
            ("vllm=https://h:1", "https is not supported"),
            ("vllm=h:1/?x=1", "no query"),
            ("vllm=http://", "invalid URL"),
            // Never reachable: it was retried until the start deadline (60 s), then "did not answer".
            ("vllm=127.0.0.1:0", "port 0"),
            ("vllm=http://h:0/prefix", "port 0"),
        ] {
            let error = parse(spec).unwrap_err();
            assert!(error.contains(says), "{spec}: {error}");
        }
    }

    /// Found by a review: `vllm=http://user:secret@h:1` was taken; the
    /// HTTP client sent the pair as Basic auth (docs/engines.md: engines
    /// get no credentials), and the URL, password included, went into the
    /// logs and, through a failed scrape, into a sidecar's `/health`, which
    /// needs no proof. Now refused at start, without echoing the password.
    #[test]
    fn credentials_in_the_url_are_refused_unshown() {
        for spec in ["vllm=http://user:secret@h:1", "llamacpp=user:secret@127.0.0.1:8080", "sglang=http://secret@h:1/p"]
        {
            let error = parse(spec).unwrap_err();
            assert!(error.contains("credentials"), "{spec}: {error}");
            assert!(!error.contains("secret"), "{spec}: the password is shown: {error}");
        }
        assert!(parse("vllm=http://h:1/user@x").is_ok(), "an @ in the path is no credential");
    }
}
