//! The config's routes, each with its policy object (built once at configure), and how a
//! request's headers find their route: the host names a rule needs are read, the client's
//! destination headers removed, and the request created with its Redis keys.

use super::policies::{self, Policy};
use super::publish;
use super::redis_client::RedisClient;
use super::request::Request;
use super::telemetry::Telemetry;
use crate::config::{PluginConfig, RequestKeys, RouteConfig};
use crate::host::{self, Host};
use crate::redis::inflight::InflightKeys;
use crate::redis::scripts::Keys;
use std::rc::Rc;

/// A route config and its policy, built once at configure.
pub struct Route {
    pub config: Rc<RouteConfig>,
    pub policy: Box<dyn Policy>,
}

/// Every route config (global first) with its policy object, and what selecting one reads.
pub struct Routes {
    pub config: PluginConfig,
    pub list: Vec<Route>,
    /// The headers a client must never send us (`publish::destination_headers`).
    destination_headers: Vec<String>,
    /// Whether a request's `:authority` is read: only a `_match_domain_` rule needs it.
    matches_domains: bool,
    /// Whether a request's `cluster_name` is read before its config is chosen: only a
    /// `_match_service_` rule needs it then (an endpoint policy's keys need it after).
    matches_services: bool,
}

impl Routes {
    /// Each route's policy object, built from its config (`policies::build`).
    pub fn build(config: PluginConfig) -> Routes {
        Routes {
            list: config
                .routes()
                .enumerate()
                .map(|(position, c)| Route {
                    config: c.clone(),
                    policy: policies::build(position, c),
                })
                .collect(),
            matches_domains: config.matches_domains(),
            matches_services: config.matches_services(),
            destination_headers: publish::destination_headers(&config),
            config,
        }
    }

    /// The root tick, for each route's policy (its own timed work, `Policy::tick`).
    pub fn tick(&mut self, host: &mut dyn Host, tel: &mut Telemetry, redis: &mut RedisClient) {
        for route in &mut self.list {
            route.policy.tick(host, tel, redis);
        }
    }

    /// The request whose headers the host holds, on the route they select; None when no rule
    /// and no global config applies (the plugin is off for it). The client's copies of every
    /// destination header are removed either way: a client must never steer override_host or
    /// a cluster_header route.
    pub fn request(&self, host: &mut dyn Host) -> Option<Request> {
        // Host calls a rule-less cluster policy would only throw away. Each name is read only
        // where something needs it: `:authority` for a domain rule, `cluster_name` for a
        // service rule or, below, an endpoint policy's keys.
        let names = self.config.needs_request_names();
        let (route, mut cluster, authority) = if names {
            (
                host::text_property(host, "route_name"),
                self.matches_services
                    .then(|| host::text_property(host, "cluster_name"))
                    .flatten(),
                self.matches_domains
                    .then(|| host.request_header(":authority").ok().flatten())
                    .flatten(),
            )
        } else {
            (None, None, None)
        };
        let request_keys = RequestKeys {
            route: route.as_deref(),
            cluster: cluster.as_deref(),
            authority: authority.as_deref(),
        };
        let position = self.config.select_position(&request_keys);
        publish::strip_destination_headers(host, &self.destination_headers);
        let (position, config) =
            position.and_then(|p| Some((p, self.list.get(p)?.config.clone())))?;
        if names && !self.matches_services && !config.policy.is_cluster() {
            cluster = host::text_property(host, "cluster_name");
        }
        let keys = match (&route, &cluster) {
            (Some(r), Some(c)) if !r.is_empty() && !c.is_empty() => {
                Some(Rc::new(Keys::new(&config.common.key_prefix, r, c)))
            }
            _ => None,
        };
        let inflight = config
            .policy
            .global_inflight()
            .zip(route.as_deref().filter(|r| !r.is_empty()))
            .map(|(g, r)| Rc::new(InflightKeys::new(&g.key_prefix, r)));
        let mut request = Request::new(config, keys);
        request.route = position;
        request.inflight = inflight;
        if request.config.common.max_body_wait_ms > 0 {
            // Only a route with a body deadline (plain Envoy) needs the clock here.
            request.since_ms = host.now_ms();
        }
        Some(request)
    }
}
