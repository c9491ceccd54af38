//! [`AdmissionLayer`]: a worker's hard cap as a tower layer that holds each
//! request's permit until its response body ends.
//!
//! tower's `ConcurrencyLimitLayer` releases its permit when the response
//! future resolves, at the headers: a streamed (SSE) response then runs on
//! the engine without a slot. Here, as in tower-http's `InFlightRequests`,
//! the permit moves into the response body ([`PermitBody`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use ::http::{Request, Response};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::body::PermitBody;
use super::refusal::{Refusal, RetryAfter};
use crate::admission::{Admission, Permit};
use crate::sync::Arc;

/// Admits every request through `gate` (`N` running, `Q` waiting in arrival
/// order); past `N + Q` it answers at once with the overload status, the
/// OpenAI-shaped body and the `Retry-After` hint ([`Refusal`]).
/// The permit is held until the response body ends, fails or is dropped.
#[derive(Clone)]
pub struct AdmissionLayer {
    gate: Arc<Admission<()>>,
    retry_after: Option<RetryAfter>,
}

impl AdmissionLayer {
    /// A layer over `gate` (its `Arc`, as [`Admission::new`] gives it).
    pub fn new(gate: impl Into<Arc<Admission<()>>>) -> Self {
        AdmissionLayer { gate: gate.into(), retry_after: None }
    }

    /// Refusals carry `Retry-After` from `hint` (else the default one,
    /// [`Refusal`]'s).
    #[must_use]
    pub fn retry_after(mut self, hint: RetryAfter) -> Self {
        self.retry_after = Some(hint);
        self
    }
}

impl fmt::Debug for AdmissionLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionLayer").field("gate", &self.gate).finish_non_exhaustive()
    }
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = AdmissionService<S>;

    fn layer(&self, inner: S) -> AdmissionService<S> {
        AdmissionService { inner, gate: self.gate.clone(), retry_after: self.retry_after.clone() }
    }
}

/// The service of [`AdmissionLayer`].
#[derive(Clone)]
pub struct AdmissionService<S> {
    inner: S,
    gate: Arc<Admission<()>>,
    retry_after: Option<RetryAfter>,
}

impl<S> fmt::Debug for AdmissionService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionService").field("gate", &self.gate).finish_non_exhaustive()
    }
}

/// The future of [`AdmissionService`].
pub type AdmissionFuture<B, E> = Pin<Box<dyn Future<Output = Result<Response<GateBody<B>>, E>> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for AdmissionService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    ReqBody: Send + 'static,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<GateBody<ResBody>>;
    type Error = S::Error;
    type Future = AdmissionFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The service that `poll_ready` readied serves this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let admit = self.gate.admit(());
        let retry_after = self.retry_after.clone();
        Box::pin(async move {
            match admit.await {
                Ok(((), permit)) => {
                    let response = inner.call(request).await?;
                    Ok(response.map(|body| GateBody::admitted(body, permit)))
                }
                Err(rejected) => {
                    Ok(Refusal::from(rejected).hinted(retry_after.as_ref()).to_http().map(GateBody::refused))
                }
            }
        })
    }
}

pin_project! {
    /// The response body of [`AdmissionService`]: the inner body holding its
    /// permit, or a refusal's JSON.
    pub struct GateBody<B> {
        #[pin]
        inner: Inner<B>,
    }
}

pin_project! {
    #[project = InnerProj]
    enum Inner<B> {
        Admitted { #[pin] body: PermitBody<B, Permit<()>> },
        Refused { body: Option<Bytes> },
    }
}

impl<B> GateBody<B> {
    fn admitted(body: B, permit: Permit<()>) -> Self {
        GateBody { inner: Inner::Admitted { body: PermitBody::new(body, permit) } }
    }

    fn refused(body: Bytes) -> Self {
        GateBody { inner: Inner::Refused { body: Some(body) } }
    }
}

impl<B> fmt::Debug for GateBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let admitted = matches!(self.inner, Inner::Admitted { .. });
        f.debug_struct("GateBody").field("admitted", &admitted).finish_non_exhaustive()
    }
}

impl<B: Body<Data = Bytes>> Body for GateBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().inner.project() {
            InnerProj::Admitted { body } => body.poll_frame(cx),
            InnerProj::Refused { body } => Poll::Ready(body.take().map(|bytes| Ok(Frame::data(bytes)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Admitted { body } => body.is_end_stream(),
            Inner::Refused { body } => body.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Admitted { body } => body.size_hint(),
            Inner::Refused { body } => SizeHint::with_exact(body.as_ref().map_or(0, |b| b.len() as u64)),
        }
    }
}
