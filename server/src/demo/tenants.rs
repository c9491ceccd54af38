//! `loadgate demo --tenants`: one tenant's flood against another's
//! trickle. At one load level, each tenant alone at its share of the rate,
//! then all of them together with the tenants file (the line shares its
//! dispatches among tenants by weight) and together without it (one
//! shared line); a table of each tenant's SLO goodput together against
//! alone, and the target: the smallest tenant keeps at least 90 %
//! of its goodput alone.

use std::fmt::Write as _;
use std::time::Duration;

use crate::demo::group::GroupRow;
use crate::demo::table::Run;
use crate::demo::tenant_shares::TenantShares;

/// The smallest tenant's SLO goodput together against alone, at least.
const SMALLEST_KEEPS: f64 = 0.90;

/// The runs of `demo --tenants`, and what they are measured against.
pub(crate) struct TenantResults {
    /// The measured (or given) capacity, req/s.
    pub(crate) capacity: f64,
    /// The offered load, x capacity.
    pub(crate) level: f64,
    /// The objective of SLO goodput (TTFT).
    pub(crate) objective: Duration,
    /// The line's timeout, ms.
    pub(crate) timeout_ms: u64,
    /// Each tenant alone at its share of the rate, in the mix's order.
    pub(crate) alone: Vec<Run>,
    /// All together, with the tenants file.
    pub(crate) together: Run,
    /// All together, without it: one shared line.
    pub(crate) line_only: Run,
}

impl TenantResults {
    /// What tenant `i` got alone, together and together in one line.
    fn rows(&self, i: usize) -> [Option<GroupRow>; 3] {
        [self.alone.get(i).and_then(|r| self.row(r, 0)), self.row(&self.together, i), self.row(&self.line_only, i)]
    }

    /// What the tenant at `index` of `run`'s mix got.
    fn row(&self, run: &Run, index: usize) -> Option<GroupRow> {
        let counts = run.report.by_tenant.as_ref()?.get(index)?;
        let duration = run.report.config.duration;
        Some(GroupRow::of(counts.sent, counts.ok, counts.rejected, &counts.ttft, duration, self.objective))
    }
}

/// `together / alone` SLO goodput (`None` when nothing met the objective alone).
fn ratio(alone: &Option<GroupRow>, together: &Option<GroupRow>) -> Option<f64> {
    let (alone, together) = (alone.as_ref()?, together.as_ref()?);
    (alone.slo_goodput > 0.0).then(|| together.slo_goodput / alone.slo_goodput)
}

fn cell(row: &Option<GroupRow>) -> String {
    match row {
        Some(r) => format!("{:>7.1}{:>7.1}", r.slo_goodput, r.rejected_pct),
        None => format!("{:>14}", "-"),
    }
}

fn ratio_cell(ratio: Option<f64>) -> String {
    ratio.map_or_else(|| format!("{:>7}", "-"), |r| format!("{r:>7.2}"))
}

