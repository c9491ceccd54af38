//! Sheddable headroom: a [`Class::Sheddable`] request sees a worker as busy
//! at each threshold × (1 − F), so sheddable requests are the first refused
//! while the others still get in
//! ([`WorkerRouter::with_sheddable_headroom`]).
//!
//! Routing is unchanged for every other request. A sheddable one takes a
//! worker the router's policy picks among the eligible ones, if that worker
//! is free at the lowered thresholds (its ranks' loads, read without a
//! lock); otherwise the router picks again without it, up to [`TRIES`]
//! workers, then refuses it as overloaded. Bounded: a sheddable request
//! costs at most [`TRIES`] routes whatever the fleet's size, so in a large
//! fleet where few workers have headroom it may be refused although one
//! had some — it is the request to shed first.

use std::fmt;

use crate::class::Class;
use crate::load::WorkerId;
use crate::monitor::view::ModelView;
use crate::monitor::{ModelState, WorkerMonitor};
use crate::route::{RouteError, RoutedModel, WorkerRouter};
use crate::thresholds::{Thresholds, PPB};

/// The most workers a sheddable request tries before it is refused.
pub const TRIES: usize = 8;

/// The headroom kept from sheddable requests: each threshold counts at
/// `keep` parts per billion of its value for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Headroom {
    keep_ppb: u64,
}

/// A headroom outside `[0, 1)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeadroomError(pub f64);

impl fmt::Display for HeadroomError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the sheddable headroom must be a number in [0, 1), not {}", self.0)
    }
}

impl std::error::Error for HeadroomError {}

impl Headroom {
    /// `fraction` of each threshold kept from sheddable requests; `None`
    /// for 0 (no headroom).
    pub(crate) fn new(fraction: f64) -> Result<Option<Headroom>, HeadroomError> {
        if !(fraction.is_finite() && (0.0..1.0).contains(&fraction)) {
            return Err(HeadroomError(fraction));
        }
        let keep_ppb = PPB - crate::thresholds::to_ppb(fraction);
        Ok((keep_ppb < PPB).then_some(Headroom { keep_ppb }))
    }

    /// The fraction kept from sheddable requests.
    pub(crate) fn fraction(self) -> f64 {
        (PPB - self.keep_ppb) as f64 / PPB as f64
    }
}

impl Thresholds {
    /// These thresholds at `keep_ppb` parts per billion of their values,
    /// rounded down (a request counted against them sees a worker busy
    /// sooner).
    pub(crate) fn scaled(&self, keep_ppb: u64) -> Thresholds {
        let scale = |v: u64| u64::try_from(u128::from(v) * u128::from(keep_ppb) / u128::from(PPB)).unwrap_or(v);
        Thresholds::from_parts(
            self.decode_ppb().map(scale),
            self.prefill_tokens().map(scale),
            self.prefill_frac_ppb().map(scale),
            self.waiting_requests().map(scale),
        )
    }
}

impl WorkerMonitor {
    /// Whether `worker` of `state` is free at `thresholds` now (not found:
    /// no).
    pub(crate) fn free_at(&self, state: &ModelState, worker: WorkerId, thresholds: &Thresholds) -> bool {
        let view = state.view().load();
        let Some(place) = view.find(worker) else { return false };
        !self.is_busy_at(view.chunk(place).entry(place.local), thresholds)
    }
}

impl WorkerRouter {
    /// Routes a request of `class` of the model of `routed`: a sheddable
    /// one, with headroom set, only to a worker free at the lowered
    /// thresholds (see the module docs).
    pub(crate) fn route_class_routed(
        &self,
        routed: &RoutedModel,
        exclude: &[WorkerId],
        class: Class,
    ) -> Result<WorkerId, RouteError> {
        let route = |exclude: &[WorkerId]| self.route_routed(routed, exclude);
        match (class, self.headroom()) {
            (Class::Sheddable, Some(headroom)) => self.with_headroom(routed, exclude, headroom, route),
            _ => route(exclude),
        }
    }

    /// As [`route_class_routed`](Self::route_class_routed) with the model's
    /// view `view` read (the waiting line's, under its lock).
    pub(crate) fn route_class_in(
        &self,
        routed: &RoutedModel,
        view: &ModelView,
        exclude: &[WorkerId],
        class: Class,
    ) -> Result<WorkerId, RouteError> {
        let route = |exclude: &[WorkerId]| self.route_routed_in(routed, view, exclude);
        match (class, self.headroom()) {
            (Class::Sheddable, Some(headroom)) => self.with_headroom(routed, exclude, headroom, route),
            _ => route(exclude),
        }
    }

