//! cluster_metrics AdaptiveScore with `global_inflight_enabled`: the candidates and their
//! local scores in one script call that weighs each by its count over every gateway and counts
//! the lowest (docs/higress-cluster-policies.md §3.6); its reply is read in [`super::reply`].

use super::holding::{GlobalLease, ServiceLease};
use super::stats::SharedStats;
use crate::config::RouteConfig;
use crate::redis::inflight::{self, InflightKeys};
use std::rc::Rc;

/// cluster_metrics AdaptiveScore with `global_inflight_enabled`: Redis chooses among the
/// candidates by local score × (global count + 1) and counts the choice
/// (docs/higress-cluster-policies.md §3.6).
#[derive(Debug, Clone)]
pub struct ServicePick {
    pub config: Rc<RouteConfig>,
    pub keys: Rc<InflightKeys>,
    pub request_id: String,
    pub key_ttl_s: u64,
    /// The candidates (distinct) and their local scores.
    pub candidates: Rc<Vec<(String, f64)>>,
    /// What the local path chooses when Redis cannot answer (Higress falls back the same way).
    pub local: String,
    pub stats: Rc<SharedStats>,
    pub start_ms: u64,
    pub by_sha: bool,
}

impl ServicePick {
    pub fn offered(&self, service: &str) -> bool {
        self.candidates.iter().any(|(s, _)| s == service)
    }

    /// After a lost reply: every lease the script could have written.
    pub fn every_member(&self) -> Vec<String> {
        self.candidates
            .iter()
            .map(|(s, _)| inflight::member(&self.request_id, s))
            .collect()
    }
}

impl ServicePick {
    /// The lease a request holds once Redis counted `service` for it.
    pub fn lease(&self, service: &str) -> ServiceLease {
        ServiceLease {
            global: Some(self.global(service)),
            ..self.local_lease(service)
        }
    }

    /// The lease of a request routed by the local path (nothing counted in Redis).
    pub fn local_lease(&self, service: &str) -> ServiceLease {
        ServiceLease {
            stats: self.stats.clone(),
            service: self.stats.fresh.index_of(service).unwrap_or(usize::MAX),
            start_ms: self.start_ms,
            global: None,
            first_byte: false,
        }
    }

    pub fn global(&self, service: &str) -> GlobalLease {
        GlobalLease {
            config: self.config.clone(),
            keys: self.keys.clone(),
            member: inflight::member(&self.request_id, service),
        }
    }
}
