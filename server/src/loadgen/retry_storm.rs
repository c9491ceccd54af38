//! The retry storm (`loadgate bench --retry-storm N`): N clients that honour
//! the server's retry hint start in one burst against a frontend.
//!
//! Every client sends the same request at the same instant (t = 0). On 529,
//! 503 or 429 (a frontend's `--overload-status` may be any of them) it waits
//! what the answer asks and sends it again, as the OpenAI SDKs do: `retry-after-ms` (milliseconds) first, else `Retry-After`
//! (seconds), used when it is above 0 and at most 60 s; otherwise (no hint,
//! an unparsable one, or after a transport error or a timed-out attempt) the
//! fixed `--retry-fallback-ms`. Another status ends the client (failed). A
//! client also stops after `--max-attempts` attempts, or when its next retry
//! would start after `--duration`; each attempt is bounded by
//! `--request-timeout`, and the whole storm, its clients' connecting
//! included, by `--duration` plus `--drain-timeout` (clients still running
//! then are abandoned and counted unfinished, with what they saw until
//! then). The time every retry is due (the end of its wait: when it is
//! sent, unless the load generator itself is short of CPU) is kept for
//! the report's peak (`storm_report.rs`): a starved generator waking many
//! timers late at once would otherwise bunch retries its clients spread.
//!
//! Each client has its own HTTP client and opens its connection before the
//! burst (as SDK clients with keep-alive connections would have), so the
//! burst is not spread by N TCP handshakes.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use reqwest::header::{HeaderMap, RETRY_AFTER};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::loadgen::answer::{cut_short, read_body};
use crate::loadgen::client;
use crate::loadgen::config::{request_body, StormConfig};
use crate::loadgen::progress::{Progress, Tally};
use crate::loadgen::storm_report::{ClientRun, Ending, StormReport};

/// The header the OpenAI SDKs read before `Retry-After`.
const RETRY_AFTER_MS: &str = "retry-after-ms";
/// Longest hint a client honours (the OpenAI SDKs' bound); a longer one is
/// replaced by the fallback.
const MAX_HONOURED_HINT: Duration = Duration::from_secs(60);

/// Runs one retry storm, counting every attempt in `tally` as it ends.
///
/// # Errors
///
/// The HTTP client cannot be built.
pub async fn run_storm(config: &StormConfig, tally: &Arc<Tally>) -> anyhow::Result<StormReport> {
    let begin = Instant::now();
    let progress = Progress::start(config.request.progress, config.request.duration, tally.clone());
    let body = bytes::Bytes::from(request_body(&config.request));
    // Every client opens its connection, reports, and waits for the
    // starting instant, sent once all are connected (or the wait is over).
    let (go, ready) = watch::channel(None::<Instant>);
    let (connected, mut connections) = mpsc::channel::<()>(config.clients as usize);
    let mut tasks = JoinSet::new();
    // What each client saw, kept as it goes: a client abandoned at the
    // storm's bound is reported with its attempts so far.
    let slots: Vec<Arc<Mutex<ClientRun>>> = (0..config.clients).map(|_| Arc::default()).collect();
    for (index, slot) in slots.iter().enumerate() {
        // One client each, as separate processes would be: its own connection.
        let client = client::builder(config.request.proxy_from_env)
            .connect_timeout(config.request_timeout)
            .timeout(config.request_timeout)
            .build()?;
        let (body, mut ready, connected, config) = (body.clone(), ready.clone(), connected.clone(), config.clone());
        let (tally, slot) = (tally.clone(), slot.clone());
        tasks.spawn(async move {
            connect(&client, config.url(index, 1)).await;
            let _ = connected.send(()).await;
            drop(connected);
            let start = match ready.wait_for(Option::is_some).await {
                Ok(start) => *start,
                Err(_) => None,
            };
            if let Some(start) = start {
                one_client(&client, body, start, &config, index, &tally, &slot).await;
            }
        });
    }
    drop(connected);
    // The whole storm, its clients' connecting included, ends by this: a
    // server that never answers a connecting `GET` cannot hold it longer.
    let deadline = begin + config.request.duration + config.request.drain_timeout;
    let connect_deadline = (begin + config.request_timeout).min(deadline);
    let mut ready_clients = 0;
    while ready_clients < config.clients {
        match tokio::time::timeout_at(connect_deadline, connections.recv()).await {
            Ok(Some(())) => ready_clients += 1,
            Ok(None) | Err(_) => break,
        }
    }
    let start = Instant::now();
    // No receiver can have gone yet (each task holds one): the send only
    // fails if every task already ended, which cannot happen before it.
    let _ = go.send(Some(start));
    if tokio::time::timeout_at(deadline, async { while tasks.join_next().await.is_some() {} }).await.is_err() {
        tasks.abort_all();
        // Cancelled at their next await: none touches its slot after this.
        while tasks.join_next().await.is_some() {}
    }
    drop(progress);
    let runs: Vec<ClientRun> = slots.iter().map(|slot| std::mem::take(&mut *lock(slot))).collect();
    let unfinished = runs.iter().filter(|r| r.ending == Ending::Unfinished).count() as u64;
    let elapsed =
        if unfinished > 0 { deadline - start } else { runs.iter().map(|r| r.finished_at).max().unwrap_or_default() };
    Ok(StormReport { config: config.clone(), runs, unfinished, elapsed })
}

