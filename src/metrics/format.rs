//! The two text formats a `/metrics` endpoint answers in, chosen by the
//! request's `Accept`, and the conversion from the OpenMetrics that
//! prometheus-client writes to the Prometheus text format 0.0.4.

use std::fmt::Write as _;

use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;

/// The text format of an exposition: OpenMetrics 1.0.0, or the Prometheus
/// text exposition format 0.0.4 (the "classic" format).
///
/// prometheus-client 0.23 writes OpenMetrics only. A classic parser (the
/// Python `prometheus_client.parser`, older Prometheus servers, many
/// agents) misreads it: OpenMetrics names a counter family `x` and its
/// samples `x_total`, so a classic parser makes an empty `x` counter and one
/// `unknown` family per sample. Serve each scraper the format it asked for:
/// [`from_accept`](Self::from_accept) on the request's `Accept`, then
/// [`content_type`](Self::content_type) and [`convert`](Self::convert) (or
/// [`encode`](Self::encode), or the `render_*_as` helpers) for the answer.
///
/// # Examples
///
/// ```
/// use loadgate::metrics::{MetricsFormat, RejectionMetrics, Endpoint};
/// use loadgate::{MonitorConfig, WorkerMonitor};
///
/// let monitor = WorkerMonitor::new(MonitorConfig::default()).unwrap();
/// let metrics = RejectionMetrics::default();
/// metrics.record("llama", Endpoint::Completions, []);
///
/// // Prometheus asks for OpenMetrics first.
/// let prometheus = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
/// assert_eq!(MetricsFormat::from_accept(Some(prometheus)), MetricsFormat::OpenMetrics);
///
/// // curl, or a classic scraper: the 0.0.4 text format.
/// let format = MetricsFormat::from_accept(None);
/// assert_eq!(format.content_type(), "text/plain; version=0.0.4; charset=utf-8");
/// let text = metrics.render_frontend_as(&monitor, format);
/// assert!(text.contains("# TYPE dynamo_frontend_model_rejection_total counter\n"));
/// assert!(text.contains(r#"dynamo_frontend_model_rejection_total{model="llama",endpoint="completions"} 1"#));
/// assert!(!text.contains("# EOF"));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MetricsFormat {
    /// OpenMetrics 1.0.0 text: what prometheus-client writes, ending with
    /// `# EOF`; served as `application/openmetrics-text; version=1.0.0;
    /// charset=utf-8`.
    OpenMetrics,
    /// The Prometheus text exposition format 0.0.4, served as `text/plain;
    /// version=0.0.4; charset=utf-8`: what a scraper that does not ask for
    /// OpenMetrics gets.
    #[default]
    Prometheus,
}

/// The content type of an OpenMetrics 1.0.0 text exposition.
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of the Prometheus text format 0.0.4.
const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

impl MetricsFormat {
    /// The format for a request with this `Accept` header (`None`: without
    /// one; several `Accept` lines joined with `,` are one header).
    ///
    /// OpenMetrics when a media range `application/openmetrics-text` (any
    /// version) has a quality above 0 and at least that of every range the
    /// Prometheus text format matches (`text/plain`, `text/*`, `*/*`); the
    /// Prometheus text format otherwise, including without `Accept`, for
    /// `*/*` alone, and for a header that cannot be read. Media types and
    /// parameter names are compared without regard to case; a quality that
    /// is not a number counts as 1.
    ///
    /// # Examples
    ///
    /// ```
    /// use loadgate::metrics::MetricsFormat;
    ///
    /// assert_eq!(MetricsFormat::from_accept(Some("application/openmetrics-text")), MetricsFormat::OpenMetrics);
    /// assert_eq!(MetricsFormat::from_accept(Some("*/*")), MetricsFormat::Prometheus);
    /// assert_eq!(
    ///     MetricsFormat::from_accept(Some("text/plain;q=0.9, application/openmetrics-text;q=0.5")),
    ///     MetricsFormat::Prometheus
    /// );
    /// assert_eq!(MetricsFormat::from_accept(Some("application/openmetrics-text;q=0")), MetricsFormat::Prometheus);
    /// ```
    pub fn from_accept(accept: Option<&str>) -> Self {
        let Some(accept) = accept else {
            return MetricsFormat::Prometheus;
        };
        let mut openmetrics: f32 = 0.0;
        let mut text: f32 = 0.0;
        for range in accept.split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim();
            let quality = parts
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .map_or(1.0, |(_, v)| v.trim().parse::<f32>().ok().filter(|q| q.is_finite()).unwrap_or(1.0));
            let quality = quality.clamp(0.0, 1.0);
            if media.eq_ignore_ascii_case("application/openmetrics-text") {
                openmetrics = openmetrics.max(quality);
            } else if ["text/plain", "text/*", "*/*"].iter().any(|m| media.eq_ignore_ascii_case(m)) {
                text = text.max(quality);
            }
        }
        if openmetrics > 0.0 && openmetrics >= text {
            MetricsFormat::OpenMetrics
        } else {
            MetricsFormat::Prometheus
        }
    }

    /// The `Content-Type` of an exposition in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            MetricsFormat::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
            MetricsFormat::Prometheus => PROMETHEUS_CONTENT_TYPE,
        }
    }

    /// A complete OpenMetrics exposition (what prometheus-client's `encode`
    /// writes) in this format: as it is for OpenMetrics, through
    /// [`openmetrics_to_prometheus`] for the Prometheus text format.
    pub fn convert(self, openmetrics: String) -> String {
        match self {
            MetricsFormat::OpenMetrics => openmetrics,
            MetricsFormat::Prometheus => openmetrics_to_prometheus(&openmetrics),
        }
    }

    /// Encodes `registry` as a complete exposition in this format.
    ///
    /// # Examples
    ///
    /// ```
    /// use loadgate::metrics::MetricsFormat;
    /// use prometheus_client::metrics::counter::Counter;
    /// use prometheus_client::registry::Registry;
    ///
    /// let mut registry = Registry::default();
    /// registry.register("app_requests", "Requests served", Counter::<u64>::default());
    /// let text = MetricsFormat::Prometheus.encode(&registry);
    /// assert_eq!(text, "# HELP app_requests_total Requests served.\n# TYPE app_requests_total counter\napp_requests_total 0\n");
    /// assert!(MetricsFormat::OpenMetrics.encode(&registry).ends_with("# EOF\n"));
    /// ```
    pub fn encode(self, registry: &Registry) -> String {
        let mut out = String::new();
        // prometheus-client fails only when the writer does; a String never does.
        encode(&mut out, registry).expect("writing to a String cannot fail");
        self.convert(out)
    }
}

