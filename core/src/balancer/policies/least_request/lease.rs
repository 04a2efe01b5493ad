//! The count a plain-Envoy endpoint pick holds (a leaf: counts.rs takes and releases it,
//! prefill.rs gives its booking back, holding.rs hands it to the machine).

use crate::balancer::pick::Booking;
use crate::config::Ejection;
use std::rc::Rc;

/// A per-proxy load count in shared data (plain-Envoy global_least_request): `cost` (the
/// request's `costMode` weight) added to `endpoint` under `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalLease {
    pub key: Rc<str>,
    pub endpoint: String,
    pub cost: u64,
    /// Tenant fairness: the tenant id whose in-flight count this request holds too.
    pub tenant: Option<String>,
    /// Failure memory (None: off), which its release teaches (health.rs).
    pub memory: Option<LeaseMemory>,
    /// Envoy answered from another endpoint (its retry to a fallback): this one was not
    /// reached (health.rs `Lesson::Unreached`).
    pub failed: bool,
    /// prefix_cache: the prefill tokens booked with the count, until the first bytes (taken
    /// then) or the release (least_request/prefill.rs).
    pub booking: Option<Booking>,
}

/// What the release of a count needs to teach failure memory (health.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseMemory {
    pub rules: Ejection,
    /// How many endpoints the route has (`maxEjectedPercent`'s base).
    pub pool: usize,
    /// Taken as one of its endpoint's trial requests (half-open).
    pub trial: bool,
}
