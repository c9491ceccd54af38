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
//!    [`BusyThresholds`] and publishes which workers are busy; the
//!    [`WorkerRouter`] skips them and answers [`RouteError::Overloaded`]
//!    when none is left (HTTP 529 by default).
//! 2. **Worker hard cap.** [`Admission`] admits `N` requests into the engine
//!    plus exactly `Q` waiting (`gate.admit(item).await`, any executor), and
//!    refuses the rest; the frontend treats that as
//!    [`Rejection::WorkerOverloaded`] and may retry elsewhere with
//!    [`Migration`]. A [`Permit`] lasts as long as the response:
//!    [`PermitStream`] (and, with `tower`, `PermitBody`) hold it until the
//!    stream ends, fails or is dropped.
//!
//! # What to use
//!
//! | you write | use |
//! |---|---|
//! | the frontend's registry and load intake | [`WorkerMonitor`], [`MonitorConfig`], [`BusyThresholds`], [`Registration`] (`register_worker`), [`Reporter`] (`monitor.reporter(worker)`: numbered reports), [`LoadReport`], [`RankLoad`] |
//! | routing | [`WorkerRouter`] (below: which handle), [`Policy`], [`RouteError`] |
//! | retry on another worker | [`Migration`] (`run` blocking, `run_async` awaited), [`MigrationError`] |
//! | a worker's hard cap | [`Admission`], [`Permit`], [`PermitStream`]; [`Admitted`] and [`Rejected`] for `try_admit` |
//! | the HTTP answer of a refusal | [`Rejection`], `openai_error` (the bodies; feature `openai-error`, pulled by `tower`), [`retry_hint`] (`Retry-After` from the drain rate); with `tower`: `Refusal`, `RetryAfter`, `AdmissionLayer`, `PermitBody`; with `axum`: `IntoResponse` for all of them and the `Routed` extractor |
//! | a client that backs off | [`RetryPolicy`] |
//! | Prometheus metrics | `metrics` (feature `prometheus`): register into your `Registry`; `MetricsFormat` answers each scraper in OpenMetrics or the 0.0.4 text format; with `axum` too, `web::metrics`, a ready `/metrics` handler, and `Exposition` |
//! | load from vLLM's, SGLang's or llama.cpp's own `/metrics` (and `/slots`) | `engines` (feature `engines`): `engines::snapshot` per scrape |
//! | the event plane or `/busy_threshold` codecs | `wire` (feature `wire`), `patch` (feature `threshold-api`) |
//!
//! Everything else (registration outcomes, snapshots, error details, the
//! environment constants) is in the modules: [`admission`], [`monitor`],
//! [`thresholds`], [`route`], [`rejection`], [`migration`], [`backoff`].
//! Background reading is in [`docs`].
//!
//! **Sharing:** constructors return the value itself (only
//! [`Admission::new`] returns an `Arc`, since each permit keeps its gate
//! alive), and every call that keeps a shared value takes it as
//! `impl Into<Arc<T>>` (`WorkerRouter::new`, `RejectionMetrics::register`'s
//! monitor, `AdmissionLayer::new`, …: pass the value, or a clone of the
//! `Arc` you keep) or, when it keeps its receiver, as `self: &Arc<Self>`
//! (`WorkerMonitor::reporter`, the metrics' `register`).
//!
//! ## Which routing handle
//!
//! All three give the same answers; they differ in what each call looks up.
//!
//! - [`WorkerRouter`]: routes any model by name (one map lookup per call).
//!   Cheap to clone, `Send + Sync`: keep one in your app state and call it
//!   from any task. Start here.
//! - [`ModelRouter`] (`router.model(name)`): one model, no name lookup.
//!   Also `Send + Sync` and cheap to clone: use it when a handler or task
//!   serves one known model.
//! - [`LocalRouter`] (`model.local()`): a `ModelRouter` that caches the
//!   model's published view; `route` takes `&mut self`. Use it in a loop that
//!   routes many requests from one thread or one long-lived task (a
//!   dispatcher, a benchmark). Inside tokio request handlers, prefer
//!   `WorkerRouter` or `ModelRouter`: a `LocalRouter` per request would
//!   rebuild its cache every time.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use loadgate::*;
//!
//! let monitor = Arc::new(WorkerMonitor::new(MonitorConfig::default()).unwrap());
//! // The incarnation is picked at the worker's start (a restart picks a new one).
//! monitor.register_worker(Registration::new(1, "llama").dp_size(1).incarnation(100)).unwrap();
//! monitor.register_worker(Registration::new(2, "llama").incarnation(200)).unwrap();
//! monitor
//!     .set_thresholds("llama", BusyThresholds { active_decode_blocks_threshold: Some(0.85), ..Default::default() })
//!     .unwrap();
//! let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
//!
//! // Worker 1 fills its KV cache: 90 of 100 blocks (an in-process report;
//! // the event plane's come numbered, through `monitor.apply(&LoadReport { .. })`).
//! let full = RankLoad { active_decode_blocks: 90, kv_total_blocks: 100, ..Default::default() };
//! monitor.reporter(1).unwrap().report(full).unwrap();
//! assert_eq!(router.route("llama", &[]), Ok(2)); // routed around the busy worker
//!
//! monitor.apply(&LoadReport { worker: 2, incarnation: 200, seq: 1, load: full, ..Default::default() }).unwrap();
//! assert_eq!(router.route("llama", &[]), Err(RouteError::Overloaded)); // shed: HTTP 529
//!
//! // Layer 2: a worker admits N = 1 running plus Q = 2 waiting.
//! let gate = Admission::new(1, 2).unwrap();
//! let Ok(Admitted::Now((), running)) = gate.try_admit(()) else { panic!() };
//! // `gate.admit(()).await` would wait for `running` to be dropped.
//! assert!(gate.try_admit(()).is_err()); // no slot free now: "Server overloaded: worker at capacity"
//! # drop(running);
//! ```
//!
//! An axum service that routes, sheds, streams and serves `/metrics` in
//! under 90 lines is `examples/axum_router.rs`.
//!
//! # Growing without breaking
//!
//! The plain data structs ([`RankLoad`], [`LoadReport`], [`BusyThresholds`],
//! [`BusySignals`](thresholds::BusySignals), [`MonitorConfig`]) keep public
//! fields and implement [`Default`]; build them with `..Default::default()`.
//! A field added later always defaults to "not reported" or "not
//! configured", so such code keeps compiling and keeps its meaning. Public
//! error enums are `#[non_exhaustive]`.

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod admission;
pub mod backoff;
mod busy;
pub mod class;
pub mod docs;
#[cfg(feature = "engines")]
#[cfg_attr(docsrs, doc(cfg(feature = "engines")))]
pub mod engines;
pub mod headroom;
mod load;
#[cfg(feature = "prometheus")]
#[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
pub mod metrics;
pub mod migration;
pub mod monitor;
#[cfg(feature = "openai-error")]
pub mod openai_error;
mod padded;
#[cfg(feature = "threshold-api")]
#[cfg_attr(docsrs, doc(cfg(feature = "threshold-api")))]
pub mod patch;
pub mod rejection;
pub mod retry_hint;
pub mod route;
mod sync;
pub mod tenant;
pub mod thresholds;
pub mod waiting;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod web;
#[cfg(feature = "wire")]
#[cfg_attr(docsrs, doc(cfg(feature = "wire")))]
pub mod wire;

pub use admission::{Admission, Admitted, Permit, PermitStream, Rejected};
pub use backoff::RetryPolicy;
pub use class::{Class, PerClass};
pub use headroom::HeadroomError;
pub use load::{LoadReport, RankLoad, WorkerId};
pub use migration::{Migration, MigrationError};
pub use monitor::{MonitorConfig, Registration, Reporter, WorkerMonitor};
pub use rejection::Rejection;
pub use route::{LocalRouter, ModelRouter, Policy, RouteError, WorkerRouter};
pub use tenant::Tenant;
pub use thresholds::BusyThresholds;
pub use waiting::{LineLimits, Ticket, Wait, WaitError};
#[cfg(all(feature = "axum", feature = "prometheus"))]
pub use web::Exposition;
#[cfg(feature = "axum")]
pub use web::Routed;
#[cfg(feature = "tower")]
pub use web::{AdmissionLayer, PermitBody, Refusal, RetryAfter};
