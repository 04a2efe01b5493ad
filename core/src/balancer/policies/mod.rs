//! One module per policy. A policy answers one question — where does this request go — as a
//! [`Decision`]; the request's state machine (`super::request`) does the rest. Adding a policy
//! means a `PolicyConfig` variant (config), one module here, and one arm in
//! [`Policies::decide`].

pub mod endpoint_metrics;
mod input;
pub mod least_request;
pub mod local_least_request;
pub mod prefix_cache;

use super::request::Decision;
use super::telemetry::Telemetry;
use crate::config::{PluginConfig, PolicyConfig};
use crate::host::Host;
pub use input::{Env, Input};

/// The per-VM state of the policies that keep any.
pub struct Policies {
    metrics: endpoint_metrics::EndpointMetrics,
}

impl Policies {
    pub fn new(config: &PluginConfig, seed: u64) -> Policies {
        Policies {
            metrics: endpoint_metrics::EndpointMetrics::new(config, seed),
        }
    }

    pub fn decide(&mut self, host: &mut dyn Host, env: Env, input: &Input) -> Decision {
        match &input.config.policy {
            PolicyConfig::GlobalLeastRequest if input.config.redis.is_some() => {
                least_request::decide(host, env, input)
            }
            // Plain Envoy: per-proxy counts in shared data.
            PolicyConfig::GlobalLeastRequest => local_least_request::decide(host, env, input),
            PolicyConfig::PrefixCache(settings) => prefix_cache::decide(host, env, input, settings),
            PolicyConfig::EndpointMetrics(mc) => self.metrics.decide(host, env, input, mc),
            // `PluginConfig::select` does not hand out cluster-level configs yet: Envoy's own
            // routing applies to them, as if the plugin were off for those routes.
            PolicyConfig::ClusterMetrics(_) | PolicyConfig::ClusterHash(_) => {
                Decision::Fallback(crate::reason::Cause::NoRoute)
            }
        }
    }

    /// Root context, at configure: start whatever runs on ticks (the metrics scraper).
    pub fn start(&mut self, host: &mut dyn Host, tel: &mut Telemetry) {
        self.metrics.start(host, tel);
    }

    pub fn on_tick(&mut self, host: &mut dyn Host, tel: &mut Telemetry) {
        self.metrics.on_tick(host, tel);
    }

    /// A callout answered (only the scraper makes them).
    pub fn on_http_response(
        &mut self,
        host: &mut dyn Host,
        tel: &mut Telemetry,
        token: u32,
        body_size: usize,
    ) {
        self.metrics.on_http_response(host, tel, token, body_size);
    }
}
