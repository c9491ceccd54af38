//! Admin on the public port: the inference port does not serve
//! `/busy_threshold`.

use serde_json::{json, Value};

use crate::common::shared;
use crate::{pool, MAX_RSS_MIB, MODEL};

/// Found 3: anyone on the inference port could POST /busy_threshold. Now
/// the inference port answers 404 for it (GET and POST) and the thresholds,
/// read on the admin listener, are unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_calls_on_the_inference_port_get_404() {
    let _box = shared().await;
    let (fe, _w) = pool(&["--active-decode-blocks-threshold", "0.5"], &[]).await;
    let get = fe.client.get(format!("{}/busy_threshold", fe.http)).send().await.unwrap();
    assert_eq!(get.status(), 404, "GET /busy_threshold on the inference port");
    for body in [
        json!({"model": MODEL, "active_decode_blocks_threshold": null}),
        json!({"model": MODEL, "active_decode_blocks_threshold": 0.0}),
        json!({"model": MODEL}),
    ] {
        let post = fe.client.post(format!("{}/busy_threshold", fe.http)).json(&body).send().await.unwrap();
        assert_eq!(post.status(), 404, "POST /busy_threshold {body} on the inference port");
    }
    let admin = fe.admin.as_deref().expect("an admin listener");
    assert_ne!(admin, fe.http, "the admin listener is not the inference port");
    assert!(admin.starts_with("http://127.0.0.1:"), "admin listens on loopback by default: {admin}");
    let read: Value = fe.client.get(format!("{admin}/busy_threshold")).send().await.unwrap().json().await.unwrap();
    let ours = read["thresholds"]
        .as_array()
        .and_then(|all| all.iter().find(|t| t["model"] == MODEL))
        .unwrap_or_else(|| panic!("no thresholds for {MODEL}: {read}"))
        .clone();
    assert_eq!(ours["active_decode_blocks_threshold"], json!(0.5), "thresholds changed: {read}");
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}

/// Found by a review: a `POST /busy_threshold` whose body stops part way
/// was read with no deadline, and a connection with a request in service is
/// never idle: 64 of them (the admin listener's connection cap) locked the
/// operator out for good. Now the admin body has the inference port's body
/// timeouts: each stalled request gets a 408 and the API answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_admin_bodies_get_408_and_leave_the_admin_api_usable() {
    use std::io::{Read as _, Write as _};
    let _box = shared().await;
    let (fe, _w) = pool(&["--http-body-idle-timeout-secs", "1"], &[]).await;
    let admin = fe.admin.clone().expect("an admin listener");
    let addr = admin.trim_start_matches("http://").to_owned();
    let started = std::time::Instant::now();
    let mut stalled: Vec<std::net::TcpStream> = (0..64)
        .map(|_| {
            let mut tcp = std::net::TcpStream::connect(&addr).expect("connect to the admin listener");
            let head = "POST /busy_threshold HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
                        Content-Length: 100\r\n\r\n{\"model\"";
            tcp.write_all(head.as_bytes()).expect("send a part of the body");
            tcp
        })
        .collect();
    for tcp in &mut stalled {
        // Bounded: the idle timeout is 1 s; 20 s for a busy machine.
        tcp.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
        let mut answer = [0u8; 64];
        let n = tcp.read(&mut answer).expect("an answer to the stalled request");
        let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    }
    eprintln!("64 stalled admin bodies answered 408 within {:?}", started.elapsed());
    drop(stalled);
    let read = fe.client.get(format!("{admin}/busy_threshold")).send().await.expect("the admin API answers");
    assert_eq!(read.status(), 200);
    fe.assert_still_serving(MODEL, MAX_RSS_MIB).await;
}

/// Found by a review: without a token, the admin listener's only guard is
/// that it binds loopback, and it never looked at `Host`: a web page the
/// operator opens on that machine reached it by DNS rebinding (its own name
/// re-resolved to 127.0.0.1; the browser sends `Host: <the page's
/// name>:PORT`, and JSON needs no preflight for a same-origin request).
/// Now a request naming a host that is not an address gets 403, and the
/// thresholds are unchanged; one naming the listener by address is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_calls_naming_a_foreign_host_are_refused() {
    use std::io::{Read as _, Write as _};
    let _box = shared().await;
    let (fe, _w) = pool(&["--active-decode-blocks-threshold", "0.5"], &[]).await;
    let admin = fe.admin.clone().expect("an admin listener");
    let addr = admin.trim_start_matches("http://").to_owned();
    let port = addr.rsplit(':').next().unwrap().to_owned();
    let body = format!(r#"{{"model":"{MODEL}","active_decode_blocks_threshold":null}}"#);
    let call = |host: &str, request: &str| {
        let request = request.replace("HOST", host);
        let mut tcp = std::net::TcpStream::connect(&addr).expect("connect to the admin listener");
        tcp.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
        tcp.write_all(request.as_bytes()).unwrap();
        let mut answer = Vec::new();
        let _ = tcp.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).lines().next().unwrap_or_default().to_owned()
    };
    let post = format!(
        "POST /busy_threshold HTTP/1.1\r\nHost: HOST\r\nOrigin: http://HOST\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let get = "GET /busy_threshold HTTP/1.1\r\nHost: HOST\r\nConnection: close\r\n\r\n";
    let rebound = format!("rebind.attacker.example:{port}");
    assert_eq!(call(&rebound, &post), "HTTP/1.1 403 Forbidden", "a rebound POST");
    assert_eq!(call(&rebound, get), "HTTP/1.1 403 Forbidden", "a rebound GET (the models leak)");
    let read: Value = fe.client.get(format!("{admin}/busy_threshold")).send().await.unwrap().json().await.unwrap();
    let ours = read["thresholds"].as_array().and_then(|all| all.iter().find(|t| t["model"] == MODEL)).cloned();
    let threshold = ours.map(|t| t["active_decode_blocks_threshold"].clone());
    assert_eq!(threshold, Some(json!(0.5)), "a rebound POST changed the threshold");
    for host in [format!("localhost:{port}"), addr.clone()] {
        assert_eq!(call(&host, get), "HTTP/1.1 200 OK", "Host: {host}");
    }
}
