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
