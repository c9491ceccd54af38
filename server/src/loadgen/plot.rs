//! SVG charts of benchmark runs (plotters, SVG backend only): one run's
//! latency percentiles and rejection rate over time, and the demo's
//! comparison of its modes (no shedding, static thresholds, thresholds with
//! a waiting line) across load levels.

use std::os::unix::fs::FileTypeExt as _;
use std::path::Path;

use anyhow::Context as _;
use plotters::prelude::*;

use crate::loadgen::report::{BenchReport, Percentiles};

const OFF: RGBColor = RGBColor(200, 40, 40);
const ON: RGBColor = RGBColor(30, 100, 200);
const GREY: RGBColor = RGBColor(120, 120, 120);

fn legend(color: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
}

/// Checks, before a run, that a plot can be written at `path`, so that a
/// run of minutes does not end in that error: not a directory, not a named
/// pipe (opening one nobody reads waits without end), and a file opens
/// there for writing. A file it had to create is removed again; one that
/// was there is left as it was.
///
/// # Errors
///
/// `path` is a directory or a named pipe, or no file can be written there
/// (no such directory, no permission).
pub fn check_writable(path: &Path) -> anyhow::Result<()> {
    let what = || format!("cannot write the plot {}", path.display());
    anyhow::ensure!(!path.is_dir(), "{}: it is a directory", what());
    let fifo = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo());
    anyhow::ensure!(!fifo, "{}: it is a named pipe (an SVG file is written there)", what());
    let existed = path.exists();
    std::fs::OpenOptions::new().append(true).create(true).open(path).with_context(what)?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Draws `report`'s p50 / p99 TTFT and p99 latency of accepted requests, and
/// its rejection rate, per timeline bucket (by arrival), into an SVG file.
///
/// # Errors
///
/// The file cannot be written.
pub fn timeline(path: &Path, report: &BenchReport) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (900, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(400);
    let width = report.bucket.as_secs_f64();
    let seconds = report.timeline.len().max(1) as f64 * width;
    // A bucket's point at its middle, in seconds.
    let at = |i: usize| (i as f64 + 0.5) * width;
    let per_bucket: Vec<(f64, Percentiles, Percentiles)> = report
        .timeline
        .iter()
        .enumerate()
        .map(|(i, b)| (at(i), Percentiles::of(&b.ttft), Percentiles::of(&b.latency)))
        .collect();
    let by = match report.bucket.as_secs() {
        1 => "by arrival second".to_owned(),
        n => format!("by arrival, in {n} s buckets"),
    };
    let y_max = per_bucket.iter().map(|(_, t, l)| t.p99.max(l.p99)).fold(1.0, f64::max) * 1.5;

    let mut chart = ChartBuilder::on(&top)
        .caption(format!("Accepted requests, {by}"), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..seconds, (0.1f64..y_max).log_scale())?;
    chart.configure_mesh().x_desc("seconds").y_desc("ms (log)").draw()?;
    let series = [
        ("TTFT p50", GREY, (|t: &Percentiles, _: &Percentiles| t.p50) as fn(&Percentiles, &Percentiles) -> f64),
        ("TTFT p99", OFF, |t, _| t.p99),
        ("latency p99", ON, |_, l| l.p99),
    ];
    for (name, color, pick) in series {
        let points = per_bucket.iter().filter(|(_, t, _)| t.max > 0.0).map(|(x, t, l)| (*x, pick(t, l).max(0.1)));
        chart.draw_series(LineSeries::new(points, color.stroke_width(2)))?.label(name).legend(legend(color));
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;

    let mut chart = ChartBuilder::on(&bottom)
        .caption("Rejected (non-2xx), % of arrivals", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..seconds, 0f64..100f64)?;
    chart.configure_mesh().x_desc("seconds").y_desc("%").draw()?;
    let points = report
        .timeline
        .iter()
        .enumerate()
        .filter(|(_, b)| b.sent > 0)
        .map(|(i, b)| (at(i), 100.0 * b.rejected as f64 / b.sent as f64));
    chart.draw_series(LineSeries::new(points, OFF.stroke_width(2)))?;
    root.present()?;
    Ok(())
}

/// One load level of the demo, for one mode.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadPoint {
    /// Offered load as a multiple of capacity.
    pub multiple: f64,
    /// Requests completed with TTFT within the objective, per second of arrivals.
    pub slo_goodput: f64,
    /// Percent of requests refused.
    pub rejected_pct: f64,
    /// p99 TTFT of accepted requests, ms.
    pub p99_ttft_ms: f64,
}

