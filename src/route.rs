//! [`WorkerRouter`]: picks an eligible instance of a model — not busy (when the
//! model has a threshold), not excluded by this request — by policy.

use std::collections::HashMap;
use std::fmt;

use crossbeam_utils::CachePadded;

use crate::class::Class;
use crate::headroom::{Headroom, HeadroomError};
use crate::load::WorkerId;
use crate::monitor::entry::WorkerEntry;
use crate::monitor::view::ModelView;
use crate::monitor::{ModelState, WorkerLoad, WorkerMonitor};
use crate::sync::{lock, Arc, AtomicUsize, Mutex, Ordering, Swap, SwapCache};
use crate::waiting::{Ticket, Wait, WaitError};

/// A caller-supplied cost: lower is better (the hook a KV-aware router uses to
/// prefer the worker with the best prefix overlap).
pub type CostFn = Arc<dyn Fn(WorkerId, &WorkerLoad) -> u64 + Send + Sync>;

/// A borrowed cost function.
type CostRef<'a> = &'a dyn Fn(WorkerId, &WorkerLoad) -> u64;

/// How a router chooses among eligible instances.
#[derive(Clone)]
pub enum Policy {
    /// Each eligible instance in turn, fairly: the k-th request takes the
    /// (k mod eligible)-th eligible instance.
    RoundRobin,
    /// Uniformly at random among eligible instances.
    Random,
    /// Two random eligible instances; the less loaded one.
    PowerOfTwoChoices,
    /// The least loaded eligible instance (decode utilisation, then prefill).
    LeastLoaded,
    /// The eligible instance of lowest cost.
    Cost(CostFn),
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Policy::RoundRobin => "RoundRobin",
            Policy::Random => "Random",
            Policy::PowerOfTwoChoices => "PowerOfTwoChoices",
            Policy::LeastLoaded => "LeastLoaded",
            Policy::Cost(_) => "Cost(..)",
        })
    }
}

/// Why no instance was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RouteError {
    /// Instances are in routing but none is eligible (busy or excluded; any
    /// others out of routing).
    /// Pool-wide: retrying elsewhere cannot help. HTTP: the overload status.
    Overloaded,
    /// The model is known but no instance is registered, or every one is
    /// out of routing ([`WorkerMonitor::set_out_of_routing`]). HTTP 503.
    Unavailable,
    /// The model has never been seen. HTTP 404.
    UnknownModel,
}

impl fmt::Display for RouteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RouteError::Overloaded => "All workers are busy, please retry later",
            RouteError::Unavailable => "No worker is available for this model",
            RouteError::UnknownModel => "Unknown model",
        })
    }
}

impl std::error::Error for RouteError {}

/// Routes requests of any model known to a [`WorkerMonitor`].
///
/// Selection takes no lock and allocates nothing: one registry load and a
/// lookup (skip both with [`WorkerRouter::model`]), one view load, one index
/// into a chunk's free positions (skip the view load too with
/// [`ModelRouter::local`]).
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use loadgate::{Policy, RouteError, WorkerRouter, WorkerMonitor};
///
/// let monitor = Arc::new(WorkerMonitor::new(Default::default()).unwrap());
/// monitor.register(1, "m", 1, 0).unwrap();
/// monitor.register(2, "m", 1, 0).unwrap();
/// let router = WorkerRouter::new(monitor, Policy::RoundRobin);
/// assert_eq!(router.route("m", &[]), Ok(1));
/// assert_eq!(router.route("m", &[]), Ok(2));
/// assert_eq!(router.route("m", &[1, 2]), Err(RouteError::Overloaded));
/// assert_eq!(router.route("other", &[]), Err(RouteError::UnknownModel));
/// ```
///
/// Each router keeps its own round-robin cursor per model (shared by its
/// clones and by the [`ModelRouter`]s and [`LocalRouter`]s made from it), so
/// routers with different policies over one monitor never disturb each
/// other's rotation.
#[derive(Clone)]
pub struct WorkerRouter {
    monitor: Arc<WorkerMonitor>,
    policy: Policy,
    models: Arc<RoutedModels>,
    /// Kept from sheddable requests ([`WorkerRouter::with_sheddable_headroom`]).
    headroom: Option<Headroom>,
}

