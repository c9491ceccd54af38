//! Closed-loop saturation: how many requests per second a pool completes
//! when clients send back to back (the demo's capacity estimate).

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::loadgen::answer::{cut_short, read_body};
use crate::loadgen::client;
use crate::loadgen::config::{request_body, BenchConfig};
use crate::loadgen::progress::{Progress, Tally};

/// Closed-loop saturation: `clients` clients each send their next request
/// as soon as the previous one ends, for `warmup + measure`; returns the
/// requests per second that completed (2xx, whole body) during `measure`,
/// counted by [`window_rate`] so that requests finishing in waves do not
/// make the figure jump by a whole wave. A request still running at the
/// window's end may finish within the config's drain timeout to count.
/// Its progress is shown on stderr as the open loop's is.
///
/// # Errors
///
/// The HTTP client cannot be built.
pub async fn saturate(
    config: &BenchConfig,
    clients: usize,
    warmup: Duration,
    measure: Duration,
) -> anyhow::Result<f64> {
    let client = client::builder(config.proxy_from_env).build()?;
    let body = bytes::Bytes::from(request_body(config));
    let stream = config.stream;
    let tally = Arc::new(Tally::default());
    let progress = Progress::start(config.progress, warmup + measure, tally.clone());
    let start = Instant::now();
    let (from, until) = (start + warmup, start + warmup + measure);
    let deadline = until + config.drain_timeout;
    let mut tasks = JoinSet::new();
    for i in 0..clients {
        let (client, url, body) = (client.clone(), config.url_for(i).to_owned(), body.clone());
        let tally = tally.clone();
        tasks.spawn(async move {
            let mut served = Vec::new();
            while Instant::now() < until {
                let sent = Instant::now();
                tally.sent();
                let exchange = async {
                    let mut resp =
                        client.post(&url).header("content-type", "application/json").body(body.clone()).send().await?;
                    let status = resp.status().as_u16();
                    read_body(&mut resp, || {}).await.map(|tail| (status, tail))
                };
                match tokio::time::timeout_at(deadline, exchange).await {
                    // A 2xx cut short is no completion (see `answer`).
                    Ok(Ok((status, tail))) if (200..300).contains(&status) && !tail.is_whole(stream) => {
                        tally.failed(&cut_short(stream));
                    }
                    Ok(Ok((status, _))) => {
                        tally.answered(status);
                        if (200..300).contains(&status) {
                            served.push((sent, Instant::now()));
                        }
                    }
                    Ok(Err(error)) => {
                        tally.failed(&error);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(_) => break,
                }
            }
            served
        });
    }
    let mut served = Vec::new();
    while let Some(spans) = tasks.join_next().await {
        served.extend(spans.unwrap_or_default());
    }
    drop(progress);
    Ok(window_rate(&served, from, until))
}

/// Requests per second completed in `[from, until)`, from the `(sent,
/// done)` spans of served requests: each request counts for the share of
/// its span inside the window. In a steady closed loop this is the
/// completion rate (Little's law: clients / mean span) without the
/// rounding of counting whole completions, which jumps by a whole wave
/// when requests sent together finish together.
fn window_rate(served: &[(Instant, Instant)], from: Instant, until: Instant) -> f64 {
    let window = until.saturating_duration_since(from).as_secs_f64();
    if window == 0.0 {
        return 0.0;
    }
    let credit: f64 = served
        .iter()
        .map(|&(sent, done)| {
            let span = done.saturating_duration_since(sent).as_secs_f64();
            let inside = done.min(until).saturating_duration_since(sent.max(from)).as_secs_f64();
            match span {
                // An instant request: whole when it ends inside.
                0.0 if (from..until).contains(&done) => 1.0,
                0.0 => 0.0,
                _ => inside / span,
            }
        })
        .sum();
    credit / window
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(origin: Instant, secs: f64) -> Instant {
        origin + Duration::from_secs_f64(secs)
    }

    #[test]
    fn waves_of_requests_count_by_their_share_in_the_window() {
        let o = Instant::now();
        // 8 clients whose 2.5 s requests are sent together: 3.2 req/s. Counting whole
        // completions in an 8 s window gives 3 or 4 waves, 3.0 or 4.0 req/s, by where it starts.
        let spans: Vec<_> =
            (0..7).flat_map(|w| std::iter::repeat_n((at(o, 2.5 * w as f64), at(o, 2.5 * w as f64 + 2.5)), 8)).collect();
        for (from, until) in [(3.0, 11.0), (4.9, 12.9), (2.0, 10.0)] {
            let rate = window_rate(&spans, at(o, from), at(o, until));
            assert!((rate - 3.2).abs() < 1e-9, "[{from}, {until}): {rate}");
        }
    }

    #[test]
    fn spans_outside_the_window_and_empty_windows_count_nothing() {
        let o = Instant::now();
        let spans = [(at(o, 0.0), at(o, 1.0)), (at(o, 5.0), at(o, 6.0))];
        assert_eq!(window_rate(&spans, at(o, 2.0), at(o, 4.0)), 0.0);
        assert_eq!(window_rate(&spans, at(o, 2.0), at(o, 2.0)), 0.0);
        // Half of each span is inside [0.5, 5.5): one request over 5 s.
        assert!((window_rate(&spans, at(o, 0.5), at(o, 5.5)) - 0.2).abs() < 1e-9);
        // A zero-length span counts whole when it ends inside.
        assert_eq!(window_rate(&[(at(o, 1.0), at(o, 1.0))], at(o, 0.0), at(o, 2.0)), 0.5);
    }
}
