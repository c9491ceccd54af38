//! Request rejection (load shedding) for LLM inference routers.
//!
//! When every GPU worker behind a router is saturated, a router that keeps
//! accepting work makes everyone's latency explode. loadgate decides, without
//! locks, which workers are busy, routes around them, rejects when all of
//! them are, and caps each worker at exactly `N + Q` requests.
//!
//! # Two layers
//!
//! 1. **Frontend busy set.** Workers report load per data-parallel rank
//!    ([`LoadReport`]); the [`WorkerMonitor`] evaluates each model's
//!    [`BusyThresholds`] and publishes an immutable [`BusySet`]; the
//!    [`Router`] skips busy workers and answers [`RouteError::Overloaded`]
//!    when none is left (HTTP 529 by default, see [`overload_status_code`]).
//! 2. **Worker hard cap.** [`Admission`] admits `N` requests into the engine
//!    plus exactly `Q` waiting, and hands the rest back; the frontend treats
//!    that as [`Rejection::WorkerOverloaded`] and may retry elsewhere with
//!    [`Migration`].
//!
//! # Types
//!
//! | type | what it is |
//! |---|---|
//! | [`BusyThresholds`], [`Thresholds`], [`BusySignals`] | the four signals, validated to exact fixed point, and which fired |
//! | [`RankLoad`], [`LoadReport`], [`Publisher`], [`RankSlot`] | per-rank load and the packed atomic slot that stores it |
//! | [`WorkerMonitor`], [`MonitorConfig`], [`Applied`], [`Registered`] | registry, reports (incarnations and sequence numbers), thresholds, busy-set publication |
//! | [`BusySet`] | the published bitmap, with its word scans |
//! | [`Router`], [`ModelRouter`], [`LocalRouter`], [`Policy`], [`RouteError`] | selection of an eligible instance |
//! | [`Admission`], [`Permit`], [`ScopedPermit`], [`Admitted`], [`Rejected`] | the worker's `N + Q` hard cap |
//! | [`Rejection`], [`overload_status_code`] | rejection classes and their HTTP status |
//! | [`Migration`] | retry on another worker after a hard-cap refusal |
//! | [`RetryPolicy`] | client backoff with jitter, honouring `Retry-After` |
//! | [`RejectionMetrics`] | counters and Prometheus text |
//! | [`wire::Frame`], [`patch::ThresholdPatch`] | the event plane's binary frames and the `/busy_threshold` body (pure codecs) |
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use loadgate::*;
//!
//! let monitor = Arc::new(WorkerMonitor::new(MonitorConfig::default()).unwrap());
//! // Worker id, model, data-parallel size, incarnation (picked at the worker's start).
//! monitor.register(1, "llama", 1, 100).unwrap();
//! monitor.register(2, "llama", 1, 200).unwrap();
//! monitor
//!     .set_thresholds("llama", BusyThresholds { active_decode_blocks_threshold: Some(0.85), ..Default::default() })
//!     .unwrap();
//! let router = Router::new(monitor.clone(), Policy::RoundRobin);
//!
//! // Worker 1 fills its KV cache: 90 of 100 blocks.
//! let full = RankLoad { active_decode_blocks: 90, kv_total_blocks: 100, ..Default::default() };
//! monitor.apply(&LoadReport { worker: 1, incarnation: 100, seq: 1, load: full, ..Default::default() }).unwrap();
//! assert_eq!(router.route("llama", &[]), Ok(2)); // routed around the busy worker
//!
//! monitor.apply(&LoadReport { worker: 2, incarnation: 200, seq: 1, load: full, ..Default::default() }).unwrap();
//! assert_eq!(router.route("llama", &[]), Err(RouteError::Overloaded)); // shed: HTTP 529
//!
//! // Layer 2: a worker admits N = 1 running plus Q = 2 waiting.
//! let admission = Admission::new(1, 2, Box::new(|_item: (), _permit| Ok(()))).unwrap();
//! let running = admission.try_admit(()).unwrap();
//! assert!(matches!(admission.try_admit(()), Ok(Admitted::Queued)));
//! assert!(matches!(admission.try_admit(()), Ok(Admitted::Queued)));
//! assert!(admission.try_admit(()).is_err()); // "Server overloaded: worker at capacity"
//! # drop(running);
//! ```
//!
//! # Growing without breaking
//!
//! The plain data structs ([`RankLoad`], [`LoadReport`], [`BusyThresholds`],
//! [`BusySignals`], [`MonitorConfig`]) keep public fields and implement
//! [`Default`]; build them with `..Default::default()`. A field added later
//! always defaults to "not reported" or "not configured", so such code keeps
//! compiling and keeps its meaning.
//!
//! More: `docs/architecture.md` (the layers, the data flow, why each
//! structure), `docs/semantics.md`, `docs/benchmarks.md`.

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![forbid(unsafe_code)]

mod admission;
mod busy;
mod error;
mod load;
mod metrics;
mod migration;
mod monitor;
mod padded;
pub mod patch;
mod retry;
mod router;
mod sync;
mod thresholds;
pub mod wire;

#[cfg(feature = "server")]
pub mod server;

pub use admission::{
    parse_queue_limit, Admission, AdmissionError, Admitted, Dispatch, Permit, Rejected, ScopedPermit,
    DEFAULT_QUEUE_LIMIT, MAX_QUEUE_LIMIT, QUEUE_LIMIT_ENV,
};
pub use busy::BusySet;
pub use error::{
    overload_status_code, parse_overload_status, Rejection, DEFAULT_OVERLOAD_STATUS, OVERLOAD_STATUS_ENV,
    WORKER_AT_CAPACITY,
};
pub use load::{LoadReport, Publisher, RankLoad, RankSlot, SlotUpdate, WorkerId};
pub use metrics::{render_worker, Endpoint, Reason, RejectionMetrics, WorkerAdmissionStats};
pub use migration::{Migration, MigrationError, DEFAULT_MIGRATION_LIMIT};
pub use monitor::{
    Applied, ApplyError, MonitorConfig, RankSnapshot, RegisterError, Registered, SetThresholdsError, WorkerInfo,
    WorkerLoad, WorkerMonitor,
};
pub use retry::{is_retryable_status, parse_retry_after, RetryPolicy, Verdict};
pub use router::{CostFn, LocalRouter, ModelRouter, Policy, RouteError, Router};
pub use thresholds::{BusySignals, BusyThresholds, ThresholdError, Thresholds, MAX_PREFILL_FRAC, PPB};
