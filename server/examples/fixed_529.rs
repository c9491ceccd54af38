//! The reject-path baseline: a bare axum server that answers
//! `POST /v1/chat/completions` with the frontend's overload reply, fixed:
//! 529 with the reason phrase `Overloaded`, `Retry-After: 1` and the same JSON body, without looking at the
//! request (it only reads the body, as the frontend's handler does).
//!
//! Served like the frontend (multi-threaded runtime, `TCP_NODELAY` on every
//! connection). Prints `listening http=HOST:PORT`. Used by
//! `benches/reject_path/run.py`.
//!
//! ```sh
//! cargo run --release -p loadgate-server --example fixed_529 -- --http-port 0
//! ```

use std::io::Write;

use axum::body::Bytes;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::serve::ListenerExt;
use clap::Parser;

/// The frontend's overload body (`reply::overloaded`), byte for byte.
const BODY: &str =
    r#"{"error":{"message":"All workers are busy, please retry later","type":"Overloaded","param":null,"code":529}}"#;

/// Command-line arguments.
#[derive(Debug, Parser)]
struct Args {
    /// Port on 127.0.0.1 (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    http_port: u16,
}

/// The fixed overload reply.
async fn overloaded(_body: Bytes) -> Response {
    let status = StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let mut response = (status, BODY).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    headers.insert("retry-after-ms", HeaderValue::from_static("1000"));
    // The frontend's status line too: `HTTP/1.1 529 Overloaded`.
    response.extensions_mut().insert(hyper::ext::ReasonPhrase::from_static(b"Overloaded"));
    response
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.http_port)).await?;
    println!("listening http={}", listener.local_addr()?);
    std::io::stdout().flush()?;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let app = axum::Router::new().route("/v1/chat/completions", post(overloaded));
    axum::serve(listener, app).await?;
    Ok(())
}
