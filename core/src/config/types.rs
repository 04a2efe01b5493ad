//! The compiled, validated configuration of one route (global config or `_rules_` entry).

use super::cluster_hash::ClusterHashConfig;
use super::cluster_metrics::{ClusterMetricsConfig, ClusterMode};
use super::common::Common;
use super::inflight::GlobalInflight;
use super::metrics::MetricsConfig;
use super::prefix::PrefixSettings;
use super::values::Build;
pub use super::values::{CostMode, FailureMode, Publish, RedisTarget, Secret};
use std::rc::Rc;

/// The balancing policy of a route (metric labels, summaries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    GlobalLeastRequest,
    PrefixCache,
    EndpointMetrics,
    /// `lb_type: cluster`: picks an Envoy cluster, not an endpoint.
    ClusterMetrics,
    ClusterHash,
}

impl Policy {
    pub const ALL: [Policy; 5] = [
        Policy::GlobalLeastRequest,
        Policy::PrefixCache,
        Policy::EndpointMetrics,
        Policy::ClusterMetrics,
        Policy::ClusterHash,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::GlobalLeastRequest => "global_least_request",
            Policy::PrefixCache => "prefix_cache",
            Policy::EndpointMetrics => "endpoint_metrics",
            Policy::ClusterMetrics => "cluster_metrics",
            Policy::ClusterHash => "cluster_hash",
        }
    }

    /// Short label used in metric names.
    pub fn metric_label(self) -> &'static str {
        match self {
            Policy::GlobalLeastRequest => "glr",
            Policy::PrefixCache => "prefix",
            Policy::EndpointMetrics => "metrics",
            Policy::ClusterMetrics => "cluster_metrics",
            Policy::ClusterHash => "cluster_hash",
        }
    }

    /// Whether the policy keeps its state in Redis (and so needs the Redis keys). In the
    /// plain-Envoy build, global_least_request and prefix_cache keep it per proxy in shared
    /// data instead.
    /// cluster_metrics keeps its statistics in shared data (its optional global in-flight
    /// count names its own Redis keys, not the route's).
    pub fn uses_redis(self, build: Build) -> bool {
        match self {
            Policy::GlobalLeastRequest | Policy::PrefixCache => build == Build::Higress,
            Policy::EndpointMetrics | Policy::ClusterMetrics | Policy::ClusterHash => false,
        }
    }
}

/// A route's policy with its own settings: the balancer dispatches on this enum, and each
/// variant is served by one module of `balancer::policies`.
#[derive(Debug, Clone)]
pub enum PolicyConfig {
    /// Settings are the route's common ones (Redis target, `maxRequestCount`, cost).
    GlobalLeastRequest,
    PrefixCache(PrefixSettings),
    EndpointMetrics(Rc<MetricsConfig>),
    /// `lb_type: cluster`, `lb_policy: cluster_metrics`: picks one of `service_list` and
    /// writes it into `cluster_header`.
    ClusterMetrics(ClusterMetricsConfig),
    /// `lb_type: cluster`, `lb_policy: cluster_hash`: hashes `hash_header` into 100 weighted
    /// slots and writes the cluster into `cluster_header`.
    ClusterHash(ClusterHashConfig),
}

impl PolicyConfig {
    /// The policy's kind (metric labels, summaries).
    pub fn kind(&self) -> Policy {
        match self {
            PolicyConfig::GlobalLeastRequest => Policy::GlobalLeastRequest,
            PolicyConfig::PrefixCache(_) => Policy::PrefixCache,
            PolicyConfig::EndpointMetrics(_) => Policy::EndpointMetrics,
            PolicyConfig::ClusterMetrics(_) => Policy::ClusterMetrics,
            PolicyConfig::ClusterHash(_) => Policy::ClusterHash,
        }
    }

    /// Higress's `lb_policy` name of this policy.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// Whether this is an `lb_type: cluster` policy.
    pub fn is_cluster(&self) -> bool {
        matches!(
            self,
            PolicyConfig::ClusterMetrics(_) | PolicyConfig::ClusterHash(_)
        )
    }

