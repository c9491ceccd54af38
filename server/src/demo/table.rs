//! The demo's results: one [`Run`] per load level and shedding setting, the
//! side-by-side table, and the verdict on the effect the demo exists to show.

use crate::demo::args::LEVELS;
use crate::loadgen::plot::LoadPoint;
use crate::loadgen::{BenchReport, Percentiles};

/// One row of the table: one load level, one shedding setting.
pub(crate) struct Run {
    pub(crate) report: BenchReport,
}

impl Run {
    pub(crate) fn point(&self, multiple: f64) -> LoadPoint {
        LoadPoint {
            multiple,
            goodput: self.report.goodput(),
            rejected_pct: self.report.rejected_pct(),
            p99_ttft_ms: Percentiles::of(&self.report.ttft).p99,
            p99_latency_ms: Percentiles::of(&self.report.latency).p99,
        }
    }
}

/// The side-by-side table; `shedding` is the flag of the shedding runs.
pub(crate) fn table(capacity: f64, shedding: &str, off: &[Run], on: &[Run]) -> String {
    let mut out = String::new();
    out.push_str(&format!("\ncapacity {capacity:.1} req/s; accepted requests only for TTFT and latency (ms)\n"));
    out.push_str(&format!(
        "{:<6}{:>8} | {:^52} | {:^52}\n",
        "load",
        "req/s",
        "shedding off",
        format!("shedding on ({shedding})")
    ));
    let head =
        format!("{:>8}{:>7}{:>9}{:>9}{:>9}{:>10}", "goodput", "rej %", "TTFT p50", "TTFT p99", "lat p50", "lat p99");
    out.push_str(&format!("{:<6}{:>8} | {head} | {head}\n", "", "offered"));
    for ((multiple, off), on) in LEVELS.iter().zip(off).zip(on) {
        let cell = |r: &BenchReport| {
            let (t, l) = (Percentiles::of(&r.ttft), Percentiles::of(&r.latency));
            format!(
                "{:>8.1}{:>7.1}{:>9.0}{:>9.0}{:>9.0}{:>10.0}",
                r.goodput(),
                r.rejected_pct(),
                t.p50,
                t.p99,
                l.p50,
                l.p99
            )
        };
        out.push_str(&format!(
            "{:<6}{:>8.1} | {} | {}\n",
            format!("{multiple}x"),
            multiple * capacity,
            cell(&off.report),
            cell(&on.report)
        ));
    }
    out
}

/// The report of the run at `multiple` x capacity.
fn at(runs: &[Run], multiple: f64) -> Option<&BenchReport> {
    runs.iter().zip(LEVELS).find(|(_, l)| *l == multiple).map(|(r, _)| &r.report)
}

/// What shedding costs at 1x: the share it refuses of a load the pool could serve.
pub(crate) fn rejected_at_capacity(on: &[Run]) -> String {
    at(on, 1.0).map_or_else(String::new, |r| format!("at 1x: rejected with shedding {:.1} %\n", r.rejected_pct()))
}

/// Checks the effect the demo exists to show, at 2x capacity.
pub(crate) fn verdict(off: &[Run], on: &[Run]) -> String {
    let (Some(off2), Some(on2), Some(off1)) = (at(off, 2.0), at(on, 2.0), at(off, 1.0)) else {
        return String::new();
    };
    let p99 = |r: &BenchReport| Percentiles::of(&r.ttft).p99;
    let ttft_ratio = p99(on2) / p99(off2).max(1e-9);
    let goodput_ratio = on2.goodput() / off1.goodput().max(1e-9);
    let mark = |ok: bool| if ok { "yes" } else { "NO" };
    format!(
        "\nat 2x: p99 TTFT with shedding / without = {:.0} / {:.0} ms = {ttft_ratio:.3} (<= 0.2: {})\n\
         at 2x: goodput with shedding / goodput at 1x = {:.1} / {:.1} = {goodput_ratio:.2} (>= 0.9: {})\n",
        p99(on2),
        p99(off2),
        mark(ttft_ratio <= 0.2),
        on2.goodput(),
        off1.goodput(),
        mark(goodput_ratio >= 0.9),
    )
}