impl fmt::Debug for WorkerRouter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerRouter").field("policy", &self.policy).finish_non_exhaustive()
    }
}

/// The models a router has routed, each with this router's cursor. Only
/// models the monitor knows are added, so a client naming models cannot
/// grow it. When the monitor forgets a model (its last worker left) it
/// retires the model's state, whose view is then empty: a route that finds
/// no instance checks for that (cold path) and looks the model up again, so
/// a model that comes back is routed with its new state. Each addition drops
/// the retired entries, so forgotten models do not pile up here.
struct RoutedModels {
    by_name: Swap<HashMap<Arc<str>, Arc<RoutedModel>, rustc_hash::FxBuildHasher>>,
    /// Serialises additions (cold path: the first route of a model).
    write: Mutex<()>,
}

/// One model as one router sees it.
pub(crate) struct RoutedModel {
    pub(crate) state: Arc<ModelState>,
    /// This router's rotation over the model's eligible instances.
    cursor: CachePadded<AtomicUsize>,
}

impl Default for RoutedModels {
    fn default() -> Self {
        RoutedModels { by_name: Swap::from_pointee(HashMap::default()), write: Mutex::new(()) }
    }
}

impl RoutedModel {
    /// The next value of the rotation.
    #[inline]
    fn turn(&self) -> usize {
        // Relaxed: the cursor only spreads load; no data hangs on it.
        self.cursor.fetch_add(1, Ordering::Relaxed)
    }
}

impl WorkerRouter {
    /// A router over `monitor`'s workers using `policy`: pass the monitor
    /// or a clone of the `Arc` you keep it in.
    pub fn new(monitor: impl Into<Arc<WorkerMonitor>>, policy: Policy) -> Self {
        WorkerRouter { monitor: monitor.into(), policy, models: Arc::default(), headroom: None }
    }

    /// This router with `fraction` of each busy threshold kept from
    /// sheddable requests (in `[0, 1)`; 0: none): they see a worker as
    /// busy at each threshold × (1 − `fraction`), so they are the first
    /// refused ([`crate::headroom`]). Only the class-aware calls
    /// ([`WorkerRouter::route_class`], [`WorkerRouter::wait`]) apply it.
    ///
    /// # Errors
    ///
    /// `fraction` outside `[0, 1)`.
    pub fn with_sheddable_headroom(self, fraction: f64) -> Result<Self, HeadroomError> {
        Ok(WorkerRouter { headroom: Headroom::new(fraction)?, ..self })
    }

    /// The fraction of each threshold kept from sheddable requests (0: none).
    pub fn sheddable_headroom(&self) -> f64 {
        self.headroom.map_or(0.0, Headroom::fraction)
    }

    #[inline]
    pub(crate) fn headroom(&self) -> Option<Headroom> {
        self.headroom
    }

    /// As [`route`](Self::route) for a request of `class`: a sheddable one
    /// only to a worker with the sheddable headroom free
    /// ([`WorkerRouter::with_sheddable_headroom`]).
    ///
    /// # Errors
    ///
    /// As [`route`](Self::route).
    pub fn route_class(&self, model: &str, exclude: &[WorkerId], class: Class) -> Result<WorkerId, RouteError> {
        if class != Class::Sheddable || self.headroom.is_none() {
            return self.route(model, exclude);
        }
        self.with_routed(model, |routed| self.route_class_routed(routed, exclude, class))?
    }