/// What the demo's comparison is drawn against.
#[derive(Clone, Debug)]
pub struct Headline {
    /// Lines of text above the panels (the configuration).
    pub lines: Vec<String>,
    /// The measured capacity, req/s (a dashed line in the goodput panel).
    pub capacity: f64,
    /// The TTFT objective, ms (a dashed line in the TTFT panel).
    pub objective_ms: f64,
}

/// The colours of up to three modes, in order.
const MODE_COLORS: [RGBColor; 3] = [OFF, ON, RGBColor(20, 150, 70)];
const LIGHT_GRID: RGBColor = RGBColor(238, 238, 238);
const BOLD_GRID: RGBColor = RGBColor(215, 215, 215);

fn circle<C>(c: C, color: RGBColor) -> Circle<C, i32> {
    Circle::new(c, 4, color.filled())
}

fn triangle<C>(c: C, color: RGBColor) -> TriangleMarker<C, i32> {
    TriangleMarker::new(c, 6, color.filled())
}

fn cross<C>(c: C, color: RGBColor) -> Cross<C, i32> {
    Cross::new(c, 5, color.stroke_width(2))
}

/// The plot's font at `size` points.
fn font(size: u32) -> (&'static str, u32) {
    ("sans-serif", size)
}

/// One panel's grid, axes and labels, alike in every panel.
macro_rules! style_mesh {
    ($chart:expr, $x_desc:expr, $y_desc:expr, $times:expr) => {
        $chart
            .configure_mesh()
            .light_line_style(LIGHT_GRID)
            .bold_line_style(BOLD_GRID)
            .x_desc($x_desc)
            .y_desc($y_desc)
            .x_label_formatter($times)
            .y_label_formatter(&|v| format!("{v:.0}"))
            .axis_desc_style(font(14))
            .label_style(font(12))
            .draw()?
    };
}

/// One panel's legend at `$position`, alike in every panel.
macro_rules! style_legend {
    ($chart:expr, $position:expr) => {
        $chart
            .configure_series_labels()
            .position($position)
            .background_style(WHITE.mix(0.85))
            .border_style(BOLD_GRID)
            .label_font(font(13))
            .draw()?
    };
}

/// Draws every mode's `value` as a line with point markers (mode `i` in
/// `MODE_COLORS[i]`, with a circle, a triangle or a cross), legend included.
macro_rules! draw_modes {
    ($chart:expr, $modes:expr, $value:expr) => {
        for (i, (label, points)) in $modes.iter().enumerate() {
            let line: Vec<(f64, f64)> = points.iter().map(|p| (p.multiple, $value(p))).collect();
            let color = MODE_COLORS[i % MODE_COLORS.len()];
            macro_rules! with_marker {
                ($marker:ident) => {{
                    $chart
                        .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))?
                        .label(label.as_str())
                        .legend(move |(x, y)| {
                            EmptyElement::at((x, y))
                                + PathElement::new(vec![(0, 0), (24, 0)], color.stroke_width(2))
                                + $marker((12, 0), color)
                        });
                    $chart.draw_series(line.iter().map(|p| $marker(*p, color)))?;
                }};
            }
            match i % MODE_COLORS.len() {
                0 => with_marker!(circle),
                1 => with_marker!(triangle),
                _ => with_marker!(cross),
            }
        }
    };
}

