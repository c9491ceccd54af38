//! What a run measured: [`BenchReport`] (per-status counts, hdrhistograms of
//! TTFT and latency, a per-second timeline), its [`Percentiles`], the `--json`
//! [`Summary`] and the table. Plain data: the run fills it, the table and the
//! plots read it.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use loadgate::Class;

use crate::loadgen::config::BenchConfig;

/// Microseconds histogram, 1 µs to 1 hour, 3 significant digits.
pub(crate) fn histogram(sigfig: u8) -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, sigfig).expect("valid histogram bounds")
}

/// The most distinct refusal reasons a report keeps apart (per run, per
/// class, per tenant); the frontend's own are a handful. Past it, a new one
/// counts under [`OTHER_REASONS`]: a server that names every refusal
/// differently cannot grow the report (and its `--json`) with every request.
pub const MAX_REASONS: usize = 64;

/// Where refusals count whose reason came after [`MAX_REASONS`] others.
pub const OTHER_REASONS: &str = "(other reasons)";

/// Counts one refusal of `reason` (`-` when none was given) into `reasons`,
/// at most [`MAX_REASONS`] of them apart.
pub(crate) fn count_reason(reasons: &mut BTreeMap<String, u64>, reason: Option<&str>) {
    let reason = reason.unwrap_or("-");
    let key = if reasons.len() < MAX_REASONS || reasons.contains_key(reason) { reason } else { OTHER_REASONS };
    *reasons.entry(key.to_owned()).or_default() += 1;
}

/// The most buckets a run's timeline holds: a run longer than this many
/// seconds gets wider buckets ([`bucket_width`]), so its memory (two
/// histograms a bucket, about 53 KiB) stays bounded whatever `--duration`.
pub const MAX_BUCKETS: u64 = 360;

/// The width of a timeline bucket for a run of `duration`: one second, or
/// the fewest whole seconds that keep the run within [`MAX_BUCKETS`].
pub fn bucket_width(duration: Duration) -> Duration {
    let seconds = duration.as_secs_f64().ceil() as u64;
    Duration::from_secs(seconds.div_ceil(MAX_BUCKETS).max(1))
}

/// Arrivals within one bucket of the timeline ([`BenchReport::bucket`] wide).
#[derive(Clone, Debug)]
pub struct TimeBucket {
    /// Requests that arrived in this bucket.
    pub sent: u64,
    /// Of those, accepted and completed (2xx).
    pub ok: u64,
    /// Of those, answered with a non-2xx status.
    pub rejected: u64,
    /// TTFT of accepted requests (µs).
    pub ttft: Histogram<u64>,
    /// End-to-end latency of accepted requests (µs).
    pub latency: Histogram<u64>,
}

impl TimeBucket {
    pub(crate) fn new() -> Self {
        TimeBucket { sent: 0, ok: 0, rejected: 0, ttft: histogram(2), latency: histogram(2) }
    }
}

/// Everything one run measured.
#[derive(Clone, Debug)]
pub struct BenchReport {
    /// The configuration that ran.
    pub config: BenchConfig,
    /// Requests sent.
    pub sent: u64,
    /// Answers per HTTP status.
    pub by_status: BTreeMap<u16, u64>,
    /// Connection failures, and arrivals not sent past `--max-in-flight`.
    pub transport_errors: u64,
    /// Requests abandoned at the drain deadline.
    pub unfinished: u64,
    /// Output tokens of accepted requests.
    pub output_tokens: u64,
    /// From the run's start (before its first arrival) to the last answer
    /// (or the drain deadline), at least the arrival window.
    pub elapsed: Duration,
    /// TTFT of accepted requests (µs).
    pub ttft: Histogram<u64>,
    /// End-to-end latency of accepted requests (µs).
    pub latency: Histogram<u64>,
    /// Buckets by arrival time, [`BenchReport::bucket`] wide.
    pub timeline: Vec<TimeBucket>,
    /// The width of a timeline bucket ([`bucket_width`] of the duration).
    pub bucket: Duration,
    /// Non-2xx answers per `x-loadgate-rejected-reason` (`-` when the answer had none; at most
    /// [`MAX_REASONS`] apart).
    pub rejected_reasons: BTreeMap<String, u64>,
    /// Per priority class, by [`Class::index`] (with `--mix`).
    pub by_class: Option<[ClassReport; Class::COUNT]>,
    /// Per tenant, by its index in the `--tenants` mix (with `--tenants`).
    pub by_tenant: Option<Vec<ClassReport>>,
}