    /// As [`route_class`](Self::route_class) for a request that may not
    /// wait, beside requests that do ([`wait`](Self::wait)): while anyone
    /// of its class or a higher one waits in the model's line, it gets no
    /// worker ahead of them ([`RouteError::Overloaded`]), as a request that
    /// may wait would join the line behind them; waiters of lower classes
    /// only (say, sheddable ones kept off the headroom) do not hold it back,
    /// as they would not in the line: it routes past the workers the line
    /// gave a waiter since their last report, and the worker it gets takes
    /// no waiter until its next one. With nobody waiting, the same route
    /// (one more atomic load); with waiters, a non-sheddable request takes
    /// the line's lock once.
    ///
    /// # Errors
    ///
    /// As [`route`](Self::route).
    pub fn route_class_behind_line(
        &self,
        model: &str,
        exclude: &[WorkerId],
        class: Class,
    ) -> Result<WorkerId, RouteError> {
        self.with_routed(model, |routed| {
            // A forgotten model's line says nothing of the model now: the
            // route looks it up again.
            let line = &routed.state.line;
            if !line.is_waiting() || routed.state.is_retired() {
                return self.route_class_routed(routed, exclude, class);
            }
            line.route_ahead(class, |spent| {
                let mut skip = exclude.to_vec();
                skip.extend(spent.iter().filter(|w| !exclude.contains(w)));
                self.route_class_routed(routed, &skip, class)
            })
        })?
    }

    /// This router's view of `model`: one map lookup, or (the first time)
    /// the monitor's.
    #[inline]
    fn with_routed<R>(&self, model: &str, f: impl FnOnce(&RoutedModel) -> R) -> Result<R, RouteError> {
        // A retired entry is still taken here: its empty view sends the
        // route to `route_again`, off this path.
        if let Some(routed) = self.models.by_name.load().get(model) {
            return Ok(f(routed));
        }
        Ok(f(&*self.add_model(model)?))
    }

    /// Resolves `model` through the monitor and caches it, replacing a
    /// retired entry and dropping every other retired one (cold path: the
    /// first route of a model, or the first after it was forgotten).
    #[cold]
    fn add_model(&self, model: &str) -> Result<Arc<RoutedModel>, RouteError> {
        let cached = self.models.by_name.load();
        if let Some(routed) = cached.get(model).filter(|r| !r.state.is_retired()) {
            return Ok(routed.clone()); // another route got here first: no lock
        }
        if !cached.contains_key(model) && !self.monitor.has_model(model) {
            return Err(RouteError::UnknownModel); // nothing to add or drop: no lock
        }
        drop(cached);
        let _write = lock(&self.models.write);
        let current = self.models.by_name.load();
        if let Some(routed) = current.get(model).filter(|r| !r.state.is_retired()) {
            return Ok(routed.clone());
        }
        let state = self.monitor.model_state(model);
        let mut next = HashMap::clone(&current);
        drop(current);
        next.retain(|_, r| !r.state.is_retired());
        let routed = state.map(|state| Arc::new(RoutedModel { state, cursor: CachePadded::new(AtomicUsize::new(0)) }));
        if let Some(routed) = &routed {
            next.insert(routed.state.name.clone(), routed.clone());
        }
        self.models.by_name.store(Arc::new(next));
        routed.ok_or(RouteError::UnknownModel)
    }

    /// After `routed` had no instance: if the monitor forgot its model, routes
    /// `model` again with the monitor's current state (cold path).
    #[cold]
    fn route_again(
        &self,
        model: &str,
        routed: &RoutedModel,
        exclude: &[WorkerId],
        cost: Option<CostRef<'_>>,
    ) -> Result<WorkerId, RouteError> {
        if !routed.state.is_retired() {
            return Err(RouteError::Unavailable);
        }
        let fresh = self.add_model(model)?;
        self.select(&fresh, &fresh.state.view().load(), exclude, cost)
    }

