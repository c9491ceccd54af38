//! The samples of a few named families of a Prometheus text document.
//!
//! Only the lines of the wanted families (their samples and their `# HELP`
//! and `# TYPE` lines) are handed to `prom_text_format_parser`. Measured on
//! a realistic 78 KB vLLM `/metrics` (two engines, the histograms of
//! `vllm/v1/metrics/loggers.py`; release build, 2 shared cores at load
//! 1.3): the whole document takes 1.5 to 4 ms to parse (median 1.8 ms),
//! more than a scrape every 50 ms should spend; selecting first makes the
//! whole `vllm()` read (scan, parse, map) 0.2 to 0.3 ms (median 0.24 ms).
//! Selecting also keeps families the mappers never read from making the
//! load unreadable (a malformed or oddly ordered histogram elsewhere).
//!
//! The parser keeps label values as written (escapes undone here) and
//! values as text (parsed here, never with its panicking `as_f64`), and
//! does not refuse a repeated series (refused here).

use std::collections::HashSet;

use prom_text_format_parser::{Scrape, ScrapeParseError, Type};

use super::EngineError;

/// The most series one wanted family may have: 1024 is four times
/// `MAX_RANKS`; SGLang's per-`tp_rank` series stay well under it. It bounds
/// the memory one family's parse takes.
const MAX_SERIES: usize = 1024;

/// The most bytes of lines one wanted family may have (256 KiB): 256 ranks
/// of vLLM's `cache_config_info` (about 450 bytes a series) take under
/// half of it. It also bounds the time a hostile document can cost: about
/// 4 ms per family (1000 series of 250 bytes, measured).
const MAX_FAMILY_BYTES: usize = 256 << 10;

/// One series of a family: its labels (sorted by name) and its value.
#[derive(Debug)]
pub(super) struct Sample {
    pub(super) labels: Vec<(String, String)>,
    pub(super) value: f64,
}

impl Sample {
    /// The value of label `name`; an empty value is no label (as in
    /// Prometheus).
    pub(super) fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str()).filter(|v| !v.is_empty())
    }
}