impl StormConfig {
    /// Where client `index` sends its attempt `attempt` (from 1): the
    /// frontends in turn, starting at its own.
    fn url(&self, index: usize, attempt: u32) -> &str {
        let n = self.urls.len().max(1);
        self.urls.get((index + attempt as usize - 1) % n).unwrap_or(&self.request.url)
    }
}

/// Opens the client's connection before the burst (one `GET` of the URL,
/// answered 405 and not counted), so that the burst measures the server and
/// not TCP handshakes; a failure is left for the attempts to meet. The
/// answer is read to its end (so the connection can be used again) but only
/// its tail kept: a server answering with an endless body cannot grow the
/// load generator.
async fn connect(client: &reqwest::Client, url: &str) {
    if let Ok(mut response) = client.get(url).send().await {
        let _ = read_body(&mut response, || {}).await;
    }
}

/// One client: the first attempt at `start`, then a retry after every
/// refusal, within the bounds of `config`; what it sees goes into `slot`
/// as it goes.
async fn one_client(
    client: &reqwest::Client,
    body: bytes::Bytes,
    start: Instant,
    config: &StormConfig,
    index: usize,
    tally: &Tally,
    slot: &Mutex<ClientRun>,
) {
    let end = start + config.request.duration;
    let mut due = start;
    for attempt in 1..=config.max_attempts {
        {
            let mut run = lock(slot);
            if attempt > 1 {
                run.retries.push(due - start);
            }
            run.attempts += 1;
        }
        tally.sent();
        let answered = attempt_once(client, config.url(index, attempt), body.clone(), config.request.stream).await;
        let next = {
            let mut run = lock(slot);
            let wait = match answered {
                Ok((status, hint)) => {
                    tally.answered(status);
                    run.statuses.push(status);
                    if (200..300).contains(&status) {
                        run.success = Some(start.elapsed());
                        run.ending = Ending::Succeeded;
                        break;
                    }
                    if !matches!(status, 429 | 503 | 529) {
                        run.ending = Ending::Failed;
                        break;
                    }
                    match hint {
                        Some(hint) => {
                            run.hints.push(hint);
                            hint
                        }
                        None => {
                            run.unhinted += 1;
                            config.fallback
                        }
                    }
                }
                Err(failure) => {
                    tally.failed(failure.error());
                    match failure {
                        Failure::Timeout(_) => run.timeouts += 1,
                        Failure::Transport(_) | Failure::Cut(_) => run.transport_errors += 1,
                    }
                    config.fallback
                }
            };
            if attempt == config.max_attempts {
                run.ending = Ending::OutOfAttempts;
                None
            } else if Instant::now() + wait > end {
                run.ending = Ending::OutOfTime;
                None
            } else {
                Some(Instant::now() + wait)
            }
        };
        // The slot unlocked across the wait.
        let Some(next) = next else { break };
        due = next;
        tokio::time::sleep_until(due).await;
    }
    lock(slot).finished_at = start.elapsed();
}