    /// The monitor this router reads.
    pub fn monitor(&self) -> &Arc<WorkerMonitor> {
        &self.monitor
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Picks an instance of `model`, skipping `exclude` (workers that already
    /// refused this request).
    ///
    /// # Errors
    ///
    /// [`RouteError`]: overloaded, unavailable, or unknown model.
    #[inline]
    pub fn route(&self, model: &str, exclude: &[WorkerId]) -> Result<WorkerId, RouteError> {
        self.with_routed(model, |routed| {
            match self.select(routed, &routed.state.view().load(), exclude, self.policy_cost()) {
                Err(RouteError::Unavailable) => self.route_again(model, routed, exclude, self.policy_cost()),
                chosen => chosen,
            }
        })?
    }

    /// As [`route`](Self::route), ranking eligible instances by `cost` (lowest
    /// wins; ties go to the first from a rotating start).
    ///
    /// # Errors
    ///
    /// [`RouteError`]: overloaded, unavailable, or unknown model.
    pub fn route_by_cost(
        &self,
        model: &str,
        exclude: &[WorkerId],
        cost: &dyn Fn(WorkerId, &WorkerLoad) -> u64,
    ) -> Result<WorkerId, RouteError> {
        self.with_routed(model, |routed| match self.select(routed, &routed.state.view().load(), exclude, Some(cost)) {
            Err(RouteError::Unavailable) => self.route_again(model, routed, exclude, Some(cost)),
            chosen => chosen,
        })?
    }

    /// Routes `model` as [`route`](Self::route) does, or waits in the
    /// model's line (see [`crate::waiting`]) until an instance frees for
    /// it; `timer` (the caller's runtime's sleep until `ticket.deadline`)
    /// ends the wait with [`WaitError::Deadline`]. Cancel-safe: dropping
    /// the future leaves the line.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::{Duration, Instant};
    /// use loadgate::{Policy, Ticket, WaitError, WorkerMonitor, WorkerRouter};
    ///
    /// let monitor = Arc::new(WorkerMonitor::new(Default::default()).unwrap());
    /// monitor.register(1, "m", 1, 0).unwrap();
    /// let router = WorkerRouter::new(monitor, Policy::RoundRobin);
    /// let ticket = Ticket::new(100, Instant::now() + Duration::from_secs(1));
    /// // Any executor; a worker is free, so the first poll routes.
    /// let routed = futures_executor_block_on(router.wait("m", &[], ticket, std::future::pending()));
    /// assert_eq!(routed, Ok(1));
    /// # fn futures_executor_block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     let mut f = std::pin::pin!(f);
    /// #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    /// #     loop { if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
    /// # }
    /// ```
    pub fn wait<T>(&self, model: &str, exclude: &[WorkerId], ticket: Ticket, timer: T) -> Wait<'_, T> {
        match self.routed(model) {
            Ok(routed) => Wait::new(self, routed, exclude, ticket, timer),
            // `routed` fails only for a model never seen.
            Err(_) => Wait::failed(self, WaitError::UnknownModel, ticket, timer),
        }
    }

    /// This router's state of `model` (a lookup; the monitor's the first
    /// time).
    pub(crate) fn routed(&self, model: &str) -> Result<Arc<RoutedModel>, RouteError> {
        match self.models.by_name.load().get(model).filter(|r| !r.state.is_retired()) {
            Some(routed) => Ok(routed.clone()),
            None => self.add_model(model),
        }
    }

    /// Routes the model of `routed` (as [`ModelRouter::route`]).
    #[inline]
    pub(crate) fn route_routed(&self, routed: &RoutedModel, exclude: &[WorkerId]) -> Result<WorkerId, RouteError> {
        self.route_routed_in(routed, &routed.state.view().load(), exclude)
    }

    /// As [`route_routed`](Self::route_routed) with the model's view
    /// `view` read (the waiting line's, under its lock).
    #[inline]
    pub(crate) fn route_routed_in(
        &self,
        routed: &RoutedModel,
        view: &ModelView,
        exclude: &[WorkerId],
    ) -> Result<WorkerId, RouteError> {
        let cost = self.policy_cost();
        match self.select(routed, view, exclude, cost) {
            Err(RouteError::Unavailable) => self.route_again(&routed.state.name, routed, exclude, cost),
            chosen => chosen,
        }
    }

    /// A handle that routes `model` without the per-call model lookup.
    ///
    /// # Errors
    ///
    /// [`RouteError::UnknownModel`] if the model has never been seen.
    pub fn model(&self, model: &str) -> Result<ModelRouter, RouteError> {
        Ok(ModelRouter { router: self.clone(), routed: self.routed(model)? })
    }

    #[inline]
    fn policy_cost(&self) -> Option<CostRef<'_>> {
        match &self.policy {
            Policy::Cost(f) => Some(&**f),
            _ => None,
        }
    }

