//! The HTTP server's own tests: real sockets on 127.0.0.1.

use std::io::{Read as _, Write as _};
use std::time::Instant;

use super::limits::default_max_connections;
use super::*;

/// `/` answers "ok"; `/slow` streams 8 chunks 100 ms apart, then "end".
fn router() -> Router {
    let slow = || async {
        let chunks = futures_util::stream::unfold(0u32, |i| async move {
            match i {
                0..8 => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Some((Ok::<_, std::convert::Infallible>(bytes::Bytes::from("chunk\n")), i + 1))
                }
                8 => Some((Ok(bytes::Bytes::from("end")), i + 1)),
                _ => None,
            }
        });
        axum::body::Body::from_stream(chunks)
    };
    Router::new().route("/", axum::routing::get(|| async { "ok" })).route("/slow", axum::routing::get(slow))
}

async fn spawn_server(config: ServeConfig) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (addr, tokio::spawn(serve(listener, router(), config)))
}

/// Reads one `GET /` answer ("ok", content-length 2) off a keep-alive connection.
fn read_ok(stream: &mut std::net::TcpStream) -> String {
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !seen.ends_with(b"\r\n\r\nok") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&seen).into_owned()
}

fn connect(addr: std::net::SocketAddr) -> std::net::TcpStream {
    std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap()
}

const GET: &[u8] = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n";
/// How `/slow`'s chunked answer ends.
const SLOW_END: &str = "3\r\nend\r\n0\r\n\r\n";
const GET_SLOW: &[u8] = b"GET /slow HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_at_the_idle_timeout_and_a_long_response_is_not() {
    let config = ServeConfig { idle_timeout: Duration::from_millis(300), ..ServeConfig::plain() };
    let (addr, server) = spawn_server(config).await;
    let (kept, fresh, slow) = tokio::task::spawn_blocking(move || {
        let mut kept = connect(addr);
        kept.write_all(GET).unwrap();
        let first = read_ok(&mut kept);
        assert!(first.starts_with("HTTP/1.1 200"), "{first:?}");
        // Used again within the timeout: it stays open.
        std::thread::sleep(Duration::from_millis(150));
        kept.write_all(GET).unwrap();
        let second = read_ok(&mut kept);
        assert!(second.starts_with("HTTP/1.1 200"), "{second:?}");
        let idle_from = Instant::now();
        let (_, closed) = read_to_close(&mut kept, Duration::from_secs(5));
        let kept = (closed, idle_from.elapsed());
        // A connection that never sends anything is idle too.
        let started = Instant::now();
        let mut fresh = connect(addr);
        let (_, closed) = read_to_close(&mut fresh, Duration::from_secs(5));
        let fresh = (closed, started.elapsed());
        // A response streaming for 0.8 s (past the idle timeout) is busy, not idle.
        let mut slow = connect(addr);
        slow.write_all(GET_SLOW).unwrap();
        let (seen, closed) = read_to_close(&mut slow, Duration::from_secs(5));
        (kept, fresh, (String::from_utf8_lossy(&seen).into_owned(), closed))
    })
    .await
    .unwrap();
    assert!(kept.0 && fresh.0, "idle connections are closed");
    for elapsed in [kept.1, fresh.1] {
        assert!(elapsed >= Duration::from_millis(250) && elapsed < Duration::from_secs(3), "{elapsed:?}");
    }
    assert!(slow.1 && slow.0.ends_with(SLOW_END), "the streamed response completes whole: {:?}", slow.0);
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_connection_is_closed_at_the_idle_timeout_with_a_goaway() {
    let config = ServeConfig { idle_timeout: Duration::from_millis(300), ..ServeConfig::plain() };
    let (addr, server) = spawn_server(config).await;
    let (seen, closed, took) = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let mut stream = connect(addr);
        // The HTTP/2 preface and an empty SETTINGS frame, then nothing.
        stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
        stream.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).unwrap();
        let (seen, closed) = read_to_close(&mut stream, Duration::from_secs(5));
        (seen, closed, started.elapsed())
    })
    .await
    .unwrap();
    assert!(closed, "an idle HTTP/2 connection is closed");
    assert!(took >= Duration::from_millis(250) && took < Duration::from_secs(3), "{took:?}");
    // Frames: 3-byte length, 1-byte type; GOAWAY is type 7.
    let mut at = 0;
    let mut goaway = false;
    while at + 9 <= seen.len() {
        let length = (usize::from(seen[at]) << 16) | (usize::from(seen[at + 1]) << 8) | usize::from(seen[at + 2]);
        goaway |= seen[at + 3] == 7;
        at += 9 + length;
    }
    assert!(goaway, "closed gracefully with a GOAWAY: {seen:?}");
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_limit_the_idle_connection_unused_longest_is_closed_for_a_new_one() {
    let config = ServeConfig { max_connections: 3, ..ServeConfig::plain() };
    let (addr, server) = spawn_server(config).await;
    let outcome = tokio::task::spawn_blocking(move || {
        let mut oldest = connect(addr);
        std::thread::sleep(Duration::from_millis(50));
        let mut used = connect(addr);
        std::thread::sleep(Duration::from_millis(50));
        let mut fresh = connect(addr);
        std::thread::sleep(Duration::from_millis(50));
        // `used` serves a request: now `oldest` is idle longest, then `fresh`.
        used.write_all(GET).unwrap();
        assert!(read_ok(&mut used).starts_with("HTTP/1.1 200"));
        let started = Instant::now();
        let mut newcomer = connect(addr);
        newcomer.write_all(GET).unwrap();
        let answer = read_ok(&mut newcomer);
        let answered_in = started.elapsed();
        let (_, oldest_closed) = read_to_close(&mut oldest, Duration::from_secs(2));
        let (_, fresh_closed) = read_to_close(&mut fresh, Duration::from_millis(200));
        used.write_all(GET).unwrap();
        let used_again = read_ok(&mut used);
        (answer, answered_in, oldest_closed, fresh_closed, used_again)
    })
    .await
    .unwrap();
    let (answer, answered_in, oldest_closed, fresh_closed, used_again) = outcome;
    assert!(answer.starts_with("HTTP/1.1 200"), "the new connection is served: {answer:?}");
    assert!(answered_in < Duration::from_secs(1), "{answered_in:?}");
    assert!(oldest_closed, "the idle connection unused longest is closed");
    assert!(!fresh_closed, "only one connection is closed");
    assert!(used_again.starts_with("HTTP/1.1 200"), "{used_again:?}");
    server.abort();
}