/// The samples of each family in `names` (same order), in document order;
/// an absent family has none.
///
/// # Errors
///
/// [`EngineError::Exposition`] when a wanted family's lines do not parse,
/// or it has more than [`MAX_SERIES`] series or [`MAX_FAMILY_BYTES`] of
/// lines, or is a histogram or summary.
pub(super) fn read(text: &str, names: &[&'static str]) -> Result<Vec<Vec<Sample>>, EngineError> {
    let mut selected: Vec<(String, usize)> = vec![(String::new(), 0); names.len()];
    for line in text.split_inclusive('\n') {
        let Some((name, is_sample)) = family_of(line) else { continue };
        let Some(index) = names.iter().position(|&wanted| wanted == name) else { continue };
        let (lines, samples) = &mut selected[index];
        *samples += usize::from(is_sample);
        if *samples > MAX_SERIES {
            return Err(EngineError::Exposition(format!("{name}: more than {MAX_SERIES} series")));
        }
        if lines.len() + line.len() >= MAX_FAMILY_BYTES {
            return Err(EngineError::Exposition(format!("{name}: more than {} KiB of lines", MAX_FAMILY_BYTES >> 10)));
        }
        // The parser ends lines at `\n` only: a `\r\n` line, or the last line
        // of a document without a final newline, is handed over ending in `\n`.
        let line = line.strip_suffix('\n').unwrap_or(line);
        lines.push_str(line.strip_suffix('\r').unwrap_or(line));
        lines.push('\n');
    }
    names.iter().zip(selected).map(|(&name, (lines, samples))| parse(name, &lines, samples)).collect()
}

/// The family a line belongs to and whether it is a sample (else a
/// `# HELP` or `# TYPE` line); `None` for other comments and blank lines.
fn family_of(line: &str) -> Option<(&str, bool)> {
    if let Some(comment) = line.strip_prefix('#') {
        let rest = comment.strip_prefix(" HELP ").or_else(|| comment.strip_prefix(" TYPE "))?;
        let end = rest.find([' ', '\t', '\r', '\n']).unwrap_or(rest.len());
        return Some((&rest[..end], false));
    }
    let end = line.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(line.len());
    // A name ends at its labels or at the blank before the value.
    matches!(line.as_bytes().get(end), Some(b'{' | b' ' | b'\t')).then(|| (&line[..end], true))
}

/// Parses one family's selected lines.
fn parse(name: &'static str, lines: &str, samples: usize) -> Result<Vec<Sample>, EngineError> {
    if samples == 0 {
        return Ok(Vec::new());
    }
    let invalid = |message: &dyn std::fmt::Display| EngineError::Exposition(format!("{name}: {}", one_line(message)));
    let scrape = Scrape::parse(lines).map_err(|e| match e {
        ScrapeParseError::Parse(message) => invalid(&message),
        ScrapeParseError::Collect(errors) => {
            invalid(&errors.first().map_or_else(String::new, |error| error.error.clone()))
        }
    })?;
    let mut out = Vec::with_capacity(samples);
    let mut seen = HashSet::with_capacity(samples);
    for metric in &scrape.metrics {
        if matches!(metric.kind, Type::Histogram | Type::Summary) {
            return Err(invalid(&format_args!("a {}, not a gauge", metric.kind)));
        }
        for sample in &metric.samples {
            let text: &str = &sample.value.value;
            let value = parse_float(text).ok_or_else(|| invalid(&format_args!("bad value {text:?}")))?;
            let mut labels = Vec::with_capacity(sample.labels.len());
            for label in sample.labels.iter() {
                let value = unescape(&label.value).ok_or_else(|| invalid(&"a bad escape in a label value"))?;
                labels.push((label.key.clone(), value));
            }
            labels.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            if labels.windows(2).any(|pair| pair[0].0 == pair[1].0) {
                return Err(invalid(&"a label repeated in one series"));
            }
            // A label with an empty value is no label (as in Prometheus).
            let identity: Vec<(String, String)> = labels.iter().filter(|(_, v)| !v.is_empty()).cloned().collect();
            if !seen.insert(identity) {
                return Err(invalid(&"a series given twice"));
            }
            out.push(Sample { labels, value });
        }
    }
    Ok(out)
}

/// A sample value as the text format writes it (Go's `ParseFloat`: also
/// `NaN`, `+Inf`, `-Inf`); `None` when Rust's parser refuses it (e.g. a Go
/// hex float: the text format does not allow one).
fn parse_float(text: &str) -> Option<f64> {
    text.parse().ok()
}

/// A label value with its escapes (`\\`, `\"`, `\n`) undone; `None` on
/// any other escape.
fn unescape(raw: &str) -> Option<String> {
    if !raw.contains('\\') {
        return Some(raw.to_owned());
    }
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        out.push(match chars.next()? {
            '\\' => '\\',
            '"' => '"',
            'n' => '\n',
            _ => return None,
        });
    }
    Some(out)
}