/// p50 / p90 / p99 / max of a histogram, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Maximum.
    pub max: f64,
}

impl Percentiles {
    /// Reads the percentiles of a µs histogram (zeros when empty).
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Percentiles::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Percentiles {
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            max: ms(h.max()),
        }
    }
}

/// The machine-readable summary of a run (`--json`).
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Target URL.
    pub url: String,
    /// Offered rate, requests per second.
    pub rate: f64,
    /// Arrival window, seconds.
    pub duration_s: f64,
    /// Requests sent.
    pub sent: u64,
    /// Accepted and completed (2xx).
    pub ok: u64,
    /// Answered with a non-2xx status.
    pub rejected: u64,
    /// `rejected / sent`, percent.
    pub rejected_pct: f64,
    /// Connection failures, and arrivals not sent past `--max-in-flight`.
    pub transport_errors: u64,
    /// Abandoned at the drain deadline.
    pub unfinished: u64,
    /// Answers per status.
    pub by_status: BTreeMap<String, u64>,
    /// The run's start to its last answer (at least `duration_s`), seconds.
    pub elapsed_s: f64,
    /// Completed requests per second of `elapsed`.
    pub goodput_rps: f64,
    /// Output tokens of completed requests per second of `elapsed`.
    pub tokens_per_s: f64,
    /// TTFT of accepted requests, ms.
    pub ttft_ms: Percentiles,
    /// End-to-end latency of accepted requests, ms.
    pub latency_ms: Percentiles,
    /// The TTFT objective, ms (with `--slo-ttft-ms`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slo_ttft_ms: Option<u64>,
    /// Requests completed with TTFT within the objective per second of
    /// arrivals (with `--slo-ttft-ms`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slo_goodput_rps: Option<f64>,
    /// Per priority class (with `--mix`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by_class: Option<BTreeMap<&'static str, ClassSummary>>,
    /// Per tenant, by name (with `--tenants`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by_tenant: Option<BTreeMap<String, ClassSummary>>,
}

impl BenchReport {
    /// Accepted and completed requests.
    pub fn ok(&self) -> u64 {
        self.by_status.iter().filter(|(s, _)| (200..300).contains(*s)).map(|(_, n)| n).sum()
    }

    /// Requests answered with a non-2xx status.
    pub fn rejected(&self) -> u64 {
        self.by_status.values().sum::<u64>() - self.ok()
    }

