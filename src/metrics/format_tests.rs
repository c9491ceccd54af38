//! The conversion to the Prometheus text format 0.0.4, family type by
//! family type, and the choice of format from `Accept`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};
use proptest::prelude::*;

use super::*;
use crate::metrics::LabelText;

fn format(accept: &str) -> MetricsFormat {
    MetricsFormat::from_accept(Some(accept))
}

#[test]
fn a_counter_is_named_by_its_samples_and_loses_created_unit_and_eof() {
    let openmetrics = "\
# HELP jobs Jobs done.
# TYPE jobs counter
# UNIT jobs jobs
jobs_total{queue=\"a\"} 3
jobs_created{queue=\"a\"} 1700000000.5
jobs_total{queue=\"b\"} 0
# EOF
";
    let expected = "\
# HELP jobs_total Jobs done.
# TYPE jobs_total counter
jobs_total{queue=\"a\"} 3
jobs_total{queue=\"b\"} 0
";
    assert_eq!(openmetrics_to_prometheus(openmetrics), expected);
}

#[test]
fn gauges_and_histograms_are_unchanged_but_for_created() {
    let openmetrics = "\
# HELP temp Temperature.
# TYPE temp gauge
temp{room=\"a\"} -1.5
temp{room=\"b\"} NaN
# HELP latency Latency.
# TYPE latency histogram
latency_sum 0.25
latency_count 2
latency_bucket{le=\"0.1\"} 1
latency_bucket{le=\"+Inf\"} 2
latency_created 1700000000
# HELP size Size.
# TYPE size summary
size{quantile=\"0.5\"} 3
size_sum 10
size_count 4
size_created 1700000000
# EOF
";
    let expected = "\
# HELP temp Temperature.
# TYPE temp gauge
temp{room=\"a\"} -1.5
temp{room=\"b\"} NaN
# HELP latency Latency.
# TYPE latency histogram
latency_sum 0.25
latency_count 2
latency_bucket{le=\"0.1\"} 1
latency_bucket{le=\"+Inf\"} 2
# HELP size Size.
# TYPE size summary
size{quantile=\"0.5\"} 3
size_sum 10
size_count 4
";
    assert_eq!(openmetrics_to_prometheus(openmetrics), expected);
}

#[test]
fn info_stateset_unknown_and_gaugehistogram_map_to_classic_types() {
    let openmetrics = "\
# HELP build Build.
# TYPE build info
build_info{version=\"1.2\"} 1
# HELP mode Mode.
# TYPE mode stateset
mode{mode=\"a\"} 1
mode{mode=\"b\"} 0
# HELP odd Odd.
# TYPE odd unknown
odd 7
# HELP queue Queue.
# TYPE queue gaugehistogram
queue_bucket{le=\"1\"} 2
queue_bucket{le=\"+Inf\"} 3
queue_gcount 3
queue_gsum 4.5
# EOF
";
    let expected = "\
# HELP build_info Build.
# TYPE build_info gauge
build_info{version=\"1.2\"} 1
# HELP mode Mode.
# TYPE mode gauge
mode{mode=\"a\"} 1
mode{mode=\"b\"} 0
# HELP odd Odd.
# TYPE odd untyped
odd 7
# HELP queue Queue.
# TYPE queue histogram
queue_bucket{le=\"1\"} 2
queue_bucket{le=\"+Inf\"} 3
# HELP queue_gcount Queue.
# TYPE queue_gcount gauge
queue_gcount 3
# HELP queue_gsum Queue.
# TYPE queue_gsum gauge
queue_gsum 4.5
";
    assert_eq!(openmetrics_to_prometheus(openmetrics), expected);
}

#[test]
fn families_without_samples_keep_their_metadata() {
    let openmetrics = "# HELP a A.\n# TYPE a counter\n# HELP b B.\n# TYPE b gauge\n# EOF\n";
    let expected = "# HELP a_total A.\n# TYPE a_total counter\n# HELP b B.\n# TYPE b gauge\n";
    assert_eq!(openmetrics_to_prometheus(openmetrics), expected);
}

#[test]
fn exemplars_go_timestamps_become_milliseconds_and_label_values_stay_whole() {
    let openmetrics = concat!(
        "# TYPE x counter\n",
        "x_total{path=\"/a b}\",note=\"# {not} an \\\"exemplar\\\"\"} 1 1700000000.25 # {trace=\"t\"} 1 1700000000\n",
        "x_total{path=\"c\\\\\"} 2 # {trace=\"u\"} 1\n",
        "x_total 3 12\n",
        "# EOF\n",
        "x_total 4\n",
    );
    let expected = concat!(
        "# TYPE x_total counter\n",
        "x_total{path=\"/a b}\",note=\"# {not} an \\\"exemplar\\\"\"} 1 1700000000250\n",
        "x_total{path=\"c\\\\\"} 2\n",
        "x_total 3 12000\n",
    );
    assert_eq!(openmetrics_to_prometheus(openmetrics), expected);
}

#[test]
fn a_help_text_loses_only_the_quote_escape() {
    let openmetrics = "# HELP q A \\\"quoted\\\" back\\\\slash\\nnewline.\n# TYPE q gauge\nq 1\n# EOF\n";
    let expected = "# HELP q A \"quoted\" back\\\\slash\\nnewline.\n# TYPE q gauge\nq 1\n";
    assert_eq!(openmetrics_to_prometheus(openmetrics), expected);
}

#[test]
fn other_comments_empty_lines_and_unclosed_labels_do_not_break_the_rest() {
    let openmetrics = "# a comment\n\n# TYPE g gauge\ng{a=\"open 1\ng 2\n# EOF\n";
    assert_eq!(openmetrics_to_prometheus(openmetrics), "# TYPE g gauge\ng{a=\"open 1\ng 2\n");
}

/// What prometheus-client itself writes, every type it has, with a unit
/// and a prefix: the whole conversion.
#[test]
fn prometheus_client_output_converts_whole() {
    let mut registry = Registry::with_prefix("app");
    let requests = Family::<[(&str, LabelText<&str>); 1], Counter>::default();
    requests.get_or_create(&[("model", LabelText("m\"1"))]).inc_by(2);
    registry.register("requests", "Requests", requests);
    let bytes = Counter::<u64>::default();
    bytes.inc_by(7);
    registry.register_with_unit("sent", "Sent", Unit::Bytes, bytes);
    let load = Gauge::<i64>::default();
    load.set(-3);
    registry.register("load", "Load", load);
    let latency = Histogram::new([0.5, 1.0]);
    latency.observe(0.7);
    registry.register("latency_seconds", "Latency", latency);
    registry.register("build", "Build", Info::new([("version", "1.0")]));

    let openmetrics = MetricsFormat::OpenMetrics.encode(&registry);
    assert!(openmetrics.ends_with("# EOF\n"), "{openmetrics}");
    let expected = "\
# HELP app_requests_total Requests.
# TYPE app_requests_total counter
app_requests_total{model=\"m\\\"1\"} 2
# HELP app_sent_bytes_total Sent.
# TYPE app_sent_bytes_total counter
app_sent_bytes_total 7
# HELP app_load Load.
# TYPE app_load gauge
app_load -3
# HELP app_latency_seconds Latency.
# TYPE app_latency_seconds histogram
app_latency_seconds_sum 0.7
app_latency_seconds_count 1
app_latency_seconds_bucket{le=\"0.5\"} 0
app_latency_seconds_bucket{le=\"1.0\"} 1
app_latency_seconds_bucket{le=\"+Inf\"} 1
# HELP app_build_info Build.
# TYPE app_build_info gauge
app_build_info{version=\"1.0\"} 1
";
    assert_eq!(MetricsFormat::Prometheus.encode(&registry), expected);
    assert_eq!(MetricsFormat::Prometheus.convert(openmetrics.clone()), expected);
    assert_eq!(MetricsFormat::OpenMetrics.convert(openmetrics.clone()), openmetrics);
}

#[test]
fn openmetrics_only_when_asked_for_and_preferred() {
    // What Prometheus 2.x and 3.x send (3.x may put protobuf first: not
    // served here, so the best text format wins).
    for prometheus in [
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
        "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
        "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,*/*;q=0.1",
        "Application/OpenMetrics-Text; Version=1.0.0",
        "application/openmetrics-text, text/plain",
        " application/openmetrics-text ; q=0.8 , text/plain ; q=0.8",
        "application/openmetrics-text;q=nonsense",
    ] {
        assert_eq!(format(prometheus), MetricsFormat::OpenMetrics, "{prometheus}");
    }
    for classic in [
        "",
        "*/*",
        "text/plain",
        "text/plain;version=0.0.4",
        "text/plain;version=0.0.4;q=1,application/openmetrics-text;q=0.5",
        "application/openmetrics-text;q=0",
        "application/openmetrics-text;q=0.2,*/*;q=0.8",
        "application/*",
        "application/json",
        ";;,,=",
    ] {
        assert_eq!(format(classic), MetricsFormat::Prometheus, "{classic:?}");
    }
    assert_eq!(MetricsFormat::from_accept(None), MetricsFormat::Prometheus);
    assert_eq!(MetricsFormat::default(), MetricsFormat::Prometheus);
    assert_eq!(MetricsFormat::OpenMetrics.content_type(), "application/openmetrics-text; version=1.0.0; charset=utf-8");
    assert_eq!(MetricsFormat::Prometheus.content_type(), "text/plain; version=0.0.4; charset=utf-8");
}

proptest! {
    /// Whatever a label value holds (escaped as the text format requires),
    /// a counter's sample line reaches 0.0.4 whole, and only the metadata
    /// lines and `# EOF` change.
    #[test]
    fn any_label_value_survives(value in "\\PC{0,24}", count in any::<u32>()) {
        let family = Family::<[(&str, LabelText<String>); 1], Counter>::default();
        family.get_or_create(&[("v", LabelText(value))]).inc_by(u64::from(count));
        let mut registry = Registry::default();
        registry.register("c", "C", family);
        let openmetrics = MetricsFormat::OpenMetrics.encode(&registry);
        let sample = openmetrics.lines().nth(2).expect("the sample line");
        let expected = format!("# HELP c_total C.\n# TYPE c_total counter\n{sample}\n");
        prop_assert_eq!(MetricsFormat::Prometheus.convert(openmetrics), expected);
    }
}
