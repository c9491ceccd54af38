//! `loadgate demo --mix`: priority classes under overload. One mode —
//! static thresholds with the waiting line, `x-loadgate-priority` trusted —
//! at every level, each request's class drawn with the mix's shares; a
//! table per class (refused, TTFT, SLO goodput) and the targets:
//! at 3x critical requests are (almost) never refused and keep their 0.5x
//! p99 TTFT within 1.2x, and the sheddable ones take the refusals first.

use std::time::Duration;

use loadgate::{Class, PerClass};

use crate::demo::args::LEVELS;
use crate::demo::group::GroupRow;
use crate::demo::table::Run;
use crate::loadgen::ClassMix;

/// At 3x: the most of critical requests refused, percent.
const CRITICAL_REFUSED_PCT: f64 = 0.1;
/// At 3x: critical p99 TTFT against its own at 0.5x, at most.
const CRITICAL_P99_RATIO: f64 = 1.2;

/// What `class` got in `run` (`None` without a class mix).
fn row(run: &Run, class: Class, objective: Duration) -> Option<GroupRow> {
    let counts = &run.report.by_class.as_ref()?[class.index()];
    Some(GroupRow::of(counts.sent, counts.ok, counts.rejected, &counts.ttft, run.report.config.duration, objective))
}

/// The per-class table of `runs` (one per [`LEVELS`]) and the targets.
pub(crate) fn class_table(
    runs: &[Run],
    mix: &ClassMix,
    capacity: f64,
    objective: Duration,
    timeouts: PerClass<u64>,
) -> String {
    let mut out = format!(
        "\ncapacity {capacity:.1} req/s; objective: TTFT <= {} ms; mix {mix}; line: --router-queue-timeout-ms {timeouts} \
         --trust-priority-header\nper class: sent, rej % refused, p50/p99 TTFT of accepted (ms), SLO/s: SLO goodput\n",
        objective.as_millis()
    );
    out.push_str(&format!("{:<6}", "load"));
    for class in Class::ALL {
        out.push_str(&format!("| {:<36}", class.label()));
    }
    out.push('\n');
    out.push_str(&format!("{:<6}", ""));
    for _ in Class::ALL {
        out.push_str(&format!("| {:>5} {:>6} {:>6} {:>6} {:>7}  ", "sent", "rej %", "p50", "p99", "SLO/s"));
    }
    out.push('\n');
    for (multiple, run) in LEVELS.iter().zip(runs) {
        out.push_str(&format!("{:<6}", format!("{multiple}x")));
        for class in Class::ALL {
            match row(run, class, objective) {
                Some(r) => out.push_str(&format!(
                    "| {:>5} {:>6.1} {:>6.0} {:>6.0} {:>7.1}  ",
                    r.sent, r.rejected_pct, r.ttft.p50, r.ttft.p99, r.slo_goodput
                )),
                None => out.push_str(&format!("| {:<36}", "-")),
            }
        }
        out.push('\n');
    }
    out.push_str("refusals by x-loadgate-rejected-reason:\n");
    for (multiple, run) in LEVELS.iter().zip(runs) {
        let Some(by_class) = &run.report.by_class else { continue };
        let classes: Vec<String> = Class::ALL
            .iter()
            .filter(|c| !by_class[c.index()].reasons.is_empty())
            .map(|c| {
                let reasons: Vec<String> =
                    by_class[c.index()].reasons.iter().map(|(r, n)| format!("{r} {n}")).collect();
                format!("{c} {}", reasons.join(", "))
            })
            .collect();
        if !classes.is_empty() {
            out.push_str(&format!("  {multiple}x: {}\n", classes.join("; ")));
        }
    }
    out.push_str(&targets(runs, objective));
    out
}