/// Draws the demo's comparison of its modes (`modes`: a label and one point
/// per load level each): SLO goodput, p99 TTFT of accepted requests and the
/// share refused, against offered load, under a headline with the
/// configuration.
///
/// # Errors
///
/// The file cannot be written.
pub fn comparison(path: &Path, headline: &Headline, modes: &[(String, Vec<LoadPoint>)]) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1500, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let top = 16 + 22 * headline.lines.len() as i32;
    let (head, body) = root.split_vertically(top);
    for (i, line) in headline.lines.iter().enumerate() {
        let size = if i == 0 { 19 } else { 15 };
        head.draw_text(line, &("sans-serif", size).into_font().color(&BLACK), (16, 8 + 22 * i as i32))?;
    }
    let panels = body.split_evenly((1, 3));
    let all = || modes.iter().flat_map(|(_, p)| p.iter());
    let x_max = all().map(|p| p.multiple).fold(1.0, f64::max) + 0.25;
    let x_desc = "offered load (x measured capacity)";
    let times = |v: &f64| format!("{v}x");

    let y_max = all().map(|p| p.slo_goodput).fold(headline.capacity, f64::max).max(1.0) * 1.25;
    let mut chart = ChartBuilder::on(&panels[0])
        .caption("SLO goodput (higher is better)", font(17))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(62)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    style_mesh!(chart, x_desc, "TTFT within the objective (req/s)", &times);
    let capacity = [(0.0, headline.capacity), (x_max, headline.capacity)];
    chart
        .draw_series(DashedLineSeries::new(capacity, 6, 4, GREY.stroke_width(1)))?
        .label(format!("capacity {:.1} req/s", headline.capacity))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], GREY.stroke_width(1)));
    draw_modes!(chart, modes, |p: &LoadPoint| p.slo_goodput);
    style_legend!(chart, SeriesLabelPosition::LowerLeft);

    let ttfts = || all().map(|p| p.p99_ttft_ms).filter(|v| *v > 0.0);
    let lo = ttfts().fold(headline.objective_ms, f64::min).max(1.0) / 2.0;
    let hi = ttfts().fold(headline.objective_ms, f64::max) * 2.5;
    let mut chart = ChartBuilder::on(&panels[1])
        .caption("p99 TTFT of accepted requests (lower is better)", font(17))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(62)
        .build_cartesian_2d(0f64..x_max, (lo..hi).log_scale())?;
    style_mesh!(chart, x_desc, "p99 TTFT (ms, log scale)", &times);
    let objective = [(0.0, headline.objective_ms), (x_max, headline.objective_ms)];
    chart
        .draw_series(DashedLineSeries::new(objective, 6, 4, GREY.stroke_width(1)))?
        .label(format!("objective {:.0} ms", headline.objective_ms))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], GREY.stroke_width(1)));
    draw_modes!(chart, modes, |p: &LoadPoint| p.p99_ttft_ms.max(lo));
    style_legend!(chart, SeriesLabelPosition::UpperLeft);

    let mut chart = ChartBuilder::on(&panels[2])
        .caption("requests refused", font(17))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(62)
        .build_cartesian_2d(0f64..x_max, 0f64..100f64)?;
    style_mesh!(chart, x_desc, "refused (% of requests)", &times);
    draw_modes!(chart, modes, |p: &LoadPoint| p.rejected_pct);
    style_legend!(chart, SeriesLabelPosition::UpperLeft);
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::loadgen::report::{histogram, report_for_test, TimeBucket, MAX_BUCKETS};

    /// A day-long run's timeline, in its wide buckets, is drawn over the
    /// whole day and says how wide its buckets are.
    #[test]
    fn a_long_run_is_drawn_in_its_buckets() {
        let mut report = report_for_test(Duration::from_secs(86_400), Duration::from_secs(86_400), histogram(3), 0);
        report.bucket = Duration::from_secs(240);
        report.timeline = (0..MAX_BUCKETS)
            .map(|i| {
                let mut bucket = TimeBucket::new();
                bucket.sent = 10;
                bucket.ok = 10;
                bucket.ttft.record(1_000 + i).unwrap();
                bucket.latency.record(5_000 + i).unwrap();
                bucket
            })
            .collect();
        let dir = std::env::temp_dir().join(format!("loadgate-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("day.svg");
        timeline(&path, &report).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(svg.contains("Accepted requests, by arrival, in 240 s buckets"), "the caption names the width");
        assert!(svg.contains("80000"), "the x axis runs in seconds to the end of the day");
    }
}