    #[inline(always)]
    fn select(
        &self,
        routed: &RoutedModel,
        view: &ModelView,
        exclude: &[WorkerId],
        cost: Option<CostRef<'_>>,
    ) -> Result<WorkerId, RouteError> {
        if exclude.is_empty() && cost.is_none() && matches!(self.policy, Policy::RoundRobin) {
            return round_robin(routed, view);
        }
        self.select_by_policy(routed, view, exclude, cost)
    }

    fn select_by_policy(
        &self,
        routed: &RoutedModel,
        view: &ModelView,
        exclude: &[WorkerId],
        cost: Option<CostRef<'_>>,
    ) -> Result<WorkerId, RouteError> {
        self.select_in(routed, &Eligible::new(view, exclude), cost)
    }

    /// As [`route_routed`](Self::route_routed) with `view` loaded, choosing
    /// only among `among` (ids, ascending; a member not eligible in `view`
    /// is passed over) less `exclude`: the waiting line's free workers in
    /// a large fleet. The same choice as a route that excludes every other
    /// eligible instance, at the cost of `among`'s length, not the
    /// model's. A view with no instance in routing gives
    /// [`RouteError::Unavailable`] without looking the model up again.
    pub(crate) fn route_among_routed(
        &self,
        routed: &RoutedModel,
        view: &ModelView,
        among: &[WorkerId],
        exclude: &[WorkerId],
    ) -> Result<WorkerId, RouteError> {
        self.select_in(routed, &Eligible::among(view, among, exclude), self.policy_cost())
    }

    fn select_in(
        &self,
        routed: &RoutedModel,
        eligible: &Eligible<'_>,
        cost: Option<CostRef<'_>>,
    ) -> Result<WorkerId, RouteError> {
        let view = eligible.view;
        let count = eligible.count();
        if count == 0 {
            return Err(no_instance(view));
        }
        let position = match (cost, &self.policy) {
            (Some(cost), _) => self.lowest(routed, eligible, |entry| cost(entry.id, &self.monitor.load_of(entry))),
            (None, Policy::RoundRobin) => eligible.nth(routed.turn() % count),
            (None, Policy::Random) => eligible.nth(fastrand::usize(..count)),
            (None, Policy::PowerOfTwoChoices) => {
                let i = fastrand::usize(..count);
                let a = eligible.nth(i);
                if count == 1 {
                    a
                } else {
                    // Uniform over the other `count - 1`: skip over `i`.
                    let k = fastrand::usize(..count - 1);
                    let b = eligible.nth(if k >= i { k + 1 } else { k });
                    if self.load(view, b).cmp_load(&self.load(view, a)).is_lt() {
                        b
                    } else {
                        a
                    }
                }
            }
            (None, Policy::LeastLoaded) => {
                let mut best = None::<(usize, WorkerLoad)>;
                eligible.for_each_from(start(routed, view), |p, entry| {
                    let load = self.monitor.load_of(entry);
                    if best.as_ref().is_none_or(|(_, b)| load.cmp_load(b).is_lt()) {
                        best = Some((p, load));
                    }
                });
                best.map(|(p, _)| p).unwrap_or_else(|| eligible.nth(0))
            }
            (None, Policy::Cost(_)) => unreachable!("policy_cost returns the cost function"),
        };
        Ok(view.id(position))
    }

    #[inline]
    fn load(&self, view: &ModelView, position: usize) -> WorkerLoad {
        self.monitor.load_of(view.entry(position))
    }

    fn lowest(
        &self,
        routed: &RoutedModel,
        eligible: &Eligible<'_>,
        mut cost: impl FnMut(&WorkerEntry) -> u64,
    ) -> usize {
        let mut best = None::<(usize, u64)>;
        eligible.for_each_from(start(routed, eligible.view), |p, entry| {
            let c = cost(entry);
            if best.is_none_or(|(_, b)| c < b) {
                best = Some((p, c));
            }
        });
        best.map(|(p, _)| p).unwrap_or_else(|| eligible.nth(0))
    }
}

/// Round-robin with no exclusions, the common case: the same choice as the
/// general path (the k-th request takes the (k mod eligible)-th eligible
/// instance) in a cursor increment and one index into a chunk's list of
/// free positions.
#[inline(always)]
fn round_robin(routed: &RoutedModel, view: &ModelView) -> Result<WorkerId, RouteError> {
    let count = view.eligible;
    if count == 0 {
        return Err(no_instance(view));
    }
    Ok(view.nth_eligible_id(routed.turn() % count))
}