/// A parser message on one line, bounded (winnow's quote the offending input).
fn one_line(message: &dyn std::fmt::Display) -> String {
    let text = message.to_string();
    let words: Vec<&str> = text.split_whitespace().collect();
    super::cut(&words.join(" "), 240)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn family_of_names_samples_and_descriptors_only() {
        assert_eq!(family_of("vllm:a{x=\"1\"} 2\n"), Some(("vllm:a", true)));
        assert_eq!(family_of("vllm:a 2"), Some(("vllm:a", true)));
        assert_eq!(family_of("vllm:a\t2\n"), Some(("vllm:a", true)));
        assert_eq!(family_of("# HELP vllm:a Some help\n"), Some(("vllm:a", false)));
        assert_eq!(family_of("# TYPE vllm:a gauge\n"), Some(("vllm:a", false)));
        assert_eq!(family_of("# HELP vllm:a\n"), Some(("vllm:a", false)));
        assert_eq!(family_of("# a comment\n"), None);
        assert_eq!(family_of("\n"), None);
        assert_eq!(family_of("vllm:a\n"), None);
        assert_eq!(family_of("vllm:a-b 1\n"), None);
        assert_eq!(family_of(""), None);
    }

    #[test]
    fn read_takes_only_the_wanted_families_and_keeps_order() {
        let text = "# TYPE noise histogram\nnoise_bucket{le=\"1\"} 1\n\
                    b{r=\"1\"} 2\nb{r=\"0\"} 3\n# HELP a the a\na 4";
        let families = read(text, &["a", "b", "c"]).unwrap();
        assert_eq!(families.len(), 3);
        assert_eq!(families[0].len(), 1);
        assert_eq!(families[0][0].value, 4.0);
        let b: Vec<_> = families[1].iter().map(|s| (s.label("r"), s.value)).collect();
        assert_eq!(b, [(Some("1"), 2.0), (Some("0"), 3.0)]);
        assert!(families[2].is_empty());
    }

    #[test]
    fn a_bad_line_of_a_wanted_family_is_an_exposition_error_on_one_line() {
        let err = read("a{x=\"1} 2\n", &["a"]).unwrap_err();
        let EngineError::Exposition(message) = err else { panic!("{err:?}") };
        assert!(message.starts_with("a: ") && !message.contains('\n'), "{message}");
        assert!(matches!(read("a 1\na 2\n", &["a"]), Err(EngineError::Exposition(_))), "duplicate series");
        // A histogram's samples are named `a_bucket`, `a_count`, `a_sum`: not `a`.
        let histogram = "# TYPE a histogram\na_bucket{le=\"+Inf\"} 1\na_count 1\na_sum 1\n";
        assert!(read(histogram, &["a"]).unwrap()[0].is_empty());
        let not_a_gauge = read("# TYPE a summary\na_count 1\na_sum 1\na 2\n", &["a"]);
        assert!(matches!(not_a_gauge, Err(EngineError::Exposition(_))), "{not_a_gauge:?}");
    }

    #[test]
    fn too_many_series_or_bytes_are_refused() {
        let text: String = (0..MAX_SERIES).map(|i| format!("a{{i=\"{i}\"}} 1\n")).collect();
        assert_eq!(read(&text, &["a"]).unwrap()[0].len(), MAX_SERIES);
        let text = format!("{text}a{{i=\"x\"}} 1\n");
        assert!(matches!(read(&text, &["a"]), Err(EngineError::Exposition(m)) if m.contains("series")));
        let help = format!("# HELP a {}\n", "h".repeat(MAX_FAMILY_BYTES));
        assert!(matches!(read(&help, &["a"]), Err(EngineError::Exposition(m)) if m.contains("KiB")));
    }

    #[test]
    fn label_escapes_are_undone() {
        let families = read("a{x=\"q\\\"b\\\\s\\nn\"} 1\n", &["a"]).unwrap();
        assert_eq!(families[0][0].label("x"), Some("q\"b\\s\nn"));
        assert!(matches!(read("a{x=\"\\t\"} 1\n", &["a"]), Err(EngineError::Exposition(_))));
    }

    #[test]
    fn values_timestamps_and_descriptor_order() {
        let families =
            read("a{r=\"0\"} NaN\na{r=\"1\"} +Inf 1700000000000\na{r=\"2\"} -Inf\na{r=\"3\"} 1e3 -1\n", &["a"]);
        let values: Vec<f64> = families.unwrap()[0].iter().map(|s| s.value).collect();
        assert!(values[0].is_nan());
        assert_eq!(values[1..], [f64::INFINITY, f64::NEG_INFINITY, 1000.0]);
        for text in [
            "# TYPE a gauge\n# HELP a h\na 1\n",
            "# HELP a h\n# TYPE a gauge\na 1\n",
            "a 1\n# TYPE a gauge\na{x=\"1\"} 2\n",
        ] {
            assert!(!read(text, &["a"]).unwrap()[0].is_empty(), "{text}");
        }
        // Go's hex floats and other values Rust cannot read are errors, never panics.
        for text in ["a 0x1p-2\n", "a 1_0\n", "a 1 2 3\n", "a 1 99999999999999999999\n"] {
            assert!(matches!(read(text, &["a"]), Err(EngineError::Exposition(_))), "{text:?}");
        }
    }

    #[test]
    fn a_series_given_twice_is_refused_whatever_its_label_order() {
        let text = "a{x=\"1\",y=\"2\"} 1\n# TYPE a gauge\na{y=\"2\",x=\"1\"} 2\n";
        assert!(matches!(read(text, &["a"]), Err(EngineError::Exposition(m)) if m.contains("twice")));
        assert!(matches!(read("a{x=\"\"} 1\na 2\n", &["a"]), Err(EngineError::Exposition(_))));
        assert!(matches!(read("a{x=\"1\",x=\"2\"} 1\n", &["a"]), Err(EngineError::Exposition(_))));
    }
}
