//! Big bodies: concurrent huge bodies, trickling declared bodies and
//! refused bodies against the body limit and budget.

use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::AsyncWriteExt as _;

use crate::common::{self, exclusive, register, EventConn, FakeWorker, SECRET};
use crate::{pool, serve_many, MAX_RSS_MIB, MODEL};

/// 8 concurrent 150 MiB bodies: the frontend's peak RSS (VmHWM) stays under
/// 2 GiB, each big request gets a real answer (served, 413, or 503 from the
/// body budget), and a normal request is served during and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_150_mib_bodies_stay_under_2_gib() {
    let _box = exclusive().await;
    // The sink's event connection sends nothing after its Register.
    let (fe, _w) = pool(&["--event-idle-timeout-ms", "600000", "--event-silence-ms", "600000"], &[]).await;
    // The big bodies go to a fake worker that reads and drops them (a debug
    // build of the real one would spend most of the test parsing 900 MiB of
    // JSON); the normal requests go to the real worker.
    let sink = FakeWorker::start();
    let mut sink_conn = EventConn::authenticated(fe.events, SECRET);
    sink_conn.send(&register(5150, 1, 1, "big-model", &sink.addr.to_string())).unwrap();
    fe.wait_workers(2, Duration::from_secs(5)).await;
    const SIZE: usize = 150 << 20;
    let head = r#"{"model":"big-model","prompt":"hello","max_tokens":1,"pad":""#;
    let mut body = Vec::with_capacity(SIZE);
    body.extend_from_slice(head.as_bytes());
    body.resize(SIZE - 2, b'a');
    body.extend_from_slice(b"\"}");
    let body = Bytes::from(body);
    let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let started = Instant::now();
    let big: Vec<_> = (0..8)
        .map(|_| {
            let (client, url, body) = (client.clone(), format!("{}/v1/completions", fe.http), body.clone());
            tokio::spawn(async move {
                let sent = client.post(url).header("content-type", "application/json").body(body).send().await;
                let at = started.elapsed();
                match sent {
                    Ok(response) => {
                        let status = response.status().as_u16();
                        let text = response.text().await.unwrap_or_default();
                        (status, text.chars().take(200).collect::<String>(), at)
                    }
                    Err(e) => (0, format!("{e:?}"), at),
                }
            })
        })
        .collect();
    // A normal request while the big ones are in flight.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let during = Instant::now();
    let (status, text) = fe.complete(MODEL).await;
    let during = during.elapsed();
    let mut peak = fe.mem();
    let mut outcomes = Vec::new();
    for task in big {
        outcomes.push(task.await.expect("big request task"));
        peak = fe.mem();
    }
    eprintln!("a normal request during the big bodies: {status} after {during:?}");
    for (status, text, at) in &outcomes {
        eprintln!("  150 MiB body: {status} after {at:?}: {text}");
    }
    eprintln!(
        "8 x 150 MiB bodies in {:?}: frontend VmHWM {:.0} MiB, VmRSS after {:.0} MiB",
        started.elapsed(),
        peak.hwm_mib(),
        peak.rss_mib()
    );
    assert_eq!(status, 200, "a normal request during the big bodies: {text}");
    assert!(peak.hwm_mib() < 2048.0, "frontend peak RSS {:.0} MiB >= 2 GiB", peak.hwm_mib());
    for (status, text, _) in &outcomes {
        assert!(matches!(status, 200 | 503), "a big request got no real answer: {status} {text}");
    }
    let served = outcomes.iter().filter(|o| o.0 == 200).count();
    eprintln!("the sink received {} requests, {:.0} MiB", sink.requests(), sink.bytes() as f64 / f64::from(1 << 20));
    // As many as the default budget (1024 MiB) holds at once are served:
    // bodies that grow together past the budget refuse the youngest only.
    if !common::legacy() {
        let fit = 1024 / (SIZE >> 20);
        assert!(served >= fit, "only {served} of 8 bodies served; {fit} fit in the budget: {outcomes:?}");
    }
    // Each served body reached the worker whole (heads are on top).
    assert_eq!(sink.requests(), served, "the sink's requests are the served bodies");
    assert!(sink.bytes() >= (served * SIZE) as u64, "the served bodies reached the worker whole");
    assert!(sink.bytes() < (served * (SIZE + 64 * 1024)) as u64, "the sink received more than the served bodies");
    drop(sink_conn);
    fe.assert_still_serving(MODEL, 2048.0).await;
}