/// Converts an OpenMetrics text exposition to the Prometheus text format
/// 0.0.4, family by family:
///
/// | OpenMetrics | Prometheus 0.0.4 |
/// |---|---|
/// | `counter` `x`, samples `x_total` | `# HELP`/`# TYPE x_total counter`, samples `x_total`; `x_created` dropped |
/// | `gauge`, `histogram`, `summary` | unchanged; `_created` samples dropped |
/// | `info` `x`, samples `x_info` | `# TYPE x_info gauge` |
/// | `stateset` | `gauge` |
/// | `gaugehistogram` `x` | `histogram` (its `x_bucket`), then `x_gcount` and `x_gsum` as gauge families |
/// | `unknown` | `untyped` |
/// | `# UNIT`, `# EOF` | dropped |
///
/// Exemplars are dropped, a sample's timestamp (seconds) becomes
/// milliseconds, and `\"` in a help text becomes `"` (0.0.4 escapes only
/// `\\` and `\n` there). Label values keep their escapes (the same in both
/// formats). Nothing after `# EOF` is read; a line that is no sample nor
/// metadata (an empty line, another comment) is dropped.
///
/// # Examples
///
/// ```
/// use loadgate::metrics::openmetrics_to_prometheus;
///
/// let openmetrics = "# HELP jobs Jobs done.\n# TYPE jobs counter\n# UNIT jobs jobs\njobs_total{queue=\"a\"} 3 # {trace=\"x\"} 1\njobs_created{queue=\"a\"} 1700000000.5\n# EOF\n";
/// assert_eq!(
///     openmetrics_to_prometheus(openmetrics),
///     "# HELP jobs_total Jobs done.\n# TYPE jobs_total counter\njobs_total{queue=\"a\"} 3\n"
/// );
/// ```
pub fn openmetrics_to_prometheus(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut family = Family::default();
    for line in openmetrics.lines() {
        if line.trim_end() == "# EOF" {
            break;
        }
        if let Some(meta) = line.strip_prefix("# ") {
            let mut parts = meta.splitn(3, ' ');
            let (Some(kind @ ("HELP" | "TYPE" | "UNIT")), Some(name)) = (parts.next(), parts.next()) else {
                continue; // another comment: OpenMetrics has none
            };
            if name != family.name {
                family.finish(&mut out);
                family = Family { name: name.to_owned(), ..Family::default() };
            }
            let rest = parts.next().unwrap_or("");
            match kind {
                "HELP" => family.help = Some(rest.to_owned()),
                "TYPE" => family.kind = Some(rest.trim().to_owned()),
                _ => {} // UNIT: 0.0.4 has none
            }
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let sample = Sample::parse(line);
        family.sample(&mut out, &sample);
    }
    family.finish(&mut out);
    out
}

/// One family as the conversion meets it: its metadata until its first
/// sample writes them, and the samples that 0.0.4 writes as families of
/// their own after it (a gauge histogram's `_gcount` and `_gsum`).
#[derive(Default)]
struct Family {
    /// The OpenMetrics family name (empty before the first family).
    name: String,
    help: Option<String>,
    kind: Option<String>,
    /// The metadata lines are written.
    started: bool,
    /// `(suffix, lines)` written after the family, each as a gauge family.
    trailing: Vec<(&'static str, String)>,
}

impl Family {
    /// The sample name and type the 0.0.4 metadata lines carry.
    fn classic(&self) -> (String, Option<&'static str>) {
        let name = &self.name;
        match self.kind.as_deref() {
            Some("counter") => (format!("{name}_total"), Some("counter")),
            Some("info") => (format!("{name}_info"), Some("gauge")),
            Some("gauge" | "stateset") => (name.clone(), Some("gauge")),
            Some("histogram" | "gaugehistogram") => (name.clone(), Some("histogram")),
            Some("summary") => (name.clone(), Some("summary")),
            Some(_) => (name.clone(), Some("untyped")),
            None => (name.clone(), None),
        }
    }

    /// Writes the `# HELP` and `# TYPE` lines once.
    fn start(&mut self, out: &mut String) {
        if self.started || self.name.is_empty() {
            return;
        }
        self.started = true;
        let (name, kind) = self.classic();
        if let Some(help) = &self.help {
            let _ = writeln!(out, "# HELP {name} {}", classic_help(help));
        }
        if let Some(kind) = kind {
            let _ = writeln!(out, "# TYPE {name} {kind}");
        }
    }

    /// Writes `sample` (or keeps it for after the family, or drops it).
    fn sample(&mut self, out: &mut String, sample: &Sample<'_>) {
        let suffix = sample.name.strip_prefix(self.name.as_str()).filter(|_| !self.name.is_empty());
        let kind = self.kind.as_deref();
        if suffix == Some("_created") && matches!(kind, Some("counter" | "histogram" | "summary")) {
            return;
        }
        if kind == Some("gaugehistogram") {
            for trailing in ["_gcount", "_gsum"] {
                if suffix == Some(trailing) {
                    match self.trailing.iter_mut().find(|(s, _)| *s == trailing) {
                        Some((_, lines)) => sample.write(lines),
                        None => {
                            let mut lines = String::new();
                            sample.write(&mut lines);
                            self.trailing.push((trailing, lines));
                        }
                    }
                    return;
                }
            }
        }
        self.start(out);
        sample.write(out);
    }

    /// Writes what is left of the family: its metadata if no sample did,
    /// then its trailing gauge families.
    fn finish(&mut self, out: &mut String) {
        self.start(out);
        for (suffix, lines) in std::mem::take(&mut self.trailing) {
            let name = format!("{}{suffix}", self.name);
            if let Some(help) = &self.help {
                let _ = writeln!(out, "# HELP {name} {}", classic_help(help));
            }
            let _ = writeln!(out, "# TYPE {name} gauge");
            out.push_str(&lines);
        }
    }
}

/// An OpenMetrics help text as 0.0.4 writes it: `\"` unescaped (0.0.4
/// escapes only `\\` and `\n` in help texts), every other escape kept.
fn classic_help(help: &str) -> String {
    let mut out = String::with_capacity(help.len());
    let mut chars = help.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('"') => out.push('"'),
            Some(next) => {
                out.push('\\');
                out.push(next);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// One sample line, split.
struct Sample<'a> {
    name: &'a str,
    /// `{…}` with its braces, or empty.
    labels: &'a str,
    value: &'a str,
    /// Seconds, as OpenMetrics writes them.
    timestamp: Option<&'a str>,
}

impl<'a> Sample<'a> {
    /// Splits a sample line; the exemplar (` # {…} v [t]`) is left out. A
    /// line it cannot split keeps its text in `name`, written back as it is.
    fn parse(line: &'a str) -> Sample<'a> {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        let mut rest = &line[name_end..];
        let mut labels = "";
        if rest.starts_with('{') {
            match labels_end(rest) {
                Some(end) => {
                    labels = &rest[..end];
                    rest = &rest[end..];
                }
                None => return Sample { name: line, labels: "", value: "", timestamp: None },
            }
        }
        let mut fields = rest.split_ascii_whitespace().take_while(|f| *f != "#");
        let value = fields.next().unwrap_or("");
        Sample { name, labels, value, timestamp: fields.next() }
    }

    /// Writes the sample as a 0.0.4 line.
    fn write(&self, out: &mut String) {
        out.push_str(self.name);
        out.push_str(self.labels);
        if !self.value.is_empty() {
            out.push(' ');
            out.push_str(self.value);
        }
        if let Some(ms) = self.timestamp.and_then(millis) {
            let _ = write!(out, " {ms}");
        }
        out.push('\n');
    }
}

/// The length of the `{…}` block that starts `text`, quotes and escapes
/// inside label values respected (`None`: it never closes).
fn labels_end(text: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match (quoted, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (true, false, '"') => quoted = false,
            (false, _, '"') => quoted = true,
            (false, _, '}') => return Some(i + 1),
            _ => {}
        }
    }
    None
}

/// An OpenMetrics timestamp (seconds, maybe fractional) in milliseconds,
/// as 0.0.4 writes it (`None`: not a finite number in range).
fn millis(seconds: &str) -> Option<i64> {
    let ms = (seconds.parse::<f64>().ok()? * 1000.0).round();
    // `as` saturates; the bounds keep a saturated value out.
    (ms.is_finite() && ms.abs() < 9.0e18).then_some(ms as i64)
}

#[cfg(test)]
#[path = "format_tests.rs"]
mod tests;