/// The targets, measured (not asserted).
fn targets(runs: &[Run], objective: Duration) -> String {
    let at = |multiple: f64, class| {
        LEVELS.iter().position(|l| *l == multiple).and_then(|i| runs.get(i)).and_then(|r| row(r, class, objective))
    };
    let verdict = |met: bool| if met { "met" } else { "MISSED" };
    let mut out = String::from("\nthe classes against the issue's targets (measured, not asserted):\n");
    if let (Some(low), Some(high)) = (at(0.5, Class::Critical), at(3.0, Class::Critical)) {
        // A request that got no answer is no better than a refused one.
        let refused = match high.unanswered_pct > 0.0 {
            true => format!("{:.2} % (and {:.2} % unanswered)", high.rejected_pct, high.unanswered_pct),
            false => format!("{:.2} %", high.rejected_pct),
        };
        out.push_str(&format!(
            "  3x: critical refused {refused} (target <= {CRITICAL_REFUSED_PCT} %: {})\n",
            verdict(high.rejected_pct + high.unanswered_pct <= CRITICAL_REFUSED_PCT)
        ));
        // None accepted: no p99 to meet the target with (an empty histogram's reads 0).
        let ratio = high.ttft.p99 / low.ttft.p99.max(1e-9);
        let p99 = match high.ok {
            0 => "none accepted".to_owned(),
            _ => format!("{:.0} ms / its 0.5x p99 {:.0} ms = {ratio:.2}", high.ttft.p99, low.ttft.p99),
        };
        out.push_str(&format!(
            "  3x: critical p99 TTFT {p99} (target <= {CRITICAL_P99_RATIO}: {})\n",
            verdict(high.ok > 0 && ratio <= CRITICAL_P99_RATIO)
        ));
    }
    // Sheddable first: at every level, a lower class is refused at least as
    // often as a higher one.
    let ordered = LEVELS.iter().all(|m| {
        let pct = |c| at(*m, c).map_or(0.0, |r| r.rejected_pct);
        pct(Class::Sheddable) >= pct(Class::Standard) && pct(Class::Standard) >= pct(Class::Critical)
    });
    out.push_str(&format!(
        "  every level: refused % sheddable >= standard >= critical (sheddable takes the refusals first: {})\n",
        verdict(ordered)
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loadgen::{report_for_test, ClassReport};

    /// A run whose classes got `(sent, rejected, p99 TTFT ms)` each.
    fn run(classes: [(u64, u64, u64); 3]) -> Run {
        let empty = hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3).unwrap();
        let mut report = report_for_test(Duration::from_secs(10), Duration::from_secs(11), empty, 0);
        report.by_class = Some(classes.map(|(sent, rejected, ms)| {
            let mut counts = ClassReport { sent, ok: sent - rejected, rejected, ..Default::default() };
            counts.ttft.record_n(ms * 1000, sent - rejected).unwrap();
            counts
        }));
        Run { report }
    }

    /// Runs at every level that meet every target.
    fn good() -> [Run; 4] {
        [
            run([(50, 0, 30), (60, 0, 30), (40, 0, 30)]),
            run([(90, 0, 33), (110, 0, 60), (70, 7, 90)]),
            run([(180, 0, 34), (230, 100, 90), (170, 160, 90)]),
            run([(240, 0, 35), (350, 250, 90), (260, 255, 90)]),
        ]
    }

    #[test]
    fn the_targets_read_critical_at_3x_against_its_half_load_p99_and_the_order_of_refusals() {
        let good = good();
        let mix: ClassMix = "critical=3,standard=4,sheddable=3".parse().unwrap();
        let text = class_table(&good, &mix, 36.0, Duration::from_millis(500), PerClass::all(480));
        assert!(text.contains("3x: critical refused 0.00 % (target <= 0.1 %: met)"), "{text}");
        assert!(text.contains("= 1.17 (target <= 1.2: met)"), "{text}");
        assert!(text.contains("(sheddable takes the refusals first: met)"), "{text}");
        let mut bad = good;
        bad[3] = run([(240, 1, 37), (350, 250, 90), (260, 200, 90)]);
        bad[1] = run([(90, 0, 33), (110, 9, 60), (70, 5, 90)]);
        let text = class_table(&bad, &mix, 36.0, Duration::from_millis(500), PerClass::all(480));
        assert!(text.contains("critical refused 0.42 % (target <= 0.1 %: MISSED)"), "{text}");
        assert!(text.contains("(target <= 1.2: MISSED)"), "{text}");
        assert!(text.contains("(sheddable takes the refusals first: MISSED)"), "{text}");
    }

    /// A critical class at 3x that got no answer (its requests still
    /// waiting at the drain deadline, as with a critical timeout longer
    /// than the drain, or cut off) was "refused 0.00 %" with a p99 TTFT of
    /// 0 ms (an empty histogram's): both critical targets read met.
    #[test]
    fn a_critical_class_that_got_no_answer_does_not_meet_its_targets() {
        let mut runs = good();
        let critical = &mut runs[3].report.by_class.as_mut().unwrap()[Class::Critical.index()];
        (critical.ok, critical.ttft) = (0, hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3).unwrap());
        let mix: ClassMix = "critical=3,standard=4,sheddable=3".parse().unwrap();
        let text = class_table(&runs, &mix, 36.0, Duration::from_millis(500), PerClass::all(480));
        let line = |prefix: &str| text.lines().find(|l| l.trim_start().starts_with(prefix)).unwrap().to_owned();
        assert!(line("3x: critical refused").ends_with("(target <= 0.1 %: MISSED)"), "{text}");
        assert!(line("3x: critical refused").contains("0.00 % (and 100.00 % unanswered)"), "{text}");
        assert!(line("3x: critical p99").ends_with("(target <= 1.2: MISSED)"), "{text}");
        assert!(line("3x: critical p99").contains("none accepted"), "{text}");
    }
}