    /// Completed requests per second.
    pub fn goodput(&self) -> f64 {
        self.ok() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Accepted and completed requests whose TTFT was at most `objective`
    /// (to the TTFT histogram's resolution, 0.1 %).
    pub fn ok_within_ttft(&self, objective: Duration) -> u64 {
        if self.ttft.is_empty() {
            return 0;
        }
        let limit = u64::try_from(objective.as_micros()).unwrap_or(u64::MAX).min(self.ttft.high());
        self.ttft.count_between(1, limit)
    }

    /// SLO goodput: requests that completed (2xx, whole answer) with TTFT
    /// within `objective`, per second of the arrival window. Counted per
    /// second of arrivals, not of the run's elapsed time, so a pool that
    /// serves every request it is offered on time scores the offered rate.
    pub fn slo_goodput(&self, objective: Duration) -> f64 {
        self.ok_within_ttft(objective) as f64 / self.config.duration.as_secs_f64().max(1e-9)
    }

    /// Percentage of sent requests refused.
    pub fn rejected_pct(&self) -> f64 {
        if self.sent == 0 {
            0.0
        } else {
            100.0 * self.rejected() as f64 / self.sent as f64
        }
    }

    /// The `--json` object.
    pub fn summary(&self) -> Summary {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        Summary {
            url: self.config.url.clone(),
            rate: self.config.rate,
            duration_s: self.config.duration.as_secs_f64(),
            sent: self.sent,
            ok: self.ok(),
            rejected: self.rejected(),
            rejected_pct: self.rejected_pct(),
            transport_errors: self.transport_errors,
            unfinished: self.unfinished,
            by_status: self.by_status.iter().map(|(s, n)| (s.to_string(), *n)).collect(),
            elapsed_s: secs,
            goodput_rps: self.goodput(),
            tokens_per_s: self.output_tokens as f64 / secs,
            ttft_ms: Percentiles::of(&self.ttft),
            latency_ms: Percentiles::of(&self.latency),
            slo_ttft_ms: self.config.slo_ttft.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            slo_goodput_rps: self.config.slo_ttft.map(|t| self.slo_goodput(t)),
            by_class: self
                .by_class
                .as_ref()
                .map(|by_class| Class::ALL.iter().map(|c| (c.label(), by_class[c.index()].summary())).collect()),
            by_tenant: self.by_tenant.as_ref().zip(self.config.tenants.as_ref()).map(|(by_tenant, tenants)| {
                by_tenant.iter().enumerate().map(|(i, t)| (tenants.name(i).to_owned(), t.summary())).collect()
            }),
        }
    }

    /// The human-readable final table.
    pub fn table(&self) -> String {
        let s = self.summary();
        let statuses: Vec<String> = s.by_status.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let row = |name: &str, p: Percentiles| {
            format!("{name:<9}{:>10.1}{:>10.1}{:>10.1}{:>10.1}\n", p.p50, p.p90, p.p99, p.max)
        };
        let mut out = String::new();
        out.push_str(&format!(
            "offered {:.1} req/s for {:.1} s to {} ({}stream)\n",
            s.rate,
            s.duration_s,
            s.url,
            if self.config.stream { "" } else { "no " }
        ));
        out.push_str(&format!(
            "sent {}  ok {}  rejected {} ({:.1} %)  transport errors {}  unfinished {}  [{}]\n",
            s.sent,
            s.ok,
            s.rejected,
            s.rejected_pct,
            s.transport_errors,
            s.unfinished,
            statuses.join(" ")
        ));
        out.push_str(&format!(
            "goodput {:.1} req/s  {:.0} tok/s  (elapsed {:.1} s)\n",
            s.goodput_rps, s.tokens_per_s, s.elapsed_s
        ));
        if let (Some(objective), Some(slo)) = (s.slo_ttft_ms, s.slo_goodput_rps) {
            out.push_str(&format!(
                "SLO goodput {slo:.1} req/s  (completed with TTFT within {objective} ms, per second of arrivals)\n"
            ));
        }
        out.push_str(&format!("{:<9}{:>10}{:>10}{:>10}{:>10}\n", "ms", "p50", "p90", "p99", "max"));
        out.push_str(&row("TTFT", s.ttft_ms));
        out.push_str(&row("latency", s.latency_ms));
        if let (Some(by_class), Some(mix)) = (&s.by_class, &self.config.mix) {
            let rows = Class::ALL.iter().map(|c| (c.label(), &by_class[c.label()]));
            group_block(&mut out, &format!("by class (--mix {mix})"), rows);
        }
        if let (Some(by_tenant), Some(tenants)) = (&s.by_tenant, &self.config.tenants) {
            let rows = (0..tenants.len()).map(|i| (tenants.name(i), &by_tenant[tenants.name(i)]));
            group_block(&mut out, &format!("by tenant (--tenants {tenants})"), rows);
        }
        out
    }
}

/// One block of the table: a line naming the groups, then a row per group
/// (its name, sent / ok / rejected, TTFT of accepted).
fn group_block<'a>(out: &mut String, title: &str, rows: impl Iterator<Item = (&'a str, &'a ClassSummary)> + Clone) {
    out.push_str(&format!("{title}: sent / ok / rejected, TTFT of accepted in ms\n"));
    let width = rows.clone().map(|(name, _)| name.len() + 1).max().unwrap_or(0).max(10);
    for (name, g) in rows {
        out.push_str(&format!(
            "{name:<width$}{:>7} /{:>7} /{:>7} ({:>5.1} %)  p50 {:>8.1}  p99 {:>8.1}\n",
            g.sent, g.ok, g.rejected, g.rejected_pct, g.ttft_ms.p50, g.ttft_ms.p99
        ));
    }
}

