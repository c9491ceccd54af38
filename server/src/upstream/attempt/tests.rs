//! One attempt against raw upstreams on 127.0.0.1.

use std::time::Duration;

use axum::body::Bytes;
use loadgate::engines::CompletionRoute;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::*;

/// An upstream that answers every connection's first request with `answer`
/// (raw bytes), then closes.
async fn raw_upstream(answer: &'static [u8]) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                // Up to the end of the request head (the body is small).
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = tcp.write_all(answer).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            });
        }
    });
    format!("http://{addr}")
}

const TIMEOUTS: Timeouts = Timeouts {
    connect: Duration::from_secs(2),
    first_byte: Duration::from_secs(5),
    between_chunks: Duration::from_secs(5),
};

async fn attempt_on(base: &str) -> Outcome {
    let client = crate::upstream::client(TIMEOUTS.connect).unwrap();
    let payload = Payload::new(CompletionRoute::Completions, Bytes::from_static(b"{}"));
    let request = client.post(format!("{base}/v1/completions"));
    attempt(request, &payload, false, TIMEOUTS, Peer::Engine, NoHold).await
}

struct NoHold;
impl Watcher for NoHold {}

/// A 101 (or any 1xx) as the final answer to a completion is no answer:
/// the client gets a 502 (`Cut`), never the 101.
#[tokio::test]
async fn an_informational_final_status_is_a_broken_answer() {
    let base = raw_upstream(b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: x\r\n\r\n").await;
    let outcome = attempt_on(&base).await;
    assert!(matches!(outcome, Outcome::Cut(Failure::Broken)), "{outcome:?}");
    assert_eq!(Failure::Broken.status(), StatusCode::BAD_GATEWAY);
}

/// An ordinary answer and a refusal, for contrast.
#[tokio::test]
async fn an_answer_is_relayed_and_a_refusal_is_recognised_by_its_header() {
    let ok = raw_upstream(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}").await;
    match attempt_on(&ok).await {
        Outcome::Answer(response) => {
            assert_eq!(response.status(), StatusCode::OK);
            let body = axum::body::to_bytes(response.into_body(), 1024).await.unwrap();
            assert_eq!(&body[..], b"{}");
        }
        other => panic!("{other:?}"),
    }
    let refusal =
        raw_upstream(b"HTTP/1.1 200 OK\r\nx-loadgate-refusal: worker-at-capacity\r\ncontent-length: 0\r\n\r\n").await;
    assert!(matches!(attempt_on(&refusal).await, Outcome::AtCapacity));
}
