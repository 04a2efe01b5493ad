//! One module per policy. A policy answers one question — where does this request go — as a
//! [`Decision`]; the request's state machine (`super::request`) does the rest. Adding a policy
//! means a `PolicyConfig` variant (config), one module here, and one arm in
//! [`Policies::decide`].

pub mod cluster_hash;
pub mod cluster_metrics;
pub mod endpoint_metrics;
mod input;
pub mod least_request;
pub mod local_least_request;
pub mod local_prefix_cache;
pub mod prefix_cache;
pub mod session;

use super::request::Decision;
use super::telemetry::Telemetry;
use crate::cluster::hash::SlotTable;
use crate::config::{PluginConfig, PolicyConfig, RouteConfig};
use crate::host::Host;
pub use input::{Env, Input};
use std::rc::Rc;

/// The per-VM state of the policies that keep any.
pub struct Policies {
    metrics: endpoint_metrics::EndpointMetrics,
    /// cluster_hash slot tables, built once per route config.
    slots: Vec<(Rc<RouteConfig>, Option<SlotTable>)>,
    /// cluster_metrics: where each route config keeps its shared statistics.
    services: Vec<(Rc<RouteConfig>, Rc<cluster_metrics::SharedStats>)>,
    /// prefix_cache without Redis (plain Envoy): each route config's index and ring.
    prefixes: Vec<(Rc<RouteConfig>, Rc<local_prefix_cache::LocalPrefix>)>,
    /// global_least_request with a session without Redis (plain Envoy): each route config's
    /// ring of its endpoints, built once.
    rings: Vec<(Rc<RouteConfig>, crate::prefix::chwbl::Ring)>,
}

impl Policies {
    pub fn new(config: &PluginConfig, seed: u64) -> Policies {
        let mut slots = Vec::new();
        let mut services = Vec::new();
        let mut prefixes = Vec::new();
        let mut rings = Vec::new();
        for (position, c) in config.routes().enumerate() {
            match &c.policy {
                PolicyConfig::GlobalLeastRequest if c.redis.is_none() && c.session.is_some() => {
                    rings.push((c.clone(), crate::prefix::chwbl::Ring::new(&c.endpoints)))
                }
                PolicyConfig::PrefixCache(p) if c.redis.is_none() => prefixes.push((
                    c.clone(),
                    Rc::new(local_prefix_cache::LocalPrefix::new(position, c, p)),
                )),
                PolicyConfig::ClusterHash(h) => slots.push((c.clone(), cluster_hash::slots(h))),
                PolicyConfig::ClusterMetrics(m) => services.push((
                    c.clone(),
                    Rc::new(cluster_metrics::SharedStats::new(position, m)),
                )),
                _ => {}
            }
        }
        Policies {
            metrics: endpoint_metrics::EndpointMetrics::new(config, seed),
            slots,
            services,
            prefixes,
            rings,
        }
    }

    pub fn decide(&mut self, host: &mut dyn Host, env: Env, input: &Input) -> Decision {
        match &input.config.policy {
            PolicyConfig::GlobalLeastRequest if input.config.redis.is_some() => {
                least_request::decide(host, env, input)
            }
            // Plain Envoy: per-proxy counts in shared data.
            PolicyConfig::GlobalLeastRequest => {
                let ring = self
                    .rings
                    .iter()
                    .find(|(c, _)| Rc::ptr_eq(c, input.config))
                    .map(|(_, r)| r);
                local_least_request::decide(host, env, input, ring)
            }
            PolicyConfig::PrefixCache(settings) if input.config.redis.is_some() => {
                prefix_cache::decide(host, env, input, settings)
            }
            // Plain Envoy: the index in shared data, CHWBL where it knows nothing.
            PolicyConfig::PrefixCache(settings) => {
                match self
                    .prefixes
                    .iter()
                    .find(|(c, _)| Rc::ptr_eq(c, input.config))
                {
                    Some((_, state)) => local_prefix_cache::decide(
                        host,
                        env,
                        input,
                        settings,
                        state,
                        &mut self.metrics,
                    ),
                    None => Decision::Fallback(crate::reason::Cause::NoRoute),
                }
            }
            PolicyConfig::EndpointMetrics(mc) => self.metrics.decide(host, env, input, mc),
            PolicyConfig::ClusterHash(hc) => {
                let slots = self
                    .slots
                    .iter()
                    .find(|(c, _)| Rc::ptr_eq(c, input.config))
                    .and_then(|(_, s)| s.as_ref());
                cluster_hash::decide(host, hc, slots)
            }
            PolicyConfig::ClusterMetrics(_) => match self
                .services
                .iter()
                .find(|(c, _)| Rc::ptr_eq(c, input.config))
            {
                Some((_, stats)) => cluster_metrics::decide(host, env, input, stats),
                None => Decision::Fallback(crate::reason::Cause::NoRoute),
            },
        }
    }

    /// The root tick period the policies need (the metrics scraper's), 0 for none.
    pub fn tick_ms(&self) -> u32 {
        self.metrics.tick_ms()
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