/// One byte on every connection (a request that never comes) holds the
/// slots only for the sent-bytes grace: then a new `GET` is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_send_one_byte_cannot_hold_the_limit() {
    let config = ServeConfig { max_connections: 3, ..ServeConfig::plain() };
    let (addr, server) = spawn_server(config).await;
    let answer = tokio::task::spawn_blocking(move || {
        let mut holders: Vec<_> = (0..3).map(|_| connect(addr)).collect();
        for stream in &mut holders {
            stream.write_all(b"G").unwrap();
        }
        std::thread::sleep(connection::SENT_GRACE + Duration::from_millis(300));
        let mut probe = connect(addr);
        probe.write_all(GET).unwrap();
        let answer = read_ok(&mut probe);
        drop(holders);
        answer
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "served past the one-byte holders: {answer:?}");
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_limit_with_every_connection_busy_a_new_one_is_closed_at_once() {
    let config = ServeConfig { max_connections: 2, ..ServeConfig::plain() };
    let (addr, server) = spawn_server(config).await;
    let (refused, slow) = tokio::task::spawn_blocking(move || {
        let mut busy: Vec<_> = (0..2).map(|_| connect(addr)).collect();
        for stream in &mut busy {
            stream.write_all(GET_SLOW).unwrap();
        }
        std::thread::sleep(Duration::from_millis(150));
        let started = Instant::now();
        let mut refused = connect(addr);
        let _ = refused.write_all(GET);
        let (seen, closed) = read_to_close(&mut refused, Duration::from_secs(2));
        let refused = (seen.is_empty(), closed, started.elapsed());
        let slow: Vec<_> = busy
            .iter_mut()
            .map(|s| String::from_utf8_lossy(&read_to_close(s, Duration::from_secs(5)).0).into_owned())
            .collect();
        (refused, slow)
    })
    .await
    .unwrap();
    assert!(refused.0 && refused.1, "closed without an answer: {refused:?}");
    assert!(refused.2 < Duration::from_millis(500), "{:?}", refused.2);
    assert!(slow.iter().all(|s| s.ends_with(SLOW_END)), "busy responses are untouched: {slow:?}");
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_lets_in_flight_responses_finish_and_refuses_new_connections() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_until(
        listener,
        router(),
        ServeConfig::plain(),
        async {
            let _ = stopped.await;
        },
        Duration::from_secs(5),
    ));
    let (mut slow, mut idle) = tokio::task::spawn_blocking(move || {
        let mut slow = connect(addr);
        slow.write_all(GET_SLOW).unwrap();
        let mut idle = connect(addr);
        idle.write_all(GET).unwrap();
        assert!(read_ok(&mut idle).starts_with("HTTP/1.1 200"));
        std::thread::sleep(Duration::from_millis(150));
        (slow, idle)
    })
    .await
    .unwrap();
    let started = Instant::now();
    stop.send(()).unwrap();
    let (slow, refused, last) = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_millis(50));
        let refused = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err();
        // An idle keep-alive connection may carry one more request, then closes.
        idle.write_all(GET).unwrap();
        let (last, _) = read_to_close(&mut idle, Duration::from_secs(5));
        let (seen, closed) = read_to_close(&mut slow, Duration::from_secs(5));
        ((String::from_utf8_lossy(&seen).into_owned(), closed), refused, String::from_utf8_lossy(&last).into_owned())
    })
    .await
    .unwrap();
    let drained = tokio::time::timeout(Duration::from_secs(7), server).await.unwrap().unwrap();
    assert!(refused, "new connections are refused once the drain starts");
    assert!(slow.1 && slow.0.ends_with(SLOW_END), "the in-flight response completes: {:?}", slow.0);
    assert!(last.starts_with("HTTP/1.1 200"), "{last:?}");
    assert!(drained.settled && drained.cut == 0, "{drained:?}");
    assert_eq!(drained.busy_at_stop, 1, "{drained:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
}