/// Why a view offers no instance: none registered, or every one out of
/// routing (nothing alive to take the request), is unavailable; otherwise
/// the model is overloaded (its instances in routing are busy or excluded).
#[cold]
fn no_instance(view: &ModelView) -> RouteError {
    if view.is_empty() || view.all_out() {
        RouteError::Unavailable
    } else {
        RouteError::Overloaded
    }
}

/// Where the least-loaded and cost policies start their scan (ties go to
/// the first from a rotating start).
#[inline]
fn start(routed: &RoutedModel, view: &ModelView) -> usize {
    routed.turn() % view.len().max(1)
}

/// Routes one model; obtained from [`WorkerRouter::model`]. Shares its router's
/// rotation. If the monitor forgets the model (its last worker left), the
/// handle routes through its router's lookup from then on: the model's new
/// state when it came back, [`RouteError::UnknownModel`] while it is gone.
#[derive(Clone)]
pub struct ModelRouter {
    router: WorkerRouter,
    routed: Arc<RoutedModel>,
}

impl fmt::Debug for ModelRouter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelRouter").field("model", &self.routed.state.name).finish()
    }
}

impl ModelRouter {
    /// As [`WorkerRouter::route`] for this handle's model.
    ///
    /// # Errors
    ///
    /// [`RouteError::Overloaded`] or [`RouteError::Unavailable`];
    /// [`RouteError::UnknownModel`] once the monitor forgot the model.
    #[inline]
    pub fn route(&self, exclude: &[WorkerId]) -> Result<WorkerId, RouteError> {
        self.router.route_routed(&self.routed, exclude)
    }

    /// As [`WorkerRouter::wait`] for this handle's model.
    pub fn wait<T>(&self, exclude: &[WorkerId], ticket: Ticket, timer: T) -> Wait<'_, T> {
        Wait::new(&self.router, self.routed.clone(), exclude, ticket, timer)
    }

    /// A handle for one thread (or one task) that keeps the model's last
    /// published view and only reloads it when a new one is published.
    pub fn local(&self) -> LocalRouter {
        LocalRouter {
            router: self.router.clone(),
            routed: self.routed.clone(),
            view: SwapCache::new(ViewSource(self.routed.state.clone())),
        }
    }
}

/// Routes one model from one thread; obtained from [`ModelRouter::local`].
///
/// Same choices as [`ModelRouter::route`], and as fresh: each call checks the
/// published view with one plain pointer load and reloads it only when it
/// changed, so a call costs no more than the round-robin cursor's increment
/// and an index into a chunk's free positions. It takes `&mut self`: give
/// each thread its own clone.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use loadgate::{Policy, RouteError, WorkerRouter, WorkerMonitor};
///
/// let monitor = Arc::new(WorkerMonitor::new(Default::default()).unwrap());
/// monitor.register(1, "m", 1, 0).unwrap();
/// let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin);
/// let mut local = router.model("m").unwrap().local();
/// assert_eq!(local.route(&[]), Ok(1));
/// monitor.register(2, "m", 1, 0).unwrap(); // seen by the next call
/// assert_eq!(local.route(&[1]), Ok(2));
/// assert_eq!(local.route(&[1, 2]), Err(RouteError::Overloaded));
/// ```
#[derive(Clone)]
pub struct LocalRouter {
    router: WorkerRouter,
    routed: Arc<RoutedModel>,
    view: SwapCache<ViewSource, ModelView>,
}

impl fmt::Debug for LocalRouter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalRouter").field("model", &self.routed.state.name).finish()
    }
}

impl LocalRouter {
    /// As [`ModelRouter::route`].
    ///
    /// # Errors
    ///
    /// [`RouteError::Overloaded`] or [`RouteError::Unavailable`];
    /// [`RouteError::UnknownModel`] once the monitor forgot the model.
    #[inline(always)]
    pub fn route(&mut self, exclude: &[WorkerId]) -> Result<WorkerId, RouteError> {
        let view = self.view.load();
        match self.router.select(&self.routed, view, exclude, self.router.policy_cost()) {
            Err(RouteError::Unavailable) => self.route_again(exclude),
            chosen => chosen,
        }
    }

