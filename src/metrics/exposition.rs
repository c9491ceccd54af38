//! Writing metric families through prometheus-client, and complete
//! expositions.
//!
//! A collector writes families only (never `# EOF`); [`render`] is the one
//! place that finishes an exposition, for the `render_*` functions.

use std::fmt;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// A label value written escaped (`\`, `"`, newline), as the text format
/// requires: prometheus-client 0.23 writes label values as given, and a
/// model name (which workers choose) with a quote would otherwise break the
/// whole exposition. Use it for any label value that comes from outside
/// (in an `EncodeLabelSet`, or from an `EncodeLabelValue` impl).
///
/// # Examples
///
/// ```
/// use loadgate::metrics::LabelText;
/// use prometheus_client::metrics::{counter::Counter, family::Family};
///
/// let family = Family::<[(&str, LabelText<String>); 1], Counter>::default();
/// family.get_or_create(&[("model", LabelText("m\"x".to_owned()))]).inc();
/// let mut registry = prometheus_client::registry::Registry::default();
/// registry.register("requests", "Requests", family);
/// let mut text = String::new();
/// prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
/// assert!(text.contains(r#"requests_total{model="m\"x"} 1"#), "{text}");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LabelText<S>(pub S);

impl<S: AsRef<str>> EncodeLabelValue for LabelText<S> {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> fmt::Result {
        use std::fmt::Write as _;
        for c in self.0.as_ref().chars() {
            match c {
                '\\' => encoder.write_str("\\\\")?,
                '"' => encoder.write_str("\\\"")?,
                '\n' => encoder.write_str("\\n")?,
                c => encoder.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// Writes one counter family: its `# HELP` and `# TYPE` lines, then one
/// `name_total{labels} value` line per series. `help` is written as given
/// (`Registry::register` would append a full stop; these helps carry theirs).
pub(super) fn counter_family<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (L, u64)>,
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in series {
        ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// As [`counter_family`], for a gauge family (`name{labels} value`).
pub(super) fn gauge_family<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (L, i64)>,
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in series {
        ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A count as a gauge value, saturating at `i64::MAX`.
#[inline]
pub(super) fn gauge_value(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A complete exposition: a fresh registry, what `register` puts into it,
/// and the one `# EOF` line at the end.
pub(super) fn render(register: impl FnOnce(&mut Registry)) -> String {
    let mut registry = Registry::default();
    register(&mut registry);
    let mut out = String::new();
    // Our collectors fail only when the writer does, and a String never does.
    encode(&mut out, &registry).expect("writing to a String cannot fail");
    out
}