/// Reads until EOF (or `within`); returns what arrived and whether the
/// peer closed.
fn read_to_close(stream: &mut std::net::TcpStream, within: Duration) -> (Vec<u8>, bool) {
    stream.set_read_timeout(Some(within)).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return (seen, true),
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return (seen, false),
            Err(_) => return (seen, true),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_plain_http() {
    let (addr, server) = spawn_server(ServeConfig::plain()).await;
    let answer = tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").unwrap();
        read_to_close(&mut stream, Duration::from_secs(5))
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&answer.0).into_owned();
    assert!(text.starts_with("HTTP/1.1 200") && text.ends_with("ok"), "{text:?}");
    assert!(answer.1, "connection: close is honoured");
    server.abort();
}

#[test]
fn the_defaults_are_30_s_header_60_s_idle_and_the_file_limit() {
    let config = ServeConfig::plain();
    assert_eq!(config.header_read_timeout, Duration::from_secs(30));
    assert_eq!(config.idle_timeout, Duration::from_secs(60));
    assert_eq!(config.max_connections, default_max_connections());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_head_is_closed_after_the_timeout() {
    let config = ServeConfig { header_read_timeout: Duration::from_millis(300), ..ServeConfig::plain() };
    let (addr, server) = spawn_server(config).await;
    let (stalled, served) = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let mut stalled = std::net::TcpStream::connect(addr).unwrap();
        // Half a request head, then nothing.
        stalled.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nx-slow: ").unwrap();
        let (_, closed) = read_to_close(&mut stalled, Duration::from_secs(5));
        let stalled = (closed, started.elapsed());
        // A prompt client on another connection is served meanwhile and after.
        let mut prompt = std::net::TcpStream::connect(addr).unwrap();
        prompt.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").unwrap();
        (stalled, read_to_close(&mut prompt, Duration::from_secs(5)))
    })
    .await
    .unwrap();
    assert!(stalled.0, "a stalled request head must be closed");
    assert!(stalled.1 >= Duration::from_millis(250) && stalled.1 < Duration::from_secs(4), "{:?}", stalled.1);
    assert!(String::from_utf8_lossy(&served.0).starts_with("HTTP/1.1 200"), "{:?}", served.0);
    assert!(!server.is_finished(), "the accept loop keeps running");
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_tls_handshake_is_dropped_after_the_timeout() {
    let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let dir = std::env::temp_dir().join(format!("loadgate-http-server-{}-{}", std::process::id(), fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, generated.cert.pem()).unwrap();
    std::fs::write(&key, generated.key_pair.serialize_pem()).unwrap();
    let tls = Tls::load(&cert, &key).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let config =
        ServeConfig { tls_handshake_timeout: Duration::from_millis(200), tls: Some(tls), ..ServeConfig::plain() };
    let (addr, server) = spawn_server(config).await;
    let (stalled, garbage) = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let mut stalled = std::net::TcpStream::connect(addr).unwrap();
        let (_, closed) = read_to_close(&mut stalled, Duration::from_secs(5));
        let stalled = (closed, started.elapsed());
        let mut plain = std::net::TcpStream::connect(addr).unwrap();
        plain.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
        let (seen, closed) = read_to_close(&mut plain, Duration::from_secs(5));
        (stalled, (seen, closed))
    })
    .await
    .unwrap();
    assert!(stalled.0, "a stalled handshake must be dropped");
    assert!(stalled.1 >= Duration::from_millis(150) && stalled.1 < Duration::from_secs(4), "{:?}", stalled.1);
    assert!(garbage.1, "plain HTTP on a TLS port is closed");
    assert!(!String::from_utf8_lossy(&garbage.0).contains("HTTP/"), "no HTTP answer in clear");
    assert!(!server.is_finished(), "the accept loop keeps running");
    server.abort();
}