    /// After the view had no instance: if the monitor forgot the model, moves
    /// this handle to the model's current state and routes there (cold path).
    #[cold]
    fn route_again(&mut self, exclude: &[WorkerId]) -> Result<WorkerId, RouteError> {
        if !self.routed.state.is_retired() {
            return Err(RouteError::Unavailable);
        }
        let name = self.routed.state.name.clone();
        *self = self.router.model(&name)?.local();
        let view = self.view.load();
        self.router.select(&self.routed, view, exclude, self.router.policy_cost())
    }
}

/// Where a [`LocalRouter`]'s cache reloads from: the model's published view.
#[derive(Clone)]
struct ViewSource(Arc<ModelState>);

impl std::ops::Deref for ViewSource {
    type Target = Swap<ModelView>;

    #[inline]
    fn deref(&self) -> &Swap<ModelView> {
        self.0.view()
    }
}

/// How many instances of `view` are eligible once `exclude` is left out
/// (the waiting line's count of free instances).
pub(crate) fn eligible_count(view: &ModelView, exclude: &[WorkerId]) -> usize {
    Eligible::new(view, exclude).count()
}

/// How many of `among` (ids, ascending) are eligible in `view` (the
/// waiting line's count of free instances in a large fleet).
pub(crate) fn eligible_among(view: &ModelView, among: &[WorkerId]) -> usize {
    Eligible::among(view, among, &[]).count()
}

/// The eligible positions of a view: free (when filtering) and not excluded.
struct Eligible<'a> {
    view: &'a ModelView,
    exclude: Excluded<'a>,
    /// Excluded instances that would otherwise be eligible.
    excluded: usize,
    /// Only these positions (ascending), when routing among given workers;
    /// `exclude` is then left out already.
    among: Option<Positions>,
}

/// Positions of a view, ascending, in a vector kept per thread (so that,
/// once warm, a route among given workers allocates nothing).
struct Positions(Vec<usize>);

std::thread_local! {
    /// The vector of [`Positions`], emptied and kept for this thread's next
    /// route among given workers.
    static POSITIONS: std::cell::Cell<Vec<usize>> = const { std::cell::Cell::new(Vec::new()) };
}

impl Drop for Positions {
    fn drop(&mut self) {
        let mut positions = std::mem::take(&mut self.0);
        positions.clear();
        // Gone (a route in a thread-local's destructor): the vector goes too.
        let _ = POSITIONS.try_with(|kept| kept.set(positions));
    }
}

/// The workers a route leaves out: a short list as given (a request's own
/// exclusions, a few), a long one as a set. The waiting line leaves out the
/// workers it dispatched to since their last report, which in a large
/// fleet under overload can be thousands: looked up in the list, every
/// dispatch cost the square of that count.
enum Excluded<'a> {
    Few(&'a [WorkerId]),
    Many(rustc_hash::FxHashSet<WorkerId>),
}

/// The longest exclusion list searched as a list.
const FEW_EXCLUDED: usize = 16;

std::thread_local! {
    /// The set of a route's many exclusions, emptied and kept for this
    /// thread's next such route: once warm, routes allocate nothing
    /// (`tests/alloc.rs`). A route made while another holds it (a cost
    /// function that routes), or in a thread-local's destructor after it,
    /// builds its own.
    static EXCLUDED_SET: std::cell::Cell<rustc_hash::FxHashSet<WorkerId>> = std::cell::Cell::default();
}

impl Excluded<'_> {
    #[inline]
    fn contains(&self, id: WorkerId) -> bool {
        match self {
            Excluded::Few(list) => list.contains(&id),
            Excluded::Many(set) => set.contains(&id),
        }
    }
}

impl Drop for Excluded<'_> {
    fn drop(&mut self) {
        if let Excluded::Many(set) = self {
            let mut set = std::mem::take(set);
            set.clear();
            // Gone (a route in a thread-local's destructor): the set goes too.
            let _ = EXCLUDED_SET.try_with(|kept| kept.set(set));
        }
    }
}