/// What one group of requests got: one priority class's (`--mix`) or one
/// tenant's (`--tenants`).
#[derive(Clone, Debug)]
pub struct ClassReport {
    /// Sent in this group.
    pub sent: u64,
    /// Accepted and completed (2xx).
    pub ok: u64,
    /// Answered with a non-2xx status.
    pub rejected: u64,
    /// TTFT of accepted requests (µs).
    pub ttft: Histogram<u64>,
    /// Refusals per `x-loadgate-rejected-reason` (`-` when none was given).
    pub reasons: BTreeMap<String, u64>,
}

impl Default for ClassReport {
    fn default() -> Self {
        ClassReport { sent: 0, ok: 0, rejected: 0, ttft: histogram(3), reasons: BTreeMap::new() }
    }
}

/// One class or tenant in the `--json` summary.
#[derive(Clone, Debug, Serialize)]
pub struct ClassSummary {
    /// Sent in this group.
    pub sent: u64,
    /// Accepted and completed.
    pub ok: u64,
    /// Refused (non-2xx).
    pub rejected: u64,
    /// `rejected / sent`, percent.
    pub rejected_pct: f64,
    /// TTFT of accepted requests, ms.
    pub ttft_ms: Percentiles,
    /// Refusals per reason.
    pub reasons: BTreeMap<String, u64>,
}

impl ClassReport {
    /// Counts one answer with HTTP `status` (its TTFT when accepted, its
    /// `x-loadgate-rejected-reason` when refused) into the group; `sent` is
    /// counted when the request leaves.
    pub(crate) fn count(&mut self, status: u16, ttft: Option<Duration>, reason: Option<&str>) {
        if (200..300).contains(&status) {
            self.ok += 1;
            if let Some(ttft) = ttft {
                self.ttft.saturating_record(ttft.as_micros().max(1) as u64);
            }
        } else {
            self.rejected += 1;
            count_reason(&mut self.reasons, reason);
        }
    }

    /// Its `--json` form.
    pub fn summary(&self) -> ClassSummary {
        let rejected_pct = if self.sent == 0 { 0.0 } else { 100.0 * self.rejected as f64 / self.sent as f64 };
        ClassSummary {
            sent: self.sent,
            ok: self.ok,
            rejected: self.rejected,
            rejected_pct,
            ttft_ms: Percentiles::of(&self.ttft),
            reasons: self.reasons.clone(),
        }
    }
}

