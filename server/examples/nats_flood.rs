//! The NATS event plane's throughput benchmark (`benches/nats_plane/run.sh`):
//! `--workers` simulated workers, each registered with a sealed Register,
//! then sealed Load frames published round-robin as fast as the publishers
//! go for `--seconds`, every `--flip-every`-th one flipping its worker busy
//! or free; a bare `async-nats` subscriber in the same process counts what
//! it receives of the same subjects (the baseline a frontend is compared
//! with: `loadgate_frontend_event_loads_applied` over the same window).
//!
//! Prints `phase=measure` when the counted window starts, `phase=done` when
//! it ends, then one line `result {json}`.
//!
//! ```sh
//! LOADGATE_EVENT_SECRET=... cargo run --release -p loadgate-server --example nats_flood -- \
//!     --nats-url nats://127.0.0.1:4222 --workers 1000 --seconds 5
//! ```

use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use clap::Parser;
use futures_util::StreamExt as _;
use loadgate::wire::envelope::Sealer;
use loadgate::wire::Frame;
use loadgate::RankLoad;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    #[arg(long, default_value = "loadgate")]
    namespace: String,
    #[arg(long, default_value = "flood")]
    model: String,
    #[arg(long, default_value_t = 1000)]
    workers: u64,
    /// The first worker id.
    #[arg(long, default_value_t = 1_000_000)]
    first_id: u64,
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Seconds published before the counted window.
    #[arg(long, default_value_t = 1)]
    warmup_seconds: u64,
    /// Every n-th load of a worker flips it.
    #[arg(long, default_value_t = 10)]
    flip_every: u64,
    /// Publishing connections.
    #[arg(long, default_value_t = 2)]
    publishers: u64,
    /// Loads per second in all (0: as fast as the publishers go).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// No bare subscriber (this process's CPU is then the publishers', as
    /// the workers' would be).
    #[arg(long)]
    no_bare: bool,
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn sealed(sealer: &Sealer, subject: &str, frame: &Frame) -> bytes::Bytes {
    let mut buf = BytesMut::new();
    sealer.seal(subject, unix_ms(), frame, &mut buf).expect("a small frame");
    buf.freeze()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let secret = std::env::var("LOADGATE_EVENT_SECRET").map_err(|_| anyhow::anyhow!("set LOADGATE_EVENT_SECRET"))?;
    let secret = Arc::new(Sealer::new(secret.trim().as_bytes()));
    let received = Arc::new(AtomicU64::new(0));
    if !args.no_bare {
        let counter = async_nats::connect(args.nats_url.as_str()).await?;
        let mut seen = counter.subscribe(format!("{}.ev.>", args.namespace)).await?;
        let counting = received.clone();
        tokio::spawn(async move {
            while seen.next().await.is_some() {
                // Relaxed: a count read after the window.
                counting.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    let incarnation = unix_ms() * 1_000_000;
    let subject = |w: u64| format!("{}.ev.{}.{w}", args.namespace, args.model);
    let mut clients = Vec::new();
    for _ in 0..args.publishers.max(1) {
        clients.push(async_nats::connect(args.nats_url.as_str()).await?);
    }
    for w in args.first_id..args.first_id + args.workers {
        let frame = Frame::Register {
            worker: w,
            incarnation,
            dp_size: 1,
            model: args.model.clone(),
            http_addr: "127.0.0.1:9".to_owned(),
        };
        clients[0].publish(subject(w), sealed(&secret, &subject(w), &frame)).await?;
    }
    clients[0].flush().await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let published = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let measure_from = start + Duration::from_secs(args.warmup_seconds);
    let end = measure_from + Duration::from_secs(args.seconds);
    let mut tasks = Vec::new();
    let share = args.workers.div_ceil(args.publishers.max(1));
    for (i, client) in clients.into_iter().enumerate() {
        let (secret, published, namespace, model) =
            (secret.clone(), published.clone(), args.namespace.clone(), args.model.clone());
        let first = args.first_id + i as u64 * share;
        let last = (first + share).min(args.first_id + args.workers);
        let flip_every = args.flip_every.max(1);
        // This publisher's pace: one load every `gap` (none: no pace).
        let gap = (args.rate > 0).then(|| Duration::from_secs_f64(args.publishers.max(1) as f64 / args.rate as f64));
        tasks.push(tokio::spawn(async move {
            let mut seq = 1;
            let mut sent = 0u32;
            while Instant::now() < end {
                for w in first..last {
                    if let Some(gap) = gap {
                        sent += 1;
                        tokio::time::sleep_until((start + gap * sent).into()).await;
                    }
                    let busy = (seq / flip_every) % 2 == 1;
                    let load = RankLoad {
                        active_decode_blocks: if busy { 95 } else { 5 },
                        kv_total_blocks: 100,
                        ..Default::default()
                    };
                    let frame = Frame::Load { worker: w, incarnation, rank: 0, seq, load };
                    let subject = format!("{namespace}.ev.{model}.{w}");
                    let payload = sealed(&secret, &subject, &frame);
                    if client.publish(subject, payload).await.is_err() {
                        return;
                    }
                    published.fetch_add(1, Ordering::Relaxed);
                }
                seq += 1;
            }
            let _ = client.flush().await;
        }));
    }
    tokio::time::sleep_until(measure_from.into()).await;
    let (published_0, received_0) = (published.load(Ordering::Relaxed), received.load(Ordering::Relaxed));
    println!("phase=measure");
    std::io::stdout().flush()?;
    tokio::time::sleep_until(end.into()).await;
    let (published_1, received_1) = (published.load(Ordering::Relaxed), received.load(Ordering::Relaxed));
    println!("phase=done");
    std::io::stdout().flush()?;
    for task in tasks {
        let _ = task.await;
    }
    let seconds = args.seconds as f64;
    println!(
        "result {{\"workers\":{},\"seconds\":{},\"published_per_s\":{:.0},\"bare_received_per_s\":{:.0}}}",
        args.workers,
        args.seconds,
        (published_1 - published_0) as f64 / seconds,
        (received_1 - received_0) as f64 / seconds
    );
    Ok(())
}