impl<'a> Eligible<'a> {
    /// The instances of `among` (ids, ascending) eligible in `view`, less
    /// `exclude`.
    fn among(view: &'a ModelView, among: &[WorkerId], exclude: &[WorkerId]) -> Self {
        let mut positions = POSITIONS.try_with(std::cell::Cell::take).unwrap_or_default();
        for &id in among.iter().filter(|id| !exclude.contains(id)) {
            if let Some(place) = view.find_eligible(id) {
                positions.push(view.position(place));
            }
        }
        Eligible { view, exclude: Excluded::Few(&[]), excluded: 0, among: Some(Positions(positions)) }
    }

    #[inline]
    fn new(view: &'a ModelView, exclude: &'a [WorkerId]) -> Self {
        let is_eligible = |id: WorkerId| view.find_eligible(id).is_some();
        if exclude.len() > FEW_EXCLUDED {
            // A route in a thread-local's destructor, once the kept set is
            // gone, builds its own.
            let mut set = EXCLUDED_SET.try_with(std::cell::Cell::take).unwrap_or_default();
            set.reserve(exclude.len());
            let excluded = exclude.iter().filter(|id| set.insert(**id) && is_eligible(**id)).count();
            return Eligible { view, exclude: Excluded::Many(set), excluded, among: None };
        }
        let mut excluded = 0;
        for (i, id) in exclude.iter().enumerate() {
            if exclude[..i].contains(id) {
                continue; // listed twice
            }
            if is_eligible(*id) {
                excluded += 1;
            }
        }
        Eligible { view, exclude: Excluded::Few(exclude), excluded, among: None }
    }

    #[inline]
    fn count(&self) -> usize {
        if let Some(among) = &self.among {
            return among.0.len();
        }
        self.view.eligible - self.excluded
    }

    /// The k-th eligible position; `k < count()`.
    #[inline]
    fn nth(&self, k: usize) -> usize {
        if let Some(among) = &self.among {
            return among.0[k];
        }
        if self.excluded == 0 {
            return self.view.nth_eligible(k);
        }
        let mut seen = 0;
        let mut found = None;
        self.for_each_from(0, |p, _| {
            if found.is_none() {
                if seen == k {
                    found = Some(p);
                }
                seen += 1;
            }
        });
        found.expect("k < count")
    }

    /// Calls `f` with every eligible position and its entry, starting at
    /// `start` and wrapping.
    #[inline]
    fn for_each_from(&self, start: usize, mut f: impl FnMut(usize, &WorkerEntry)) {
        if let Some(among) = &self.among {
            let (before, from) = among.0.split_at(among.0.partition_point(|p| *p < start));
            from.iter().chain(before).for_each(|&p| f(p, self.view.entry(p)));
            return;
        }
        self.view.for_each_from(start, |p, place, chunk| {
            let free = chunk.is_eligible(place.local);
            if free && !(self.excluded != 0 && self.exclude.contains(chunk.id(place.local))) {
                f(p, chunk.entry(place.local));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A route among given workers (the waiting line's, in a large fleet)
    /// hands its vector of positions back to its thread, emptied, for the
    /// next such route: once warm, those routes allocate nothing.
    #[test]
    fn a_route_among_given_workers_keeps_its_positions_for_the_next() {
        let monitor = Arc::new(WorkerMonitor::new(Default::default()).unwrap());
        for w in 1..=3 {
            monitor.register(w, "m", 1, 0).unwrap();
        }
        let router = WorkerRouter::new(monitor, Policy::RoundRobin);
        let routed = router.routed("m").unwrap();
        let view = routed.state.view().load();
        assert_eq!(router.route_among_routed(&routed, &view, &[1, 3], &[1]), Ok(3));
        let kept = POSITIONS.with(|kept| {
            let positions = kept.take();
            let kept_back = (positions.is_empty(), positions.capacity());
            kept.set(positions);
            kept_back
        });
        assert!(kept.0 && kept.1 >= 1, "the vector comes back empty, with its capacity: {kept:?}");
    }
}
