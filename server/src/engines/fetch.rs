//! A bounded `GET` of one engine document (`/metrics`, `/slots`,
//! `/v1/models`): a success status, a body read chunk by chunk and refused
//! as soon as it passes its cap. Errors are one line naming the URL.

use std::error::Error as _;
use std::fmt;

/// A failed [`get_text`]: one line naming the URL, and the status when the
/// engine answered one that is not 2xx.
#[derive(Debug)]
pub(crate) struct FetchError {
    /// The engine's status, when that is what failed.
    pub status: Option<reqwest::StatusCode>,
    message: String,
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<String> for FetchError {
    fn from(message: String) -> Self {
        FetchError { status: None, message }
    }
}

/// `GET url`; its body as text when the status is 2xx and the body is at
/// most `limit` bytes of UTF-8. The caller bounds the time.
///
/// # Errors
///
/// A line naming `url` and what failed: the connection, the status, the
/// size or the encoding.
pub(crate) async fn get_text(client: &reqwest::Client, url: &str, limit: usize) -> Result<String, FetchError> {
    let mut response = client.get(url).send().await.map_err(|e| format!("GET {url}: {}", chain(&e.without_url())))?;
    let status = response.status();
    if !status.is_success() {
        return Err(FetchError { status: Some(status), message: format!("GET {url}: status {status}") });
    }
    if let Some(declared) = response.content_length().filter(|&n| n > limit as u64) {
        return Err(format!("GET {url}: body of {declared} bytes over the {limit}-byte limit").into());
    }
    let mut body = Vec::new();
    while let Some(chunk) =
        response.chunk().await.map_err(|e| format!("GET {url}: reading the body: {}", chain(&e.without_url())))?
    {
        if body.len() + chunk.len() > limit {
            return Err(format!("GET {url}: body over the {limit}-byte limit").into());
        }
        body.extend_from_slice(&chunk);
    }
    String::from_utf8(body).map_err(|e| format!("GET {url}: body is not UTF-8 ({e})").into())
}

/// `error` and its sources on one line (reqwest's own message alone says
/// only "error sending request").
pub(crate) fn chain(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(source) = next {
        let line = source.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        next = source.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::routing::get;
    use futures_util::stream;

    use super::*;

    /// Serves `/sized` (1000 bytes, with a length), `/chunked` (1000 bytes in
    /// 10 chunks, no length), `/status` (503) and `/latin1` (not UTF-8).
    async fn serve() -> (String, tokio::task::JoinHandle<()>) {
        let app = axum::Router::new()
            .route("/sized", get(|| async { "x".repeat(1000) }))
            .route(
                "/chunked",
                get(|| async {
                    let chunks = (0..10).map(|_| Ok::<_, std::io::Error>(vec![b'y'; 100]));
                    Body::from_stream(stream::iter(chunks))
                }),
            )
            .route("/status", get(|| async { (axum::http::StatusCode::SERVICE_UNAVAILABLE, "loading") }))
            .route("/latin1", get(|| async { vec![0xe9u8, b'a'] }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (format!("http://{addr}"), tokio::spawn(async move { axum::serve(listener, app).await.unwrap() }))
    }

    #[tokio::test]
    async fn bodies_are_capped_and_checked() {
        let (base, _server) = serve().await;
        let client = reqwest::Client::new();
        assert_eq!(get_text(&client, &format!("{base}/sized"), 1000).await.unwrap().len(), 1000);
        assert_eq!(get_text(&client, &format!("{base}/chunked"), 1000).await.unwrap().len(), 1000);
        let declared = get_text(&client, &format!("{base}/sized"), 999).await.unwrap_err().to_string();
        assert!(declared.contains("body of 1000 bytes over the 999-byte limit"), "{declared}");
        let streamed = get_text(&client, &format!("{base}/chunked"), 999).await.unwrap_err().to_string();
        assert!(streamed.contains("body over the 999-byte limit"), "{streamed}");
        let status = get_text(&client, &format!("{base}/status"), 1000).await.unwrap_err();
        assert_eq!(status.status, Some(reqwest::StatusCode::SERVICE_UNAVAILABLE));
        assert!(status.to_string().contains("/status: status 503"), "{status}");
        let latin1 = get_text(&client, &format!("{base}/latin1"), 1000).await.unwrap_err().to_string();
        assert!(latin1.contains("not UTF-8"), "{latin1}");
        // A refused connection names the URL once and the cause.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let refused = get_text(&client, &format!("http://{closed}/metrics"), 1000).await.unwrap_err().to_string();
        assert!(refused.starts_with(&format!("GET http://{closed}/metrics: ")), "{refused}");
        assert_eq!(refused.matches(&closed.to_string()).count(), 1, "{refused}");
    }
}
