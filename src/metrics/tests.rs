//! The collectors in a caller's registry, and the complete renders.

use std::collections::BTreeSet;

use prometheus_client::encoding::text::{encode, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use super::*;
use crate::sync::{Arc, AtomicU64, Ordering};
use crate::{Admission, Admitted, BusyThresholds, LoadReport, MonitorConfig, RankLoad, WorkerMonitor};

/// `render_frontend(&scenario_monitor())` for `scenario_rejections()` before
/// the collectors (prometheus-client `Family` order within a family, which
/// is a hash map's: compared as sets), with the per-class family added
/// since (issue 24).
const FRONTEND_BEFORE: &str = r#"# HELP dynamo_frontend_model_rejection Requests rejected because every eligible worker was busy or at capacity.
# TYPE dynamo_frontend_model_rejection counter
dynamo_frontend_model_rejection_total{model="m",endpoint="completions"} 3
dynamo_frontend_model_rejection_total{model="other",endpoint="chat_completions"} 1
dynamo_frontend_model_rejection_total{model="m",endpoint="chat_completions"} 1
dynamo_frontend_model_rejection_total{model="other",endpoint="completions"} 0
# HELP loadgate_frontend_rejection_reason Rejected requests by busy signal or cause.
# TYPE loadgate_frontend_rejection_reason counter
loadgate_frontend_rejection_reason_total{model="m",reason="waiting_requests"} 3
loadgate_frontend_rejection_reason_total{model="other",reason="excluded"} 1
loadgate_frontend_rejection_reason_total{model="other",reason="worker_capacity"} 1
loadgate_frontend_rejection_reason_total{model="m",reason="decode_blocks"} 3
loadgate_frontend_rejection_reason_total{model="m",reason="prefill_tokens"} 1
# HELP loadgate_frontend_rejection_class_reason Rejected requests by priority class and busy signal or cause.
# TYPE loadgate_frontend_rejection_class_reason counter
loadgate_frontend_rejection_class_reason_total{model="m",class="standard",reason="decode_blocks"} 3
loadgate_frontend_rejection_class_reason_total{model="m",class="standard",reason="prefill_tokens"} 1
loadgate_frontend_rejection_class_reason_total{model="m",class="standard",reason="waiting_requests"} 3
loadgate_frontend_rejection_class_reason_total{model="other",class="standard",reason="worker_capacity"} 1
loadgate_frontend_rejection_class_reason_total{model="other",class="standard",reason="excluded"} 1
# HELP dynamo_frontend_worker_active_decode_blocks Latest observed active decode blocks per worker rank.
# TYPE dynamo_frontend_worker_active_decode_blocks gauge
dynamo_frontend_worker_active_decode_blocks{worker_id="9",dp_rank="0"} 90
dynamo_frontend_worker_active_decode_blocks{worker_id="7",dp_rank="1"} 42
# HELP dynamo_frontend_worker_active_prefill_tokens Latest observed active prefill tokens per worker rank.
# TYPE dynamo_frontend_worker_active_prefill_tokens gauge
dynamo_frontend_worker_active_prefill_tokens{worker_id="7",dp_rank="1"} 13
dynamo_frontend_worker_active_prefill_tokens{worker_id="9",dp_rank="0"} 0
# HELP loadgate_frontend_worker_kv_total_blocks Latest observed total KV blocks per worker rank.
# TYPE loadgate_frontend_worker_kv_total_blocks gauge
loadgate_frontend_worker_kv_total_blocks{worker_id="7",dp_rank="1"} 100
loadgate_frontend_worker_kv_total_blocks{worker_id="9",dp_rank="0"} 100
# HELP loadgate_frontend_worker_waiting_requests Latest observed requests waiting in the engine's queue per worker rank.
# TYPE loadgate_frontend_worker_waiting_requests gauge
loadgate_frontend_worker_waiting_requests{worker_id="7",dp_rank="1"} 2
loadgate_frontend_worker_waiting_requests{worker_id="9",dp_rank="0"} 0
# HELP loadgate_frontend_worker_busy 1 when the worker is in its model's busy set.
# TYPE loadgate_frontend_worker_busy gauge
loadgate_frontend_worker_busy{worker_id="7",model="m"} 0
loadgate_frontend_worker_busy{worker_id="9",model="other"} 1
# EOF
"#;

/// `render_worker("m", { rejected: 5, running: 2, queued: 1 })` before the
/// collectors.
const WORKER_BEFORE: &str = r#"# HELP dynamo_rejection_request Requests refused because the worker was at capacity.
# TYPE dynamo_rejection_request counter
dynamo_rejection_request_total{model="m"} 5
# HELP dynamo_engine_request Requests holding an engine slot.
# TYPE dynamo_engine_request gauge
dynamo_engine_request{model="m"} 2
# HELP dynamo_request_queue Requests waiting in the overflow queue.
# TYPE dynamo_request_queue gauge
dynamo_request_queue{model="m"} 1
# EOF
"#;

/// Worker 7 (model `m`, two ranks; rank 1 reported) and worker 9 (model
/// `other`, busy over its decode threshold).
fn scenario_monitor() -> Arc<WorkerMonitor> {
    let monitor = Arc::new(WorkerMonitor::new(MonitorConfig::default()).unwrap());
    monitor.register(7, "m", 2, 1).unwrap();
    monitor.register(9, "other", 1, 1).unwrap();
    monitor
        .set_thresholds("other", BusyThresholds { active_decode_blocks_threshold: Some(0.5), ..Default::default() })
        .unwrap();
    let seven = RankLoad {
        active_decode_blocks: 42,
        kv_total_blocks: 100,
        active_prefill_tokens: 13,
        waiting_requests: 2,
        ..Default::default()
    };
    monitor
        .apply(&LoadReport { worker: 7, incarnation: 1, rank: 1, seq: 1, load: seven, ..Default::default() })
        .unwrap();
    let nine = RankLoad { active_decode_blocks: 90, kv_total_blocks: 100, ..Default::default() };
    monitor
        .apply(&LoadReport { worker: 9, incarnation: 1, rank: 0, seq: 1, load: nine, ..Default::default() })
        .unwrap();
    monitor
}

fn scenario_rejections() -> Arc<RejectionMetrics> {
    let metrics = Arc::new(RejectionMetrics::default());
    for _ in 0..3 {
        metrics.record("m", Endpoint::Completions, [Reason::DecodeBlocks, Reason::WaitingRequests]);
    }
    metrics.record("m", Endpoint::ChatCompletions, [Reason::PrefillTokens]);
    metrics.record("other", Endpoint::ChatCompletions, [Reason::WorkerCapacity, Reason::Excluded]);
    metrics
}

/// One family as exposed: its `# HELP`/`# TYPE` lines and its samples.
#[derive(Debug, PartialEq, Eq)]
struct Family {
    header: Vec<String>,
    samples: BTreeSet<String>,
}

/// The families of `text` in order, checking that each sample belongs to
/// the family above it. `# EOF` is not a family's.
fn families(text: &str) -> Vec<Family> {
    let mut all: Vec<Family> = Vec::new();
    let mut name = String::new();
    for line in text.lines().filter(|l| *l != "# EOF") {
        if let Some(help) = line.strip_prefix("# HELP ") {
            name = help.split(' ').next().unwrap().to_owned();
            all.push(Family { header: vec![line.to_owned()], samples: BTreeSet::new() });
        } else if line.starts_with("# ") {
            all.last_mut().expect("a header after # HELP").header.push(line.to_owned());
        } else {
            let series = line.split(['{', ' ']).next().unwrap();
            assert!(series == name || series == format!("{name}_total"), "{line:?} outside its family {name}");
            assert!(all.last_mut().unwrap().samples.insert(line.to_owned()), "duplicate series {line:?}");
        }
    }
    all
}

/// Exactly one `# EOF`, as the last line.
fn assert_one_final_eof(text: &str) {
    assert_eq!(text.matches("# EOF").count(), 1, "{text}");
    assert!(text.ends_with("\n# EOF\n") || text == "# EOF\n", "{text}");
}

/// Every family name at most once.
fn assert_unique_families(text: &str) {
    let names: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()).collect();
    let unique: BTreeSet<&str> = names.iter().copied().collect();
    assert_eq!(names.len(), unique.len(), "a family written twice:\n{text}");
}