/// A client that stops reading an endless response has its connection
/// closed at the write timeout and the body dropped (what it held is given
/// back); one that keeps reading slowly is never cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cut_at_the_write_timeout_and_a_slow_reader_is_not() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Counts the endless bodies alive.
    struct Alive(Arc<AtomicUsize>);
    impl Drop for Alive {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let alive = Arc::new(AtomicUsize::new(0));
    let counter = alive.clone();
    // 4 KiB chunks every millisecond, at most 10,000 of them (40 MiB, 10 s).
    let endless = move || {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            let guard = Alive(counter);
            let chunks = futures_util::stream::unfold((0u32, guard), |(i, guard)| async move {
                (i < 10_000).then_some(())?;
                tokio::time::sleep(Duration::from_millis(1)).await;
                Some((Ok::<_, std::convert::Infallible>(bytes::Bytes::from(vec![b'x'; 4096])), (i + 1, guard)))
            });
            axum::body::Body::from_stream(chunks)
        }
    };
    let app = Router::new().route("/endless", axum::routing::get(endless));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Margin: the stalled client is cut within 0.4 s + one check; the slow
    // reader takes 8 KiB every 50 ms, so hyper polls its body at least every
    // few tens of ms, 8x inside the deadline even on a busy machine.
    let config = ServeConfig { write_timeout: Duration::from_millis(400), ..ServeConfig::plain() };
    let server = tokio::spawn(serve(listener, app, config));
    let (stalled, slow) = tokio::task::spawn_blocking(move || {
        let small = || {
            let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            socket.set_recv_buffer_size(4096).unwrap();
            socket.connect_timeout(&addr.into(), Duration::from_secs(2)).unwrap();
            let mut stream: std::net::TcpStream = socket.into();
            stream.write_all(b"GET /endless HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
            stream
        };
        let started = Instant::now();
        let mut stalled = small();
        // Never read; then see whether the connection was closed.
        std::thread::sleep(Duration::from_millis(1500));
        let (_, closed) = read_to_close(&mut stalled, Duration::from_secs(5));
        let stalled = (closed, started.elapsed());
        let mut slow = small();
        slow.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = vec![0u8; 8192];
        let mut read = 0usize;
        let until = Instant::now() + Duration::from_millis(1600);
        let mut cut = false;
        while Instant::now() < until {
            match slow.read(&mut buf) {
                Ok(0) | Err(_) => {
                    cut = true;
                    break;
                }
                Ok(n) => read += n,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        (stalled, (cut, read))
    })
    .await
    .unwrap();
    assert!(stalled.0, "a client that never reads is cut");
    assert!(!slow.0 && slow.1 > 64 * 1024, "a slow reader is never cut: {slow:?}");
    // The stalled body was dropped (the slow one too, once its client went).
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive.load(std::sync::atomic::Ordering::SeqCst) != 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(alive.load(std::sync::atomic::Ordering::SeqCst), 0, "every body was dropped");
    server.abort();
}

/// A finished response leaves nothing owed: a keep-alive connection that
/// has read its answers whole stays open past the write timeout (only the
/// idle timeout closes it), over HTTP/1.1 and HTTP/2 alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_read_everything_is_not_cut_for_write_progress() {
    let config = ServeConfig {
        write_timeout: Duration::from_millis(200),
        idle_timeout: Duration::from_secs(30),
        ..ServeConfig::plain()
    };
    let (addr, server) = spawn_server(config).await;
    let (kept, h2) = tokio::task::spawn_blocking(move || {
        let mut kept = connect(addr);
        kept.write_all(GET).unwrap();
        assert!(read_ok(&mut kept).starts_with("HTTP/1.1 200"));
        // Five write timeouts with nothing owed.
        std::thread::sleep(Duration::from_millis(1000));
        kept.write_all(GET).unwrap();
        let again = read_ok(&mut kept);
        // HTTP/2: the preface, an empty SETTINGS, then nothing for as long.
        let mut h2 = connect(addr);
        h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
        h2.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).unwrap();
        let (_, closed) = read_to_close(&mut h2, Duration::from_millis(1000));
        (again, closed)
    })
    .await
    .unwrap();
    assert!(kept.starts_with("HTTP/1.1 200"), "the kept-alive connection still serves: {kept:?}");
    assert!(!h2, "an HTTP/2 connection with nothing owed stays open");
    server.abort();
}