/// The per-tenant table and the target.
pub(crate) fn tenant_table(results: &TenantResults, tenants: &TenantShares) -> String {
    let objective = results.objective.as_millis();
    let rate = results.level * results.capacity;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\ncapacity {:.1} req/s; objective: TTFT <= {objective} ms; load {}x = {rate:.1} req/s; \
         line: --router-queue-timeout-ms {}",
        results.capacity, results.level, results.timeout_ms
    );
    let _ = writeln!(
        out,
        "SLO/s: the tenant's requests completed with TTFT <= {objective} ms per second of arrivals; rej %: refused; \
         ratio: together / alone\nalone: the tenant's share of the load and no one else; together: every tenant, \
         with the tenants file (weight 1 each, the API key decides) or without it (one shared line)"
    );
    let _ = writeln!(
        out,
        "{:<12}{:>6}{:>8} | {:^14} | {:^21} | {:^21}",
        "tenant", "share", "req/s", "alone", "together, tenants", "together, line only"
    );
    let pair = format!("{:>7}{:>7}", "SLO/s", "rej %");
    let _ = writeln!(out, "{:<12}{:>6}{:>8} | {pair} | {pair}{:>7} | {pair}{:>7}", "", "", "offered", "ratio", "ratio");
    for i in 0..tenants.count() {
        let [alone, together, line_only] = results.rows(i);
        let _ = writeln!(
            out,
            "{:<12}{:>6.2}{:>8.1} | {} | {}{} | {}{}",
            tenants.name(i),
            tenants.share(i),
            rate * tenants.share(i),
            cell(&alone),
            cell(&together),
            ratio_cell(ratio(&alone, &together)),
            cell(&line_only),
            ratio_cell(ratio(&alone, &line_only)),
        );
    }
    // Every request has a tenant: the sums are the run's.
    let all = |rows: Vec<Option<GroupRow>>| {
        let rows: Vec<GroupRow> = rows.into_iter().flatten().collect();
        let sent: u64 = rows.iter().map(|r| r.sent).sum();
        let rejected: u64 = rows.iter().map(|r| r.rejected).sum();
        let slo: f64 = rows.iter().map(|r| r.slo_goodput).sum();
        let pct = if sent == 0 { 0.0 } else { 100.0 * rejected as f64 / sent as f64 };
        format!("{slo:>7.1}{pct:>7.1}{:>7}", "")
    };
    let together = all((0..tenants.count()).map(|i| results.row(&results.together, i)).collect());
    let line_only = all((0..tenants.count()).map(|i| results.row(&results.line_only, i)).collect());
    let _ = writeln!(out, "{:<12}{:>6.2}{rate:>8.1} | {:>14} | {together} | {line_only}", "all", 1.0, "-");
    out.push_str(&refusals(results, tenants));
    out.push_str(&target(results, tenants));
    out.lines().map(|line| format!("{}\n", line.trim_end())).collect()
}

/// Why each tenant was refused, in each run.
fn refusals(results: &TenantResults, tenants: &TenantShares) -> String {
    let mut lines = Vec::new();
    let runs = (0..tenants.count())
        .filter_map(|i| results.alone.get(i).map(|r| (format!("{} alone", tenants.name(i)), r, Some(0))))
        .chain([
            ("together, tenants".to_owned(), &results.together, None),
            ("together, line only".to_owned(), &results.line_only, None),
        ]);
    for (label, run, only) in runs {
        let Some(by_tenant) = &run.report.by_tenant else { continue };
        let mut why = Vec::new();
        for (i, counts) in by_tenant.iter().enumerate() {
            if counts.reasons.is_empty() || only.is_some_and(|o| o != i) {
                continue;
            }
            let reasons: Vec<String> = counts.reasons.iter().map(|(r, n)| format!("{r} {n}")).collect();
            let name = if only.is_some() { String::new() } else { format!("{} ", tenants.name(i)) };
            why.push(format!("{name}{}", reasons.join(", ")));
        }
        if !why.is_empty() {
            lines.push(format!("  {label}: {}", why.join("; ")));
        }
    }
    if lines.is_empty() {
        return String::new();
    }
    format!("refusals by x-loadgate-rejected-reason (- = none given):\n{}\n", lines.join("\n"))
}

