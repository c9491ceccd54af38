//! SVG charts of benchmark runs (plotters, SVG backend only): one run's
//! latency percentiles and rejection rate over time, and the demo's
//! shedding-off versus shedding-on comparison across load levels.

use std::path::Path;

use plotters::prelude::*;

use crate::loadgen::report::{BenchReport, Percentiles};

const OFF: RGBColor = RGBColor(200, 40, 40);
const ON: RGBColor = RGBColor(30, 100, 200);
const GREY: RGBColor = RGBColor(120, 120, 120);

fn legend(color: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
}

/// Draws `report`'s per-second (by arrival) p50 / p99 TTFT and p99 latency of
/// accepted requests, and its rejection rate, into an SVG file.
///
/// # Errors
///
/// The file cannot be written.
pub fn timeline(path: &Path, report: &BenchReport) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (900, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(400);
    let seconds = report.timeline.len() as f64;
    let per_second: Vec<(f64, Percentiles, Percentiles)> = report
        .timeline
        .iter()
        .enumerate()
        .map(|(i, b)| (i as f64 + 0.5, Percentiles::of(&b.ttft), Percentiles::of(&b.latency)))
        .collect();
    let y_max = per_second.iter().map(|(_, t, l)| t.p99.max(l.p99)).fold(1.0, f64::max) * 1.5;

    let mut chart = ChartBuilder::on(&top)
        .caption("Accepted requests, by arrival second", ("sans-serif", 18))
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
        let points = per_second.iter().filter(|(_, t, _)| t.max > 0.0).map(|(x, t, l)| (*x, pick(t, l).max(0.1)));
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
        .map(|(i, b)| (i as f64 + 0.5, 100.0 * b.rejected as f64 / b.sent as f64));
    chart.draw_series(LineSeries::new(points, OFF.stroke_width(2)))?;
    root.present()?;
    Ok(())
}

/// One load level of the demo, for one shedding setting.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadPoint {
    /// Offered load as a multiple of capacity.
    pub multiple: f64,
    /// Completed requests per second.
    pub goodput: f64,
    /// Percent of requests refused.
    pub rejected_pct: f64,
    /// p99 TTFT of accepted requests, ms.
    pub p99_ttft_ms: f64,
    /// p99 end-to-end latency of accepted requests, ms.
    pub p99_latency_ms: f64,
}

/// Draws the demo's comparison: p99 TTFT, goodput and rejection rate against
/// offered load, shedding off versus on (`rule`: what makes a worker busy,
/// shown in the legend).
///
/// # Errors
///
/// The file cannot be written.
pub fn comparison(path: &Path, off: &[LoadPoint], on: &[LoadPoint], rule: &str) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1200, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((1, 3));
    let x_max = off.iter().chain(on).map(|p| p.multiple).fold(1.0, f64::max) + 0.25;
    let on_label = format!("shedding on ({rule})");
    let runs = [("shedding off", OFF, off), (on_label.as_str(), ON, on)];

    let ttft_max = off.iter().chain(on).map(|p| p.p99_ttft_ms).fold(1.0, f64::max) * 2.0;
    let mut chart = ChartBuilder::on(&panels[0])
        .caption("p99 TTFT of accepted requests", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(34)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max, (1f64..ttft_max).log_scale())?;
    chart.configure_mesh().x_desc("offered load (x capacity)").y_desc("ms (log)").draw()?;
    for (name, color, points) in runs {
        let line = points.iter().map(|p| (p.multiple, p.p99_ttft_ms.max(1.0)));
        chart.draw_series(LineSeries::new(line, color.stroke_width(2)))?.label(name).legend(legend(color));
    }
    chart.configure_series_labels().position(SeriesLabelPosition::UpperLeft).border_style(BLACK).draw()?;

    let goodput_max = off.iter().chain(on).map(|p| p.goodput).fold(1.0, f64::max) * 1.3;
    let mut chart = ChartBuilder::on(&panels[1])
        .caption("goodput (completed req/s)", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(34)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..x_max, 0f64..goodput_max)?;
    chart.configure_mesh().x_desc("offered load (x capacity)").draw()?;
    for (name, color, points) in runs {
        let line = points.iter().map(|p| (p.multiple, p.goodput));
        chart.draw_series(LineSeries::new(line, color.stroke_width(2)))?.label(name).legend(legend(color));
    }
    chart.configure_series_labels().position(SeriesLabelPosition::LowerRight).border_style(BLACK).draw()?;

    let mut chart = ChartBuilder::on(&panels[2])
        .caption("rejected, % of requests", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(34)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..x_max, 0f64..100f64)?;
    chart.configure_mesh().x_desc("offered load (x capacity)").draw()?;
    for (name, color, points) in runs {
        let line = points.iter().map(|p| (p.multiple, p.rejected_pct));
        chart.draw_series(LineSeries::new(line, color.stroke_width(2)))?.label(name).legend(legend(color));
    }
    chart.configure_series_labels().position(SeriesLabelPosition::UpperLeft).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}