/// The HTTP/2 stream limit reaches the peer in the server's SETTINGS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_peers_learn_the_stream_limit() {
    let config = ServeConfig { http2_max_concurrent_streams: 7, ..ServeConfig::plain() };
    let (addr, server) = spawn_server(config).await;
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.unwrap();
    let driver = tokio::spawn(connection);
    // The server's SETTINGS come with its first frames; a request makes sure they arrived.
    let mut send = send.ready().await.unwrap();
    let (response, _) = send.send_request(axum::http::Request::get("http://x/").body(()).unwrap(), true).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(5), response).await.unwrap().unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(send.current_max_send_streams(), 7);
    driver.abort();
    server.abort();
}

/// `--http-write-timeout-secs` and the HTTP/2 flags; unset, the write
/// timeout is the role's default. (Its variable is read by the real-process
/// attack tests, `attacks/write_progress.rs`.)
#[test]
fn the_write_timeout_defaults_per_role() {
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        http: HttpArgs,
    }
    let parse = |args: &[&str]| Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied())).map(|c| c.http);
    let default = parse(&[]).unwrap();
    assert_eq!(ServeConfig::from_args(&default, WRITE_TIMEOUT, None).write_timeout, Duration::from_secs(30));
    let worker = ServeConfig::from_args(&default, WRITE_TIMEOUT + Duration::from_secs(5), None);
    assert_eq!(worker.write_timeout, Duration::from_secs(35));
    assert_eq!((worker.http2_max_concurrent_streams, worker.http2_keepalive_interval), (100, Duration::from_secs(20)));
    let set = parse(&["--http-write-timeout-secs", "2", "--http2-max-concurrent-streams", "8"]).unwrap();
    let config = ServeConfig::from_args(&set, WRITE_TIMEOUT, None);
    assert_eq!((config.write_timeout, config.http2_max_concurrent_streams), (Duration::from_secs(2), 8));
    assert!(parse(&["--http-write-timeout-secs", "0"]).is_err(), "0 would cut every response");
    assert!(parse(&["--http-write-timeout-secs", "86401"]).is_err(), "at most a day");
    assert!(parse(&["--http2-max-concurrent-streams", "0"]).is_err());
}