    /// As [`route_class_routed`](Self::route_class_routed), choosing only
    /// among `among` (see
    /// [`route_among_routed`](WorkerRouter::route_among_routed)).
    pub(crate) fn route_class_among(
        &self,
        routed: &RoutedModel,
        view: &ModelView,
        among: &[WorkerId],
        exclude: &[WorkerId],
        class: Class,
    ) -> Result<WorkerId, RouteError> {
        let route = |exclude: &[WorkerId]| self.route_among_routed(routed, view, among, exclude);
        match (class, self.headroom()) {
            (Class::Sheddable, Some(headroom)) => self.with_headroom(routed, exclude, headroom, route),
            _ => route(exclude),
        }
    }

    /// A worker `route` picks (given what to leave out) that is free at the
    /// lowered thresholds: up to [`TRIES`] picks.
    fn with_headroom(
        &self,
        routed: &RoutedModel,
        exclude: &[WorkerId],
        headroom: Headroom,
        route: impl Fn(&[WorkerId]) -> Result<WorkerId, RouteError>,
    ) -> Result<WorkerId, RouteError> {
        let thresholds = routed.state.thresholds.load().scaled(headroom.keep_ppb);
        if !thresholds.is_enabled() {
            return route(exclude);
        }
        let mut tried = exclude.to_vec();
        for _ in 0..TRIES {
            let worker = route(&tried)?;
            if self.monitor().free_at(&routed.state, worker, &thresholds) {
                return Ok(worker);
            }
            tried.push(worker);
        }
        Err(RouteError::Overloaded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{LoadReport, RankLoad};
    use crate::monitor::MonitorConfig;
    use crate::route::Policy;
    use crate::sync::Arc;
    use crate::thresholds::BusyThresholds;

    #[test]
    fn sheddable_requests_keep_off_the_headroom_and_the_others_do_not() {
        let thresholds = BusyThresholds { active_decode_blocks_threshold: Some(0.8), ..Default::default() };
        let config = MonitorConfig { default_thresholds: thresholds, ..Default::default() };
        let monitor = Arc::new(WorkerMonitor::new(config).unwrap());
        let mut seq = 0;
        let mut report = |worker, blocks| {
            seq += 1;
            let load = RankLoad { active_decode_blocks: blocks, kv_total_blocks: 100, ..Default::default() };
            monitor.apply(&LoadReport { worker, seq, load, ..Default::default() }).unwrap();
        };
        for w in [1, 2] {
            monitor.register(w, "m", 1, 0).unwrap();
        }
        report(1, 60); // free at 0.8, busy at 0.8 x (1 - 0.5)
        report(2, 20); // free at both
        let router = WorkerRouter::new(monitor.clone(), Policy::RoundRobin).with_sheddable_headroom(0.5).unwrap();
        assert_eq!(router.sheddable_headroom(), 0.5);
        for _ in 0..4 {
            assert_eq!(router.route_class("m", &[], Class::Sheddable), Ok(2));
        }
        let standard: Vec<WorkerId> = (0..4).map(|_| router.route_class("m", &[], Class::Standard).unwrap()).collect();
        assert!(standard.contains(&1) && standard.contains(&2), "{standard:?}");
        assert_eq!(router.route_class("m", &[2], Class::Sheddable), Err(RouteError::Overloaded));
        report(2, 41);
        assert_eq!(router.route_class("m", &[], Class::Sheddable), Err(RouteError::Overloaded), "both past 0.4");
        assert!(router.route_class("m", &[], Class::Critical).is_ok());
        // Without headroom a sheddable request is routed as any other.
        let plain = WorkerRouter::new(monitor, Policy::RoundRobin);
        assert!(plain.route_class("m", &[], Class::Sheddable).is_ok());
    }

    #[test]
    fn a_headroom_is_a_fraction_below_one() {
        assert_eq!(Headroom::new(0.0), Ok(None));
        assert_eq!(Headroom::new(0.25).unwrap().map(|h| h.keep_ppb), Some(750_000_000));
        for bad in [1.0, -0.1, f64::NAN, f64::INFINITY] {
            assert!(Headroom::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn thresholds_scale_down_and_round_down() {
        let t = BusyThresholds {
            active_decode_blocks_threshold: Some(0.8),
            active_prefill_tokens_threshold: Some(1001),
            active_prefill_tokens_threshold_frac: Some(2.0),
            active_waiting_requests_threshold: Some(3),
        }
        .validate()
        .unwrap();
        let s = t.scaled(750_000_000);
        assert_eq!(s.decode_ppb(), Some(600_000_000));
        assert_eq!(s.prefill_tokens(), Some(750));
        assert_eq!(s.prefill_frac_ppb(), Some(1_500_000_000));
        assert_eq!(s.waiting_requests(), Some(2));
        assert_eq!(Thresholds::NONE.scaled(1), Thresholds::NONE);
    }
}
