//! The open-loop run: Poisson arrivals fired on schedule whatever happened
//! to earlier requests, latency measured from the scheduled time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use loadgate::Class;

use crate::loadgen::answer::{cut_short, read_body};
use crate::loadgen::client;
use crate::loadgen::config::{request_body, BenchConfig, MAX_RATE};
use crate::loadgen::mix::PRIORITY_HEADER;
use crate::loadgen::progress::{Progress, Tally};
use crate::loadgen::report::{bucket_width, count_reason, histogram, BenchReport, ClassReport, TimeBucket};
use crate::loadgen::tenants::{TenantHeaders, TENANT_HEADER};

/// The header a frontend's refusal names its reason in.
const REJECTED_REASON: &str = "x-loadgate-rejected-reason";

/// How one request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// An HTTP status, with the response fully read.
    Status(u16),
    /// The connection failed or broke.
    TransportError,
}

/// One request's outcome.
#[derive(Clone, Debug)]
struct Outcome {
    /// Its arrival's timeline bucket (an index).
    bucket: usize,
    answer: Answer,
    ttft: Option<Duration>,
    latency: Duration,
    tokens: u64,
    /// A refusal's `x-loadgate-rejected-reason`.
    reason: Option<String>,
    /// Its class (with `--mix`).
    class: Option<Class>,
    /// Its tenant's index (with `--tenants`).
    tenant: Option<usize>,
}

/// Runs one open-loop benchmark.
///
/// # Errors
///
/// As [`run_bench_tallied`].
pub async fn run_bench(config: &BenchConfig) -> anyhow::Result<BenchReport> {
    run_bench_tallied(config, &Arc::default()).await
}

/// As [`run_bench`], counting every request in `tally` as it ends.
///
/// # Errors
///
/// The HTTP client cannot be built, or the rate is not a positive number
/// of at most [`MAX_RATE`] (the demo computes its rates).
pub async fn run_bench_tallied(config: &BenchConfig, tally: &Arc<Tally>) -> anyhow::Result<BenchReport> {
    let rate = config.rate;
    anyhow::ensure!(
        rate > 0.0 && rate <= MAX_RATE,
        "a rate of {rate} requests per second: above 0 and at most {MAX_RATE}"
    );
    let client = client::builder(config.proxy_from_env).build()?;
    let body = bytes::Bytes::from(request_body(config));
    let mut rng = fastrand::Rng::with_seed(config.seed);
    let progress = Progress::start(config.progress, config.duration, tally.clone());
    let (tx, mut rx) = mpsc::unbounded_channel::<Outcome>();
    let mut tasks = JoinSet::new();

    let width = bucket_width(config.duration);
    let buckets = (config.duration.as_secs_f64() / width.as_secs_f64()).ceil() as usize;
    let mut report = BenchReport {
        config: config.clone(),
        sent: 0,
        by_status: BTreeMap::new(),
        transport_errors: 0,
        unfinished: 0,
        output_tokens: 0,
        elapsed: Duration::ZERO,
        ttft: histogram(3),
        latency: histogram(3),
        // Grown as arrivals come (two histograms a bucket): a long
        // --duration costs nothing up front, and at most `MAX_BUCKETS`.
        timeline: Vec::new(),
        bucket: width,
        rejected_reasons: BTreeMap::new(),
        by_class: config.mix.map(|_| Default::default()),
        by_tenant: config.tenants.as_ref().map(|t| (0..t.len()).map(|_| ClassReport::default()).collect()),
    };
    let tenant_headers = config.tenants.as_ref().map(|t| t.headers()).unwrap_or_default();

    let start = Instant::now();
    let end = start + config.duration;
    let drain_deadline = end + config.drain_timeout;
    // The next arrival after `from`, if any before the end (a gap too long
    // for a `Duration` or an `Instant`, at a tiny rate, is past it).
    let after = |from: Instant, rng: &mut fastrand::Rng| {
        let gap = Duration::try_from_secs_f64(-(1.0 - rng.f64()).ln() / config.rate).ok()?;
        from.checked_add(gap).filter(|t| *t < end)
    };
    let mut next = after(start, &mut rng);
    let mut outstanding = 0u64;
    let mut last_answer = start;
    loop {
        if next.is_none() && outstanding == 0 {
            break;
        }
        tokio::select! {
            () = tokio::time::sleep_until(next.unwrap_or(end)), if next.is_some() => {
                let scheduled = next.expect("guarded");
                let bucket = ((scheduled - start).as_secs_f64() / width.as_secs_f64()) as usize;
                let bucket = bucket.min(buckets.max(1) - 1);
                if report.timeline.len() <= bucket {
                    report.timeline.resize_with(bucket + 1, TimeBucket::new);
                }
                report.sent += 1;
                report.timeline[bucket].sent += 1;
                let class = config.mix.map(|mix| mix.draw(rng.f64()));
                if let (Some(by_class), Some(class)) = (report.by_class.as_mut(), class) {
                    by_class[class.index()].sent += 1;
                }
                // After the class, so a run without --tenants draws what it always did.
                let tenant = config.tenants.as_ref().map(|tenants| tenants.draw(rng.f64()));
                if let (Some(by_tenant), Some(tenant)) = (report.by_tenant.as_mut(), tenant) {
                    by_tenant[tenant].sent += 1;
                }
                tally.sent();
                if outstanding >= config.max_in_flight {
                    // Not sent: a server that answers nothing must not grow the load generator.
                    tally.failed(&in_flight_full(config.max_in_flight));
                    record(&mut report, &Outcome::failed(bucket, class, tenant));
                } else {
                    let request = Request {
                        url: config.url_for(report.sent as usize).to_owned(),
                        body: body.clone(),
                        stream: config.stream,
                        class,
                        tenant: tenant.map(|i| (i, tenant_headers[i].clone())),
                    };
                    outstanding += 1;
                    tasks.spawn(one_request(client.clone(), request, scheduled, bucket, tx.clone(), tally.clone()));
                }
                next = after(scheduled, &mut rng);
            }
            Some(outcome) = rx.recv() => {
                outstanding -= 1;
                last_answer = Instant::now();
                record(&mut report, &outcome);
            }
            () = tokio::time::sleep_until(drain_deadline), if next.is_none() => {
                // Answers already waiting came before the deadline (`select!`
                // may pick this branch over theirs): counted, not unfinished.
                while let Ok(outcome) = rx.try_recv() {
                    outstanding -= 1;
                    record(&mut report, &outcome);
                }
                report.unfinished = outstanding;
                tasks.abort_all();
                last_answer = drain_deadline;
                break;
            }
        }
        while tasks.try_join_next().is_some() {}
    }
    drop(progress);
    report.elapsed = (last_answer - start).max(config.duration);
    Ok(report)
}

