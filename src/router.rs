//! [`Router`]: picks an eligible instance of a model — not busy (when the
//! model has a threshold), not excluded by this request — by policy.

use std::fmt;

use crate::load::WorkerId;
use crate::monitor::{ModelState, ModelView, WorkerLoad, WorkerMonitor};
use crate::sync::{Arc, Ordering};

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
pub enum RouteError {
    /// Instances are registered but none is eligible (all busy or excluded).
    /// Pool-wide: retrying elsewhere cannot help. HTTP: the overload status.
    Overloaded,
    /// The model is known but no instance is registered. HTTP 503.
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
/// lookup (skip both with [`Router::model`]), one view load, a word scan.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use loadgate::{Policy, RouteError, Router, WorkerMonitor};
///
/// let monitor = Arc::new(WorkerMonitor::new(Default::default()).unwrap());
/// monitor.register(1, "m", 1).unwrap();
/// monitor.register(2, "m", 1).unwrap();
/// let router = Router::new(monitor, Policy::RoundRobin);
/// assert_eq!(router.route("m", &[]), Ok(1));
/// assert_eq!(router.route("m", &[]), Ok(2));
/// assert_eq!(router.route("m", &[1, 2]), Err(RouteError::Overloaded));
/// assert_eq!(router.route("other", &[]), Err(RouteError::UnknownModel));
/// ```
#[derive(Clone, Debug)]
pub struct Router {
    monitor: Arc<WorkerMonitor>,
    policy: Policy,
}

impl Router {
    /// A router over `monitor`'s workers using `policy`.
    pub fn new(monitor: Arc<WorkerMonitor>, policy: Policy) -> Self {
        Router { monitor, policy }
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
        self.monitor.with_model(model, |state| match state {
            Some(state) => self.select(state, exclude, self.policy_cost()),
            None => Err(RouteError::UnknownModel),
        })
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
        self.monitor.with_model(model, |state| match state {
            Some(state) => self.select(state, exclude, Some(cost)),
            None => Err(RouteError::UnknownModel),
        })
    }

    /// A handle that routes `model` without the per-call model lookup.
    ///
    /// # Errors
    ///
    /// [`RouteError::UnknownModel`] if the model has never been seen.
    pub fn model(&self, model: &str) -> Result<ModelRouter, RouteError> {
        let state = self.monitor.model_state(model).ok_or(RouteError::UnknownModel)?;
        Ok(ModelRouter { router: self.clone(), state })
    }

    fn policy_cost(&self) -> Option<CostRef<'_>> {
        match &self.policy {
            Policy::Cost(f) => Some(&**f),
            _ => None,
        }
    }

    #[inline]
    fn select(
        &self,
        state: &ModelState,
        exclude: &[WorkerId],
        cost: Option<CostRef<'_>>,
    ) -> Result<WorkerId, RouteError> {
        let view = state.view.load();
        let view: &ModelView = &view;
        let eligible = Eligible::new(view, exclude);
        let count = eligible.count();
        if count == 0 {
            return Err(if view.instances.is_empty() { RouteError::Unavailable } else { RouteError::Overloaded });
        }
        let position = match (cost, &self.policy) {
            (Some(cost), _) => self.lowest(state, &eligible, |p| cost(view.instances[p].id, &self.load(view, p))),
            (None, Policy::RoundRobin) => {
                // Relaxed: the cursor only spreads load; no data hangs on it.
                let k = state.cursor.fetch_add(1, Ordering::Relaxed) % count;
                eligible.nth(k)
            }
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
                eligible.for_each_from(self.start(state, view), |p| {
                    let load = self.load(view, p);
                    if best.as_ref().is_none_or(|(_, b)| load.cmp_load(b).is_lt()) {
                        best = Some((p, load));
                    }
                });
                best.map(|(p, _)| p).unwrap_or_else(|| eligible.nth(0))
            }
            (None, Policy::Cost(_)) => unreachable!("policy_cost returns the cost function"),
        };
        Ok(view.instances[position].id)
    }

    #[inline]
    fn load(&self, view: &ModelView, position: usize) -> WorkerLoad {
        self.monitor.load_of(&view.instances[position])
    }

    #[inline]
    fn start(&self, state: &ModelState, view: &ModelView) -> usize {
        // Relaxed: the cursor only spreads ties; no data hangs on it.
        state.cursor.fetch_add(1, Ordering::Relaxed) % view.instances.len().max(1)
    }

    fn lowest(&self, state: &ModelState, eligible: &Eligible<'_>, mut cost: impl FnMut(usize) -> u64) -> usize {
        let mut best = None::<(usize, u64)>;
        eligible.for_each_from(self.start(state, eligible.view), |p| {
            let c = cost(p);
            if best.is_none_or(|(_, b)| c < b) {
                best = Some((p, c));
            }
        });
        best.map(|(p, _)| p).unwrap_or_else(|| eligible.nth(0))
    }
}

/// Routes one model; obtained from [`Router::model`].
#[derive(Clone)]
pub struct ModelRouter {
    router: Router,
    state: Arc<ModelState>,
}

impl fmt::Debug for ModelRouter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelRouter").field("model", &self.state.name).finish()
    }
}

impl ModelRouter {
    /// As [`Router::route`] for this handle's model.
    ///
    /// # Errors
    ///
    /// [`RouteError::Overloaded`] or [`RouteError::Unavailable`].
    #[inline]
    pub fn route(&self, exclude: &[WorkerId]) -> Result<WorkerId, RouteError> {
        self.router.select(&self.state, exclude, self.router.policy_cost())
    }
}

/// The eligible positions of a view: free (when filtering) and not excluded.
struct Eligible<'a> {
    view: &'a ModelView,
    exclude: &'a [WorkerId],
    /// Excluded instances that would otherwise be eligible.
    excluded: usize,
}

impl<'a> Eligible<'a> {
    #[inline]
    fn new(view: &'a ModelView, exclude: &'a [WorkerId]) -> Self {
        let mut excluded = 0;
        for (i, id) in exclude.iter().enumerate() {
            if exclude[..i].contains(id) {
                continue; // listed twice
            }
            if let Ok(p) = view.instances.binary_search_by_key(id, |e| e.id) {
                if !view.filtering || !view.busy.is_busy(p) {
                    excluded += 1;
                }
            }
        }
        Eligible { view, exclude, excluded }
    }

    #[inline]
    fn count(&self) -> usize {
        let free = if self.view.filtering { self.view.busy.free_count() } else { self.view.instances.len() };
        free - self.excluded
    }

    #[inline]
    fn is_excluded(&self, position: usize) -> bool {
        self.excluded != 0 && self.exclude.contains(&self.view.instances[position].id)
    }

    /// The k-th eligible position; `k < count()`.
    #[inline]
    fn nth(&self, k: usize) -> usize {
        if self.excluded == 0 {
            let found = if self.view.filtering { self.view.busy.nth_free(k) } else { Some(k) };
            return found.expect("k < count");
        }
        let mut seen = 0;
        let mut found = None;
        self.for_each_from(0, |p| {
            if found.is_none() {
                if seen == k {
                    found = Some(p);
                }
                seen += 1;
            }
        });
        found.expect("k < count")
    }

    /// Calls `f` with every eligible position, starting at `start` and wrapping.
    #[inline]
    fn for_each_from(&self, start: usize, mut f: impl FnMut(usize)) {
        let len = self.view.instances.len();
        for i in 0..len {
            let p = (start + i) % len;
            let free = !self.view.filtering || !self.view.busy.is_busy(p);
            if free && !self.is_excluded(p) {
                f(p);
            }
        }
    }
}