/// A client's slot, locked (a client that panicked left it as it was).
fn lock(slot: &Mutex<ClientRun>) -> MutexGuard<'_, ClientRun> {
    slot.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Why an attempt has no status.
enum Failure {
    /// The attempt took longer than `--request-timeout`.
    Timeout(reqwest::Error),
    /// The connection failed or broke.
    Transport(reqwest::Error),
    /// A 2xx whose body ended before its end (see `answer`).
    Cut(std::io::Error),
}

impl Failure {
    /// The error it carries.
    fn error(&self) -> &(dyn std::error::Error + 'static) {
        match self {
            Failure::Timeout(error) | Failure::Transport(error) => error,
            Failure::Cut(error) => error,
        }
    }
}

/// One attempt: its status (the body fully read) and the retry hint it carries.
async fn attempt_once(
    client: &reqwest::Client,
    url: &str,
    body: bytes::Bytes,
    stream: bool,
) -> Result<(u16, Option<Duration>), Failure> {
    let classify = |e: reqwest::Error| if e.is_timeout() { Failure::Timeout(e) } else { Failure::Transport(e) };
    let mut response =
        client.post(url).header("content-type", "application/json").body(body).send().await.map_err(classify)?;
    let status = response.status().as_u16();
    let hint = retry_hint(response.headers());
    let tail = read_body(&mut response, || {}).await.map_err(classify)?;
    // A 2xx cut short is no completion (see `answer`).
    if (200..300).contains(&status) && !tail.is_whole(stream) {
        return Err(Failure::Cut(cut_short(stream)));
    }
    Ok((status, hint))
}

/// The wait a refusal asks for, as the OpenAI SDKs read it: `retry-after-ms`
/// (milliseconds, fractional allowed) if it parses, else `Retry-After`
/// (seconds, fractional allowed; HTTP dates are not read); `None` when
/// neither parses or the value is not in (0, 60 s].
pub(crate) fn retry_hint(headers: &HeaderMap) -> Option<Duration> {
    let number = |name: &str| headers.get(name)?.to_str().ok()?.trim().parse::<f64>().ok();
    let secs = number(RETRY_AFTER_MS).map(|ms| ms / 1000.0).or_else(|| number(RETRY_AFTER.as_str()))?;
    (secs.is_finite() && secs > 0.0 && secs <= MAX_HONOURED_HINT.as_secs_f64()).then(|| Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(*k, HeaderValue::from_static(v));
        }
        map
    }

    #[test]
    fn the_hint_prefers_milliseconds_and_is_bounded() {
        let ms = Duration::from_millis;
        assert_eq!(retry_hint(&headers(&[("retry-after-ms", "250"), ("retry-after", "1")])), Some(ms(250)));
        assert_eq!(retry_hint(&headers(&[("retry-after-ms", "12.5")])), Some(Duration::from_micros(12_500)));
        assert_eq!(retry_hint(&headers(&[("retry-after-ms", "soon"), ("retry-after", "2")])), Some(ms(2000)));
        assert_eq!(retry_hint(&headers(&[("retry-after", "0.5")])), Some(ms(500)));
        assert_eq!(retry_hint(&headers(&[("retry-after", "61")])), None);
        assert_eq!(retry_hint(&headers(&[("retry-after-ms", "0")])), None);
        assert_eq!(retry_hint(&headers(&[("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")])), None);
        assert_eq!(retry_hint(&headers(&[])), None);
    }
}