impl Outcome {
    /// A request without an HTTP answer, with nothing measured.
    fn failed(bucket: usize, class: Option<Class>, tenant: Option<usize>) -> Outcome {
        Outcome {
            bucket,
            answer: Answer::TransportError,
            ttft: None,
            latency: Duration::ZERO,
            tokens: 0,
            reason: None,
            class,
            tenant,
        }
    }
}

/// The error counted for an arrival not sent because `max` requests were in
/// flight (`BenchConfig::max_in_flight`).
fn in_flight_full(max: u64) -> std::io::Error {
    std::io::Error::other(format!("not sent: {max} requests in flight already (--max-in-flight)"))
}

fn record(report: &mut BenchReport, o: &Outcome) {
    if let Answer::Status(status) = o.answer {
        let class = report.by_class.as_mut().zip(o.class).map(|(by_class, c)| &mut by_class[c.index()]);
        let tenant = report.by_tenant.as_mut().zip(o.tenant).map(|(by_tenant, t)| &mut by_tenant[t]);
        for group in class.into_iter().chain(tenant) {
            group.count(status, o.ttft, o.reason.as_deref());
        }
    }
    let bucket = &mut report.timeline[o.bucket];
    match o.answer {
        Answer::TransportError => report.transport_errors += 1,
        Answer::Status(status) => {
            *report.by_status.entry(status).or_default() += 1;
            if (200..300).contains(&status) {
                bucket.ok += 1;
                // Saturating: a server may claim any count (the parse saturates at u64::MAX).
                report.output_tokens = report.output_tokens.saturating_add(o.tokens);
                let latency = o.latency.as_micros().max(1) as u64;
                report.latency.saturating_record(latency);
                bucket.latency.saturating_record(latency);
                if let Some(ttft) = o.ttft {
                    let ttft = ttft.as_micros().max(1) as u64;
                    report.ttft.saturating_record(ttft);
                    bucket.ttft.saturating_record(ttft);
                }
            } else {
                bucket.rejected += 1;
                count_reason(&mut report.rejected_reasons, o.reason.as_deref());
            }
        }
    }
}

/// What one request sends.
struct Request {
    url: String,
    body: bytes::Bytes,
    stream: bool,
    /// Sent in `x-loadgate-priority` when set.
    class: Option<Class>,
    /// Its index and headers (bearer key and `x-loadgate-tenant`) when set.
    tenant: Option<(usize, TenantHeaders)>,
}

async fn one_request(
    client: reqwest::Client,
    request: Request,
    scheduled: Instant,
    bucket: usize,
    done: mpsc::UnboundedSender<Outcome>,
    tally: Arc<Tally>,
) {
    let Request { url, body, stream, class, tenant } = request;
    let mut post = client.post(&url).header("content-type", "application/json");
    if let Some(class) = class {
        post = post.header(PRIORITY_HEADER, class.label());
    }
    if let Some((_, headers)) = &tenant {
        post = post
            .header(reqwest::header::AUTHORIZATION, headers.authorization.clone())
            .header(TENANT_HEADER, headers.tenant.clone());
    }
    let sent = post.body(body).send().await;
    let mut outcome = Outcome::failed(bucket, class, tenant.map(|(i, _)| i));
    if let Err(error) = &sent {
        tally.failed(error);
    }
    if let Ok(mut resp) = sent {
        let status = resp.status().as_u16();
        if !resp.status().is_success() {
            outcome.reason =
                resp.headers().get(REJECTED_REASON).and_then(|v| v.to_str().ok()).map(|v| v.chars().take(64).collect());
        }
        let read = read_body(&mut resp, || {
            if stream {
                outcome.ttft = Some(scheduled.elapsed());
            }
        })
        .await;
        outcome.latency = scheduled.elapsed();
        match read {
            Err(error) => tally.failed(&error),
            // A 2xx cut short is no completion (see `answer`).
            Ok(tail) if resp.status().is_success() && !tail.is_whole(stream) => tally.failed(&cut_short(stream)),
            Ok(tail) => {
                tally.answered(status);
                outcome.answer = Answer::Status(status);
                if !stream {
                    outcome.ttft = Some(outcome.latency);
                }
                outcome.tokens = tail.completion_tokens();
            }
        }
    }
    let _ = done.send(outcome);
}