/// The target for the smallest tenant, measured (not asserted),
/// and the same ratio without the tenants file.
fn target(results: &TenantResults, tenants: &TenantShares) -> String {
    let small = tenants.smallest();
    let [alone, together, line_only] = results.rows(small);
    let shown =
        |r: Option<f64>| r.map_or_else(|| "- (nothing met the objective alone)".to_owned(), |r| format!("{r:.2}"));
    let with = ratio(&alone, &together);
    let verdict = match with {
        Some(r) if r >= SMALLEST_KEEPS => "met",
        Some(_) => "MISSED",
        None => "not measured",
    };
    format!(
        "\nthe tenants against the issue's target (measured, not asserted):\n  {} tenant (the smallest share): SLO goodput \
         together / alone = {} (target >= {SMALLEST_KEEPS:.2}): {verdict}\n  without the tenants file (one shared \
         line): together / alone = {}\n",
        tenants.name(small),
        shown(with),
        shown(ratio(&alone, &line_only))
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loadgen::{report_for_test, ClassReport};

    /// A 10 s run whose tenants got `(sent, refused, TTFT ms of the accepted)` each.
    fn run(tenants: &[(u64, u64, u64)]) -> Run {
        let empty = hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3).unwrap();
        let mut report = report_for_test(Duration::from_secs(10), Duration::from_secs(11), empty, 0);
        report.by_tenant = Some(
            tenants
                .iter()
                .map(|&(sent, rejected, ms)| {
                    let mut counts = ClassReport { sent, ok: sent - rejected, rejected, ..Default::default() };
                    counts.ttft.record_n(ms * 1000, sent - rejected).unwrap();
                    if rejected > 0 {
                        counts.reasons.insert("deadline".to_owned(), rejected);
                    }
                    counts
                })
                .collect(),
        );
        Run { report }
    }

    fn results(small_together: (u64, u64, u64)) -> TenantResults {
        TenantResults {
            capacity: 36.0,
            level: 2.0,
            objective: Duration::from_millis(500),
            timeout_ms: 480,
            // big alone: 650 sent, 300 refused; small alone: 65, all within 40 ms.
            alone: vec![run(&[(650, 300, 300)]), run(&[(65, 0, 40)])],
            together: run(&[(655, 310, 300), small_together]),
            // One shared line: small is refused as often as big, or late.
            line_only: run(&[(655, 330, 300), (66, 33, 300)]),
        }
    }

    #[test]
    fn the_smallest_tenant_is_read_together_against_alone() {
        let tenants: TenantShares = "big=10,small=1".parse().unwrap();
        let text = tenant_table(&results((66, 2, 60)), &tenants);
        // small: 6.5/s alone, 6.4/s together (64 within 500 ms in 10 s), 3.3/s in one line.
        assert!(
            text.contains(
                "small tenant (the smallest share): SLO goodput together / alone = 0.98 (target >= 0.90): met"
            ),
            "{text}"
        );
        assert!(text.contains("without the tenants file (one shared line): together / alone = 0.51"), "{text}");
        assert!(
            text.contains(
                "small         0.09     6.5 |     6.5    0.0 |     6.4    3.0   0.98 |     3.3   50.0   0.51"
            ),
            "{text}"
        );
        assert!(text.contains("big           0.91    65.5 |    35.0   46.2 |    34.5   47.3   0.99 |"), "{text}");
        assert!(
            text.contains("all           1.00    72.0 |              - |    40.9   43.3        |    35.8   50.3"),
            "{text}"
        );
        assert!(text.contains("  big alone: deadline 300\n") && !text.contains("small alone"), "{text}");
        assert!(text.contains("  together, line only: big deadline 330; small deadline 33"), "{text}");

        let text = tenant_table(&results((66, 20, 60)), &tenants);
        assert!(text.contains("together / alone = 0.71 (target >= 0.90): MISSED"), "{text}");
        // Late is as bad as refused: accepted, but past the objective.
        let text = tenant_table(&results((66, 0, 600)), &tenants);
        assert!(text.contains("together / alone = 0.00 (target >= 0.90): MISSED"), "{text}");
    }

    #[test]
    fn nothing_within_the_objective_alone_is_not_a_ratio() {
        let tenants: TenantShares = "big=10,small=1".parse().unwrap();
        let mut r = results((66, 0, 60));
        r.alone[1] = run(&[(65, 0, 900)]);
        let text = tenant_table(&r, &tenants);
        assert!(text.contains("= - (nothing met the objective alone) (target >= 0.90): not measured"), "{text}");
    }
}