fn encoded(registry: &Registry) -> String {
    let mut text = String::new();
    encode(&mut text, registry).unwrap();
    text
}

#[test]
fn a_caller_registry_gets_its_metrics_and_ours_with_one_final_eof() {
    let mut registry = Registry::default();
    let requests = Counter::<u64>::default();
    registry.register("app_requests", "Requests the app served", requests.clone());
    requests.inc_by(11);
    let rejections = scenario_rejections();
    rejections.register(&mut registry, scenario_monitor());
    let gates = Arc::new(AdmissionMetrics::new());
    gates.add(3, "m", || WorkerAdmissionStats { rejected: 1, running: 2, queued: 0 }).unwrap();
    gates.register(&mut registry);

    let text = encoded(&registry);
    assert_one_final_eof(&text);
    assert_unique_families(&text);
    for line in [
        "app_requests_total 11",
        r#"dynamo_frontend_model_rejection_total{model="m",endpoint="completions"} 3"#,
        r#"loadgate_frontend_worker_busy{worker_id="9",model="other"} 1"#,
        r#"dynamo_rejection_request_total{worker_id="3",model="m"} 1"#,
        r#"dynamo_engine_request{worker_id="3",model="m"} 2"#,
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
    // The caller's own metric, then the frontend's eight families, then the
    // gates' three: nothing left out, nothing twice.
    assert_eq!(families(&text).len(), 1 + 8 + 3);
}

#[test]
fn two_gates_write_one_family_each_with_two_series() {
    let gates = Arc::new(AdmissionMetrics::new());
    // Added out of order: series come sorted by worker_id.
    gates.add("b", "m", || WorkerAdmissionStats { rejected: 0, running: 1, queued: 0 }).unwrap();
    gates.add("a", "m", || WorkerAdmissionStats { rejected: 4, running: 2, queued: 3 }).unwrap();
    let mut registry = Registry::default();
    gates.register(&mut registry);
    let text = encoded(&registry);
    assert_eq!(
        text,
        r#"# HELP dynamo_rejection_request Requests refused because the worker was at capacity.
# TYPE dynamo_rejection_request counter
dynamo_rejection_request_total{worker_id="a",model="m"} 4
dynamo_rejection_request_total{worker_id="b",model="m"} 0
# HELP dynamo_engine_request Requests holding an engine slot.
# TYPE dynamo_engine_request gauge
dynamo_engine_request{worker_id="a",model="m"} 2
dynamo_engine_request{worker_id="b",model="m"} 1
# HELP dynamo_request_queue Requests waiting in the overflow queue.
# TYPE dynamo_request_queue gauge
dynamo_request_queue{worker_id="a",model="m"} 3
dynamo_request_queue{worker_id="b",model="m"} 0
# EOF
"#
    );
    assert_unique_families(&text);
    for family in families(&text) {
        assert_eq!(family.header.len(), 2, "{family:?}");
        assert_eq!(family.samples.len(), 2, "{family:?}");
    }
}

#[test]
fn two_admission_gates_report_their_limits() {
    let a = Admission::<u32>::with_dispatch(1, 2, Box::new(|_item, _permit| Ok(()))).unwrap();
    let b = Admission::<u32>::with_dispatch(4, 8, Box::new(|_item, _permit| Ok(()))).unwrap();
    let gates = Arc::new(AdmissionMetrics::new());
    gates.add("a", "m", a.clone()).unwrap();
    gates.add("b", "m", b).unwrap();
    let mut registry = Registry::default();
    gates.register(&mut registry);
    let text = encoded(&registry);
    assert_unique_families(&text);
    for line in [
        r#"loadgate_worker_request_limit{worker_id="a",model="m"} 1"#,
        r#"loadgate_worker_request_limit{worker_id="b",model="m"} 4"#,
        r#"loadgate_worker_queue_limit{worker_id="a",model="m"} 2"#,
        r#"loadgate_worker_queue_limit{worker_id="b",model="m"} 8"#,
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
    assert_eq!(families(&text).len(), 5);
}

#[test]
fn a_scrape_reads_the_live_figures() {
    let monitor = scenario_monitor();
    let rejections = scenario_rejections();
    let gate = Admission::<u32>::with_dispatch(1, 2, Box::new(|_item, _permit| Ok(()))).unwrap();
    let other_running = Arc::new(AtomicU64::new(0));
    let gates = Arc::new(AdmissionMetrics::new());
    gates.add("a", "m", gate.clone()).unwrap();
    let running = other_running.clone();
    // Relaxed: a gauge read.
    gates
        .add("b", "m", move || WorkerAdmissionStats { running: running.load(Ordering::Relaxed), ..Default::default() })
        .unwrap();
    let mut registry = Registry::default();
    rejections.register(&mut registry, monitor.clone());
    gates.register(&mut registry);

    let before = encoded(&registry);
    for line in [
        r#"dynamo_frontend_model_rejection_total{model="m",endpoint="completions"} 3"#,
        r#"dynamo_frontend_worker_active_decode_blocks{worker_id="7",dp_rank="1"} 42"#,
        r#"dynamo_engine_request{worker_id="a",model="m"} 0"#,
        r#"dynamo_engine_request{worker_id="b",model="m"} 0"#,
    ] {
        assert!(before.lines().any(|l| l == line), "missing {line:?} in\n{before}");
    }
    assert!(!before.contains("model=\"new\""), "{before}");

    rejections.record("m", Endpoint::Completions, []);
    rejections.record("new", Endpoint::ChatCompletions, [Reason::Excluded]);
    let load = RankLoad { active_decode_blocks: 50, kv_total_blocks: 100, ..Default::default() };
    monitor.apply(&LoadReport { worker: 7, incarnation: 1, rank: 1, seq: 2, load, ..Default::default() }).unwrap();
    let Ok(Admitted::Now(_, permit)) = gate.try_admit(1) else { panic!("a free slot") };
    assert!(matches!(gate.try_admit(2), Ok(Admitted::Queued)));
    assert!(gate.try_admit(3).is_ok());
    assert!(gate.try_admit(4).is_err());
    // Relaxed: a gauge write; the scrape below is on this thread.
    other_running.store(5, Ordering::Relaxed);

    let after = encoded(&registry);
    assert_one_final_eof(&after);
    for line in [
        r#"dynamo_frontend_model_rejection_total{model="m",endpoint="completions"} 4"#,
        r#"dynamo_frontend_model_rejection_total{model="new",endpoint="chat_completions"} 1"#,
        r#"loadgate_frontend_rejection_reason_total{model="new",reason="excluded"} 1"#,
        r#"dynamo_frontend_worker_active_decode_blocks{worker_id="7",dp_rank="1"} 50"#,
        r#"dynamo_engine_request{worker_id="a",model="m"} 1"#,
        r#"dynamo_request_queue{worker_id="a",model="m"} 2"#,
        r#"dynamo_rejection_request_total{worker_id="a",model="m"} 1"#,
        r#"dynamo_engine_request{worker_id="b",model="m"} 5"#,
    ] {
        assert!(after.lines().any(|l| l == line), "missing {line:?} in\n{after}");
    }
    drop(permit);
}

#[test]
fn render_frontend_keeps_its_names_labels_and_values() {
    let text = scenario_rejections().render_frontend(&scenario_monitor());
    assert_one_final_eof(&text);
    assert_eq!(families(&text), families(FRONTEND_BEFORE), "{text}");
    // Now in a fixed order: models, endpoints and reasons as listed, ranks
    // and workers by id.
    let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        samples[..6],
        [
            r#"dynamo_frontend_model_rejection_total{model="m",endpoint="completions"} 3"#,
            r#"dynamo_frontend_model_rejection_total{model="m",endpoint="chat_completions"} 1"#,
            r#"dynamo_frontend_model_rejection_total{model="other",endpoint="completions"} 0"#,
            r#"dynamo_frontend_model_rejection_total{model="other",endpoint="chat_completions"} 1"#,
            r#"loadgate_frontend_rejection_reason_total{model="m",reason="decode_blocks"} 3"#,
            r#"loadgate_frontend_rejection_reason_total{model="m",reason="prefill_tokens"} 1"#,
        ]
    );
    assert_eq!(samples[14], r#"dynamo_frontend_worker_active_decode_blocks{worker_id="7",dp_rank="1"} 42"#);
}

#[test]
fn render_frontend_without_figures_keeps_its_headers() {
    let monitor = WorkerMonitor::new(MonitorConfig::default()).unwrap();
    let text = RejectionMetrics::default().render_frontend(&monitor);
    assert_one_final_eof(&text);
    let expected: Vec<Family> =
        families(FRONTEND_BEFORE).into_iter().map(|f| Family { header: f.header, samples: BTreeSet::new() }).collect();
    assert_eq!(families(&text), expected, "{text}");
}

#[test]
fn render_worker_keeps_its_names_labels_and_values() {
    let text = render_worker("m", WorkerAdmissionStats { rejected: 5, running: 2, queued: 1 });
    assert_one_final_eof(&text);
    assert_eq!(text, WORKER_BEFORE);
    let huge = render_worker("m", WorkerAdmissionStats { rejected: u64::MAX, running: u64::MAX, queued: 0 });
    assert!(huge.contains(&format!("dynamo_rejection_request_total{{model=\"m\"}} {}\n", u64::MAX)), "{huge}");
    assert!(huge.contains(&format!("dynamo_engine_request{{model=\"m\"}} {}\n", i64::MAX)), "saturates\n{huge}");
}

#[test]
fn a_partial_encoding_has_no_eof() {
    let mut registry = Registry::default();
    scenario_rejections().register(&mut registry, scenario_monitor());
    let gates = Arc::new(AdmissionMetrics::new());
    gates.add("a", "m", WorkerAdmissionStats::default).unwrap();
    gates.register(&mut registry);
    let mut partial = String::new();
    encode_registry(&mut partial, &registry).unwrap();
    assert!(!partial.contains("# EOF"), "{partial}");
    assert!(partial.contains("dynamo_engine_request{worker_id=\"a\",model=\"m\"} 0\n"), "{partial}");
}

#[test]
fn a_registry_prefix_is_prepended_once() {
    let mut root = Registry::with_prefix("app");
    let gates = Arc::new(AdmissionMetrics::new());
    gates.add("a", "m", WorkerAdmissionStats::default).unwrap();
    gates.register(&mut root);
    scenario_rejections().register(root.sub_registry_with_prefix("edge"), scenario_monitor());
    let text = encoded(&root);
    assert!(text.contains("# TYPE app_dynamo_engine_request gauge\n"), "{text}");
    assert!(text.contains("app_dynamo_rejection_request_total{worker_id=\"a\",model=\"m\"} 0\n"), "{text}");
    assert!(text.contains("# TYPE app_edge_dynamo_frontend_model_rejection counter\n"), "{text}");
    assert!(!text.contains("app_app_") && !text.contains("loadgate_loadgate_"), "{text}");
    assert_one_final_eof(&text);
}

#[test]
fn a_sub_registry_label_is_added_to_every_series() {
    let mut root = Registry::default();
    let gates = Arc::new(AdmissionMetrics::new());
    gates.add("a", "m", WorkerAdmissionStats::default).unwrap();
    gates.register(root.sub_registry_with_label(("zone".into(), "eu".into())));
    let text = encoded(&root);
    assert!(text.contains("dynamo_request_queue{zone=\"eu\",worker_id=\"a\",model=\"m\"} 0\n"), "{text}");
}

#[test]
fn one_collector_per_sub_registry_would_repeat_the_family() {
    // What one `AdmissionMetrics` for all gates avoids.
    let mut root = Registry::default();
    for id in ["a", "b"] {
        let gate = Arc::new(AdmissionMetrics::new());
        gate.add(id, "m", WorkerAdmissionStats::default).unwrap();
        gate.register(root.sub_registry_with_label(("pod".into(), id.into())));
    }
    let text = encoded(&root);
    assert_eq!(text.matches("# TYPE dynamo_engine_request gauge").count(), 2, "{text}");
}

#[test]
fn gates_refuse_an_empty_or_repeated_worker_id() {
    let gates = AdmissionMetrics::new();
    gates.add(7, "m", WorkerAdmissionStats::default).unwrap();
    assert_eq!(
        gates.add(7, "other", WorkerAdmissionStats::default),
        Err(AddGateError::DuplicateWorkerId("7".to_owned()))
    );
    assert_eq!(gates.add("", "m", WorkerAdmissionStats::default), Err(AddGateError::EmptyWorkerId));
    assert_eq!(
        AddGateError::DuplicateWorkerId("7".to_owned()).to_string(),
        "a gate with worker_id \"7\" is already registered"
    );
    assert_eq!(format!("{gates:?}"), r#"AdmissionMetrics { worker_ids: ["7"] }"#);
}

#[test]
fn a_removed_gate_leaves_the_next_scrape() {
    let gates = Arc::new(AdmissionMetrics::new());
    gates.add("a", "m", WorkerAdmissionStats::default).unwrap();
    gates.add("b", "m", WorkerAdmissionStats::default).unwrap();
    let mut registry = Registry::default();
    gates.register(&mut registry);
    assert!(gates.remove("a"));
    assert!(!gates.remove("a"));
    let text = encoded(&registry);
    assert!(!text.contains("worker_id=\"a\""), "{text}");
    assert!(text.contains("dynamo_engine_request{worker_id=\"b\",model=\"m\"} 0\n"), "{text}");
    assert!(gates.remove("b"));
    // No gates: the three headers, no series, still one family each.
    let empty = encoded(&registry);
    assert_eq!(families(&empty).len(), 3, "{empty}");
    assert!(families(&empty).iter().all(|f| f.samples.is_empty()), "{empty}");
    gates.add("a", "m", WorkerAdmissionStats::default).unwrap();
    assert!(encoded(&registry).contains("dynamo_engine_request{worker_id=\"a\",model=\"m\"} 0\n"));
}
