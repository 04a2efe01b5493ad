//! The policies, one folder each. At configure every route config becomes one [`Policy`]
//! object ([`build`]), which the dispatcher keeps beside the config and asks for a
//! [`Decision`]; a Redis reply to a policy's pick comes back to the pick itself (each folder's
//! `pick.rs`, `events::Pick`). Adding a policy means its `PolicyConfig` variant (config), its
//! folder here, and one line in [`build`].

pub mod cluster_hash;
pub mod cluster_metrics;
pub mod continuation;
pub mod endpoint_metrics;
pub mod least_request;
mod policy;
pub mod prefix_cache;
pub mod session;

use crate::config::{PluginConfig, PolicyConfig, RouteConfig};
pub use policy::{Env, Input, Policy};
use std::rc::Rc;

/// The policy object of route config `config`; `position` is the config's place among the
/// plugin's route configs (global first), which names the state it keeps in shared data.
pub fn build(position: usize, config: &Rc<RouteConfig>) -> Box<dyn Policy> {
    match &config.policy {
        PolicyConfig::GlobalLeastRequest => least_request::build(position, config),
        PolicyConfig::PrefixCache(settings) => prefix_cache::build(position, config, settings),
        PolicyConfig::EndpointMetrics(mc) => {
            Box::new(endpoint_metrics::EndpointMetrics::new(position, config, mc))
        }
        PolicyConfig::ClusterMetrics(cm) => {
            Box::new(cluster_metrics::ClusterMetrics::new(position, cm))
        }
        PolicyConfig::ClusterHash(hc) => Box::new(cluster_hash::ClusterHash::new(hc)),
    }
}

/// The root tick the policies' own timed work needs (0: none): a prefix_cache route with
/// `latencyModel` and no Redis merges its models across the proxy's workers every
/// `mergeIntervalMs` (prefix_cache/latency/local.rs), checked twice per interval. The Redis
/// build's merges ride the first-bytes tick (redis_client/first_bytes.rs).
pub fn tick_ms(config: &PluginConfig) -> u32 {
    config
        .all()
        .filter(|c| c.redis.is_none())
        .filter_map(|c| c.prefix()?.latency)
        .map(|l| (l.merge_interval_ms / 2).clamp(50, 10_000) as u32)
        .min()
        .unwrap_or(0)
}