    /// cluster_metrics AdaptiveScore's Redis-backed in-flight count, when enabled (Higress
    /// uses it in no other mode, docs/higress-cluster-policies.md §3.6).
    pub fn global_inflight(&self) -> Option<&GlobalInflight> {
        match self {
            PolicyConfig::ClusterMetrics(c) if c.mode == ClusterMode::AdaptiveScore => {
                c.global_inflight.as_ref()
            }
            _ => None,
        }
    }

    /// The scraped-metrics settings a route uses: endpoint_metrics', or a plain-Envoy
    /// prefix_cache's load guard (the scraper serves both, balancer/metrics/scrape.rs).
    pub fn metrics(&self) -> Option<&Rc<MetricsConfig>> {
        match self {
            PolicyConfig::EndpointMetrics(m) => Some(m),
            PolicyConfig::PrefixCache(p) => p.guard.as_ref(),
            _ => None,
        }
    }
}

/// A route's validated config. Cluster policies carry their settings in `policy`; the other
/// fields then hold the defaults (their own keys do not apply to them).
#[derive(Debug, Clone)]
pub struct RouteConfig {
    pub policy: PolicyConfig,
    /// Present for the policies that use Redis (cluster_metrics: the global in-flight count).
    pub redis: Option<RedisTarget>,
    /// The settings every endpoint policy shares (Redis key prefix, lease, cost, cap, failure
    /// mode, debug header, body limit, detail log).
    pub common: Common,
    /// Plain-Envoy build: the endpoints to choose from (`ip:port`, sorted, deduplicated; with
    /// `dataParallelSize`, each pod's ranks `ip:port@rank`, ranks.rs).
    pub endpoints: Rc<Vec<String>>,
    /// Plain-Envoy build: the pods (`endpoints` without ranks), what the metrics scraper reads.
    pub pods: Rc<Vec<String>>,
    pub publish: Publish,
    /// Decide in the request-headers phase: cluster policies (they only read headers, as in
    /// Higress) and plain-Envoy routes whose policy does not use the body (least request by
    /// `requests`): no request is held there for nothing.
    pub decide_at_headers: bool,
    /// Session stickiness (global_least_request, prefix_cache; docs/redis-data-model.md §10).
    pub session: Option<Rc<super::session::SessionConfig>>,
    /// Agents' own session identities and Responses continuations, recognised without
    /// configuration (every endpoint policy unless `agentSessions: false`;
    /// docs/sessions-and-queues.md "Agent sessions").
    pub agents: Option<Rc<super::session::AgentSessions>>,
}

impl PolicyConfig {
    /// Whether an endpoint policy uses the request body to decide (`cost`: the route's).
    pub fn reads_body(&self, cost: CostMode) -> bool {
        match self {
            PolicyConfig::PrefixCache(_) | PolicyConfig::EndpointMetrics(_) => true,
            PolicyConfig::GlobalLeastRequest => cost != CostMode::Requests,
            PolicyConfig::ClusterHash(h) => matches!(h.key, super::hash_key::HashKey::Body { .. }),
            PolicyConfig::ClusterMetrics(_) => false,
        }
    }
}

impl RouteConfig {
    /// Whether the route's endpoint names its pod by Redis keys of (route, cluster): every
    /// endpoint policy with Redis but endpoint_metrics, which keeps only session bindings there
    /// and consistent-hashes sessions without them.
    pub fn needs_route_keys(&self) -> bool {
        self.redis.is_some()
            && !self.policy.is_cluster()
            && !matches!(self.policy, PolicyConfig::EndpointMetrics(_))
    }

    /// prefix_cache's settings (None for the other policies).
    pub fn prefix(&self) -> Option<&PrefixSettings> {
        match &self.policy {
            PolicyConfig::PrefixCache(p) => Some(p),
            _ => None,
        }
    }
}