/// A slow-body attack: connections that declare the largest body
/// (192 MiB) and trickle bytes used to reserve their whole `Content-Length`
/// at once, so a few of them held the body budget and the frontend answered
/// 503 to everyone's POST. Now a body holds what it has sent (at most twice,
/// at least 64 KiB): with 6 such connections open, a normal request and a
/// 96 MiB body are served. The budget still refuses when real bytes fill it
/// (a body past the small bodies' lane; a small one is still served).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickling_big_declared_bodies_do_not_hold_the_budget() {
    let _box = exclusive().await;
    // The sink's event connection sends nothing after its Register.
    let (fe, _w) = pool(&["--event-idle-timeout-ms", "600000", "--event-silence-ms", "600000"], &[]).await;
    let sink = FakeWorker::start();
    let mut sink_conn = EventConn::authenticated(fe.events, SECRET);
    sink_conn.send(&register(5196, 1, 1, "big-model", &sink.addr.to_string())).unwrap();
    fe.wait_workers(2, Duration::from_secs(5)).await;
    let http = fe.http.trim_start_matches("http://").to_owned();
    let mut tricklers = Vec::new();
    for _ in 0..6 {
        tricklers.push(open_body(&http, 192 << 20, b"{").await);
    }
    let trickle = async {
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            for conn in &mut tricklers {
                conn.write_all(b" ").await.expect("the frontend keeps reading a trickling body");
            }
        }
    };
    let served = async {
        let normal = serve_many(&fe, MODEL, 3).await;
        let big = big_request(&fe.client, &fe.http, 96 << 20).await;
        (normal, big)
    };
    let ((), (normal, big)) = tokio::join!(trickle, served);
    eprintln!("with 6 trickling 192 MiB bodies open: 3 normal requests {normal:?}, a 96 MiB body {big}");
    assert_eq!(normal.ok, 3, "normal requests while bodies trickle: {normal:?}");
    assert_eq!(big, 200, "a 96 MiB body while 6 x 192 MiB declared bodies trickle");
    drop(tricklers);
    drop(sink_conn);

    // Real bytes still fill the budget: 8 MiB sent (of 16 declared) on one
    // connection fill --http-body-budget-mb 8, and the next body past the
    // small bodies' lane (64 KiB) is refused.
    const PAST_LANE: usize = 128 << 10;
    let (small, _w2) = pool(&["--http-body-budget-mb", "8"], &[]).await;
    let small_http = small.http.trim_start_matches("http://").to_owned();
    let mut filler = open_body(&small_http, 16 << 20, &vec![b' '; 8 << 20]).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    let refused = loop {
        let (status, body) = padded_request(&small.client, &small.http, MODEL, PAST_LANE).await;
        if status == 503 || Instant::now() >= deadline {
            break (status, body);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("with 8 MiB of real bytes buffered under an 8 MiB budget: {refused:?}");
    assert_eq!(refused.0, 503, "the budget did not refuse: {}", refused.1);
    assert!(refused.1.contains("too many request bodies"), "{}", refused.1);
    assert!(small.proc.wait_log("limit hit: --http-body-budget-mb 8", Duration::from_secs(2)), "no limit log line");
    let (status, body) = small.complete(MODEL).await;
    assert_eq!(status, 200, "a small request past a full budget (its own lane): {body}");
    filler.write_all(b" ").await.ok();
    drop(filler);
    // Given back when the connection goes: served again.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, body) = padded_request(&small.client, &small.http, MODEL, PAST_LANE).await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the budget was not given back: {status} {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    small.assert_still_serving(MODEL, MAX_RSS_MIB).await;
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}

/// A raw connection to `addr` (HOST:PORT) that sent a completion head
/// declaring `declared` bytes and then `first` of them.
async fn open_body(addr: &str, declared: usize, first: &[u8]) -> tokio::net::TcpStream {
    let mut conn = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        .await
        .expect("connect within 2 s")
        .expect("connect");
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {declared}\r\n\r\n"
    );
    let send = async {
        conn.write_all(head.as_bytes()).await?;
        conn.write_all(first).await
    };
    tokio::time::timeout(Duration::from_secs(10), send).await.expect("sent within 10 s").expect("send");
    conn
}