/// A report for tests: `duration` of arrivals, `ok` requests accepted
/// with the TTFTs of `ttft` (µs; its latency the same), `rejected` refused
/// with reason `deadline`, answered over `elapsed`.
#[cfg(test)]
pub(crate) fn report_for_test(
    duration: Duration,
    elapsed: Duration,
    ttft: Histogram<u64>,
    rejected: u64,
) -> BenchReport {
    let config = BenchConfig {
        url: String::new(),
        model: String::new(),
        rate: 1.0,
        duration,
        prompt_tokens: 1,
        output_tokens: 1,
        stream: true,
        drain_timeout: Duration::ZERO,
        seed: 0,
        max_in_flight: crate::loadgen::config::DEFAULT_MAX_IN_FLIGHT,
        progress: false,
        mix: None,
        tenants: None,
        also: Vec::new(),
        slo_ttft: None,
        proxy_from_env: true,
    };
    let ok = ttft.len();
    BenchReport {
        config,
        sent: ok + rejected,
        by_status: [(200, ok), (529, rejected)].into_iter().filter(|(_, n)| *n > 0).collect(),
        transport_errors: 0,
        unfinished: 0,
        output_tokens: 0,
        elapsed,
        latency: ttft.clone(),
        ttft,
        timeline: Vec::new(),
        bucket: Duration::from_secs(1),
        rejected_reasons: [("deadline".to_owned(), rejected)].into_iter().filter(|r| r.1 > 0).collect(),
        by_class: None,
        by_tenant: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(ttfts_ms: &[u64], rejected: u64) -> BenchReport {
        let mut ttft = histogram(3);
        for ms in ttfts_ms {
            ttft.record(ms * 1000).unwrap();
        }
        report_for_test(Duration::from_secs(4), Duration::from_secs(10), ttft, rejected)
    }

    /// A run of up to `MAX_BUCKETS` seconds has one-second buckets; a
    /// longer one (up to a day, the longest `--duration`) the fewest whole
    /// seconds that keep it within `MAX_BUCKETS` buckets.
    #[test]
    fn the_timeline_holds_at_most_max_buckets() {
        let secs = Duration::from_secs_f64;
        for (duration, width) in [(0.5, 1), (1.0, 1), (360.0, 1), (360.5, 2), (720.0, 2), (721.0, 3), (86_400.0, 240)] {
            assert_eq!(bucket_width(secs(duration)), Duration::from_secs(width), "{duration} s");
        }
        for duration in [1.0, 359.9, 360.0, 361.0, 3_600.0, 10_001.0, 86_399.5, 86_400.0] {
            let buckets = (duration / bucket_width(secs(duration)).as_secs_f64()).ceil();
            assert!(buckets <= MAX_BUCKETS as f64, "{duration} s: {buckets} buckets");
        }
    }

    #[test]
    fn slo_goodput_counts_completions_within_the_objective_per_second_of_arrivals() {
        let r = report(&[10, 200, 500, 501, 3000, 40], 4);
        assert_eq!(r.ok_within_ttft(Duration::from_millis(500)), 4, "500 ms is within, 501 ms is not");
        assert_eq!(r.slo_goodput(Duration::from_millis(500)), 1.0, "4 in the 4 s window, not the 10 s elapsed");
        assert_eq!(r.ok_within_ttft(Duration::from_millis(5)), 0);
        assert_eq!(r.ok_within_ttft(Duration::from_secs(1 << 40)), 6, "a huge objective counts everything");
        assert_eq!(report(&[], 3).slo_goodput(Duration::from_millis(500)), 0.0);
    }

    /// With `--slo-ttft-ms` the table has an SLO goodput line and the JSON
    /// the objective and the figure; without, neither.
    #[test]
    fn slo_goodput_is_reported_with_an_objective_only() {
        let mut r = report(&[10, 200, 500, 501, 3000, 40], 4);
        assert!(!r.table().contains("SLO goodput"));
        let json = serde_json::to_value(r.summary()).unwrap();
        assert!(json.get("slo_ttft_ms").is_none() && json.get("slo_goodput_rps").is_none(), "{json}");
        r.config.slo_ttft = Some(Duration::from_millis(500));
        assert!(r.table().contains("SLO goodput 1.0 req/s  (completed with TTFT within 500 ms"), "{}", r.table());
        let json = serde_json::to_value(r.summary()).unwrap();
        assert_eq!((json["slo_ttft_ms"].as_u64(), json["slo_goodput_rps"].as_f64()), (Some(500), Some(1.0)), "{json}");
    }

    /// `report_for_test` with `--mix` and `--tenants` (`a=3,team-b=1`):
    /// critical 2 sent, 1 ok at 10 ms and 1 refused (`class_shed`), the
    /// others none; tenant `a` 3 sent, ok at 10, 20 and 30 ms, `team-b` 2
    /// sent, both refused (`tenant_quota`, and one without a reason).
    fn grouped() -> BenchReport {
        let mut r = report(&[10, 20, 30], 2);
        r.config.mix = Some("critical=1,standard=1".parse().unwrap());
        r.config.tenants = Some("a=3,team-b=1".parse().unwrap());
        let mut by_class: [ClassReport; Class::COUNT] = Default::default();
        let critical = &mut by_class[Class::Critical.index()];
        critical.sent = 2;
        critical.count(200, Some(Duration::from_millis(10)), None);
        critical.count(529, None, Some("class_shed"));
        r.by_class = Some(by_class);
        let mut by_tenant = vec![ClassReport::default(), ClassReport::default()];
        by_tenant[0].sent = 3;
        for ms in [10, 20, 30] {
            by_tenant[0].count(200, Some(Duration::from_millis(ms)), None);
        }
        by_tenant[1].sent = 2;
        by_tenant[1].count(529, None, Some("tenant_quota"));
        by_tenant[1].count(503, None, None);
        r.by_tenant = Some(by_tenant);
        r
    }

    #[test]
    fn reasons_past_the_most_kept_apart_count_together() {
        let mut reasons = BTreeMap::new();
        for i in 0..MAX_REASONS + 10 {
            count_reason(&mut reasons, Some(&format!("r{i}")));
        }
        count_reason(&mut reasons, Some("r0"));
        count_reason(&mut reasons, None);
        assert_eq!(reasons.len(), MAX_REASONS + 1, "{reasons:?}");
        assert_eq!((reasons["r0"], reasons[OTHER_REASONS]), (2, 11));
        assert_eq!(reasons.values().sum::<u64>(), MAX_REASONS as u64 + 12);
    }

    #[test]
    fn the_table_has_a_tenant_block_after_the_class_block() {
        let table = grouped().table();
        let classes = table.find("by class (--mix critical=0.50,standard=0.50,sheddable=0.00): ").expect(&table);
        let tenants = table.find("by tenant (--tenants a=0.75,team-b=0.25): sent / ok / rejected").expect(&table);
        assert!(classes < tenants, "{table}");
        let rows: Vec<&str> = table[tenants..].lines().skip(1).collect();
        assert_eq!(rows.len(), 2, "{table}");
        assert!(rows[0].starts_with("a         ") && rows[0].contains("3 /      3 /      0 (  0.0 %)"), "{table}");
        assert!(rows[0].contains("p50     20.0  p99     30.0"), "{table}");
        assert!(rows[1].starts_with("team-b    ") && rows[1].contains("2 /      0 /      2 (100.0 %)"), "{table}");
        let plain = report(&[10], 0).table();
        assert!(!plain.contains("by tenant") && !plain.contains("by class"), "{plain}");
    }

    #[test]
    fn a_long_tenant_name_widens_its_block_only() {
        let long = "t".repeat(64);
        let mut r = report(&[10], 0);
        r.config.tenants = Some(format!("{long}=1,b=1").parse().unwrap());
        r.by_tenant = Some(vec![ClassReport::default(), ClassReport::default()]);
        let table = r.table();
        let row = table.lines().find(|l| l.starts_with(&long)).expect(&table);
        let b = table.lines().find(|l| l.starts_with("b ")).expect(&table);
        assert_eq!(row.len(), b.len(), "the columns line up:\n{table}");
    }

    #[test]
    fn the_json_has_by_tenant_only_with_tenants() {
        let json = serde_json::to_value(grouped().summary()).unwrap();
        assert_eq!(
            json["by_tenant"]["team-b"],
            serde_json::json!({
                "sent": 2, "ok": 0, "rejected": 2, "rejected_pct": 100.0,
                "ttft_ms": {"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0},
                "reasons": {"-": 1, "tenant_quota": 1},
            })
        );
        let a = &json["by_tenant"]["a"];
        assert_eq!((a["sent"].as_u64(), a["ok"].as_u64(), a["rejected"].as_u64()), (Some(3), Some(3), Some(0)));
        let p50 = a["ttft_ms"]["p50"].as_f64().unwrap();
        assert!((20.0..20.1).contains(&p50), "20 ms to the histogram's resolution: {p50}");
        assert_eq!(a["reasons"], serde_json::json!({}));
        assert_eq!(json["by_tenant"].as_object().unwrap().len(), 2);
        assert_eq!(json["by_class"]["critical"]["reasons"], serde_json::json!({"class_shed": 1}));
        let plain = serde_json::to_value(report(&[10], 0).summary()).unwrap();
        assert!(plain.get("by_tenant").is_none() && plain.get("by_class").is_none(), "{plain}");
    }
}
