//! `/metrics` for axum (features `axum` and `prometheus`): [`Exposition`],
//! the registry the page writes, and [`metrics`], the handler that writes it
//! in the format the scraper asks for.

use std::convert::Infallible;
use std::fmt;

use ::http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use axum_core::body::Body;
use axum_core::extract::{FromRef, FromRequestParts};
use axum_core::response::IntoResponse;
use prometheus_client::registry::Registry;

use crate::metrics::{MetricsFormat, RejectionMetrics};
use crate::monitor::WorkerMonitor;
use crate::sync::Arc;

/// What `/metrics` writes: a prometheus-client [`Registry`] (loadgate's
/// families, and any of the embedder's own), encoded afresh at each scrape
/// in the format its `Accept` asks for ([`MetricsFormat::from_accept`]).
/// Cheap to clone: keep it in the state, for [`metrics`].
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use loadgate::metrics::{Endpoint, RejectionMetrics};
/// use loadgate::{web::Exposition, WorkerMonitor};
///
/// let monitor = Arc::new(WorkerMonitor::new(Default::default()).unwrap());
/// let rejections = Arc::new(RejectionMetrics::default()); // also `Routed`'s extension
/// let exposition = Exposition::frontend(rejections.clone(), monitor);
/// rejections.record("llama", Endpoint::Completions, []);
///
/// let mut headers = axum::http::HeaderMap::new();
/// headers.insert("accept", "application/openmetrics-text;version=1.0.0".parse().unwrap());
/// let page = exposition.to_http(&headers);
/// assert_eq!(page.headers()["content-type"], "application/openmetrics-text; version=1.0.0; charset=utf-8");
/// assert!(page.body().contains(r#"dynamo_frontend_model_rejection_total{model="llama",endpoint="completions"} 1"#));
/// assert!(page.body().ends_with("# EOF\n"));
/// ```
#[derive(Clone)]
pub struct Exposition(Arc<Registry>);

impl Exposition {
    /// Writes `registry`: register everything into it first (a collector
    /// reads its figures at each scrape, so nothing goes stale).
    pub fn new(registry: Registry) -> Self {
        Exposition(Arc::new(registry))
    }

    /// Writes the frontend's families: `rejections` (the same `Arc` as
    /// `Routed`'s extension) and `monitor`'s per-rank load, as
    /// [`RejectionMetrics::register`] puts them.
    pub fn frontend(rejections: impl Into<Arc<RejectionMetrics>>, monitor: impl Into<Arc<WorkerMonitor>>) -> Self {
        let mut registry = Registry::default();
        rejections.into().register(&mut registry, monitor);
        Exposition::new(registry)
    }

    /// The registry written.
    pub fn registry(&self) -> &Registry {
        &self.0
    }

    /// The page in `format`: a complete exposition.
    pub fn render(&self, format: MetricsFormat) -> String {
        format.encode(&self.0)
    }

    /// The answer to a request with these headers: 200, the page in the
    /// format of its `Accept` lines (joined; one that is not text counts as
    /// absent), that format's `Content-Type`, and `Vary: Accept`.
    pub fn to_http(&self, headers: &HeaderMap) -> Response<String> {
        let format = format_of(headers);
        let mut response = Response::new(self.render(format));
        *response.status_mut() = StatusCode::OK;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(format.content_type()));
        headers.insert(header::VARY, HeaderValue::from_static("Accept"));
        response
    }
}

impl fmt::Debug for Exposition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Exposition").field(&self.0).finish()
    }
}

/// The format for a request with these headers: every `Accept` line,
/// joined, read by [`MetricsFormat::from_accept`].
fn format_of(headers: &HeaderMap) -> MetricsFormat {
    let accept: Vec<&str> = headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).collect();
    MetricsFormat::from_accept((!accept.is_empty()).then(|| accept.join(",")).as_deref())
}

/// `GET /metrics`: the state's [`Exposition`] in the format the request's
/// `Accept` asks for (OpenMetrics for Prometheus, the text format 0.0.4
/// for curl and classic scrapers). For any state that gives an
/// `Exposition` through `FromRef`:
/// `axum::Router::new().route("/metrics", get(loadgate::web::metrics))`.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use axum::{extract::FromRef, routing::get, Router};
/// use loadgate::{metrics::RejectionMetrics, web::Exposition, Policy, WorkerMonitor, WorkerRouter};
///
/// #[derive(Clone, FromRef)]
/// struct App {
///     router: WorkerRouter,
///     metrics: Exposition,
/// }
///
/// let monitor = Arc::new(WorkerMonitor::new(Default::default()).unwrap());
/// let app = App {
///     metrics: Exposition::frontend(RejectionMetrics::default(), monitor.clone()),
///     router: WorkerRouter::new(monitor, Policy::RoundRobin),
/// };
/// let http: Router = Router::new().route("/metrics", get(loadgate::web::metrics)).with_state(app);
/// # let _ = http;
/// ```
pub async fn metrics(scrape: Scrape) -> axum_core::response::Response {
    scrape.into_response()
}

/// One scrape of the state's [`Exposition`], answered: the extractor of
/// [`metrics`] (it never refuses).
#[derive(Debug)]
pub struct Scrape(Response<String>);

impl<S> FromRequestParts<S> for Scrape
where
    S: Send + Sync,
    Exposition: FromRef<S>,
{
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut ::http::request::Parts, state: &S) -> Result<Self, Infallible> {
        Ok(Scrape(Exposition::from_ref(state).to_http(&parts.headers)))
    }
}

impl IntoResponse for Scrape {
    fn into_response(self) -> axum_core::response::Response {
        self.0.map(Body::from)
    }
}
