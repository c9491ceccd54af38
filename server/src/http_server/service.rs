//! [`tracked`]: the hyper service of one connection: the axum router, with
//! each request marked busy in the connection's [`Registry`] entry from the
//! moment hyper hands it over until its response body has ended (or been
//! dropped: the client went away, the connection closed). hyper has no idle
//! timer of its own; this is what the idle timeout and the eviction of idle
//! connections are measured against. Each response body is also watched by
//! the connection's write-progress deadline (`write_progress.rs`).
//!
//! [`Registry`]: super::registry::Registry

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::Router;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::service::TowerToHyperService;

use super::registry::{Busy, SlotHandle};
use super::write_progress::{Watched, WriteWatch};

/// The future of one tracked request.
pub(super) type TrackedFuture = Pin<Box<dyn Future<Output = Result<hyper::Response<TrackedBody>, Infallible>> + Send>>;

/// `router` as a hyper service whose requests mark `slot` busy and whose
/// response bodies `watch` holds to the write-progress deadline.
pub(super) fn tracked(router: Router, slot: SlotHandle, watch: Arc<WriteWatch>) -> Tracked {
    Tracked { inner: TowerToHyperService::new(router), slot, watch }
}

/// The hyper service of one connection (see the module docs).
#[derive(Clone, Debug)]
pub(super) struct Tracked {
    inner: TowerToHyperService<Router>,
    slot: SlotHandle,
    watch: Arc<WriteWatch>,
}

impl hyper::service::Service<hyper::Request<Incoming>> for Tracked {
    type Response = hyper::Response<TrackedBody>;
    type Error = Infallible;
    type Future = TrackedFuture;

    fn call(&self, request: hyper::Request<Incoming>) -> TrackedFuture {
        let busy = self.slot.busy();
        let response = self.inner.call(request);
        let watch = self.watch.clone();
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| TrackedBody { body: watch.watch(body), _busy: busy }))
        })
    }
}

/// A response body that keeps its connection busy until it ends or drops.
#[derive(Debug)]
pub(super) struct TrackedBody {
    body: Watched<Body>,
    _busy: Busy,
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        http_body::Body::is_end_stream(&self.body)
    }

    fn size_hint(&self) -> SizeHint {
        http_body::Body::size_hint(&self.body)
    }
}
