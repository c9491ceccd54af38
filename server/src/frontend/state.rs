//! [`Frontend`]: the state every route of the frontend shares.

use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use loadgate::{
    metrics::{Endpoint, Reason, RejectionMetrics},
    WorkerMonitor, WorkerRouter,
};

use crate::directory::WorkerDirectory;
use crate::frontend::args::{Args, RouterMode};
use crate::frontend::inflight::{InFlight, Tracking};
use crate::frontend::reply;

/// The frontend's shared state, handed to every route.
#[derive(Debug)]
pub struct Frontend {
    pub(crate) monitor: Arc<WorkerMonitor>,
    pub(crate) router: WorkerRouter,
    pub(crate) directory: Arc<WorkerDirectory>,
    pub(crate) metrics: RejectionMetrics,
    pub(crate) inflight: Arc<InFlight>,
    pub(crate) client: reqwest::Client,
    pub(crate) migration_limit: usize,
}

impl Frontend {
    /// A frontend over `monitor` configured by `args`.
    ///
    /// # Errors
    ///
    /// The HTTP client could not be built.
    pub fn new(args: &Args, monitor: Arc<WorkerMonitor>, directory: Arc<WorkerDirectory>) -> anyhow::Result<Self> {
        let tracking =
            (args.router_mode == RouterMode::Kv).then_some(Tracking { output_blocks: args.router_track_output_blocks });
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .pool_idle_timeout(Duration::from_secs(30))
            .tcp_nodelay(true)
            .build()?;
        Ok(Frontend {
            router: WorkerRouter::new(monitor.clone(), args.policy()),
            inflight: Arc::new(InFlight::new(monitor.clone(), tracking)),
            monitor,
            directory,
            metrics: RejectionMetrics::default(),
            client,
            migration_limit: args.migration_limit,
        })
    }
}

impl Frontend {
    /// Answers the overload status and counts it in
    /// `dynamo_frontend_model_rejection_total`, with the busy signals that
    /// made the workers busy and the `causes` of this request's own
    /// exclusions (`worker_capacity` when workers refused at their cap,
    /// `excluded` when every free worker had refused it).
    pub(crate) fn reject_overloaded(
        &self,
        model: &str,
        endpoint: Endpoint,
        causes: impl IntoIterator<Item = Reason>,
    ) -> Response {
        let busy = Reason::from_signals(self.monitor.model_busy_reasons(model));
        self.metrics.record(model, endpoint, busy.chain(causes));
        reply::overloaded()
    }
}
