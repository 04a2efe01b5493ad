//! The count a plain-Envoy endpoint pick holds (a leaf: counts.rs takes and releases it,
//! prefill.rs gives its booking back, holding.rs hands it to the machine).

use crate::balancer::pick::Booking;
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
    /// Whether a response from another endpoint is noted against this one (least request, and
    /// a session's prefix_cache pick: docs/plain-envoy.md, docs/sessions-and-queues.md
    /// "Sessions").
    pub watch: bool,
    /// Envoy answered from another endpoint (its retry to a fallback): this one failed, and the
    /// release marks it down for sessions (least_request/counts.rs `DOWN_MS`).
    pub failed: bool,
    /// prefix_cache: the prefill tokens booked with the count, until the first bytes (taken
    /// then) or the release (least_request/prefill.rs).
    pub booking: Option<Booking>,
}