/// POSTs a `size`-byte completion for `big-model`; its status (0: no answer).
async fn big_request(client: &reqwest::Client, base: &str, size: usize) -> u16 {
    padded_request(client, base, "big-model", size).await.0
}

/// A completion of `model` whose body is `size` bytes (padded): its status
/// (0 if it failed) and body.
async fn padded_request(client: &reqwest::Client, base: &str, model: &str, size: usize) -> (u16, String) {
    let head = format!(r#"{{"model":"{model}","prompt":"hello","max_tokens":1,"pad":""#);
    let mut body = Vec::with_capacity(size);
    body.extend_from_slice(head.as_bytes());
    body.resize(size - 2, b'a');
    body.extend_from_slice(b"\"}");
    let sent = client.post(format!("{base}/v1/completions")).header("content-type", "application/json").body(body);
    match sent.timeout(Duration::from_secs(60)).send().await {
        Ok(response) => (response.status().as_u16(), response.text().await.unwrap_or_default()),
        Err(e) => (0, format!("{e:?}")),
    }
}

/// A body refused before it is read (413 over the limit, 503 over the
/// budget) must still reach the client as that answer, not as a reset
/// connection while it is still sending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_big_bodies_get_their_answer() {
    let _box = exclusive().await;
    let (fe, _w) = pool(&["--http-body-budget-mb", "64", "--http-body-limit-mb", "160"], &[]).await;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let mut outcomes = Vec::new();
    for (size, expected) in [(100usize << 20, 503u16), (170 << 20, 413)] {
        let body = Bytes::from(vec![b' '; size]);
        for _ in 0..4 {
            let sent = client
                .post(format!("{}/v1/completions", fe.http))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await;
            let got = match sent {
                Ok(response) => response.status().as_u16(),
                Err(e) => {
                    eprintln!("  {} MiB body: no answer: {e:?}", size >> 20);
                    0
                }
            };
            outcomes.push((size >> 20, expected, got));
        }
    }
    eprintln!("refused big bodies (MiB, expected, got): {outcomes:?}");
    let lost = outcomes.iter().filter(|(_, expected, got)| expected != got).count();
    assert_eq!(lost, 0, "{lost} of {} refused bodies got no answer: {outcomes:?}", outcomes.len());
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}

/// Found by a review: a worker that refuses at its cap as soon as it has
/// read a request's head, without reading its body, and keeps the
/// connection open, kept the body's share of the body budget after the
/// client had its answer: the frontend's HTTP client was still writing the
/// body to it, holding the body, until the worker closed the connection.
/// Now a refusal takes the body back (the worker did not run it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_before_the_body_was_read_gives_the_budget_back() {
    let _box = exclusive().await;
    let fe = common::Frontend::secured(&[
        "--http-body-budget-mb",
        "32",
        "--event-idle-timeout-ms",
        "600000",
        "--event-silence-ms",
        "600000",
    ]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tokio::io::AsyncReadExt::read(&mut tcp, &mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let refusal: &[u8] = b"HTTP/1.1 529 Overloaded\r\nx-loadgate-refusal: worker-at-capacity\r\n\
                    content-length: 0\r\n\r\n";
                let _ = tcp.write_all(refusal).await;
                // Holds the connection, reading nothing more.
                tokio::time::sleep(Duration::from_secs(30)).await;
            });
        }
    });
    let mut conn = EventConn::authenticated(fe.events, SECRET);
    conn.send(&register(5240, 1, 1, "big-model", &addr.to_string())).unwrap();
    fe.wait_workers(1, Duration::from_secs(5)).await;
    // 24 MiB of 32: a second big body fits only once the first is given back.
    const SIZE: usize = 24 << 20;
    let (status, body) = padded_request(&fe.client, &fe.http, "big-model", SIZE).await;
    assert_eq!(status, 529, "every worker refused: {body}");
    // Margin: the refuser holds the connection for 30 s; a body given back
    // is at once.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    let last = loop {
        // 12 MiB: past what is left of the budget while the first is held.
        let (status, body) = padded_request(&fe.client, &fe.http, "big-model", 12 << 20).await;
        seen.push(status);
        if status != 503 || Instant::now() >= deadline || seen.len() >= 20 {
            break (status, body);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(last.0, 529, "the refused body still holds the budget (statuses {seen:?}): {}", last.1);
    drop(conn);
}
