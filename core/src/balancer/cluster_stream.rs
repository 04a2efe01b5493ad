//! A cluster request on its usual path, kept out of the request machine (`request.rs`).
//!
//! A cluster policy decides from the request headers alone, and unless AdaptiveScore counts
//! in Redis (`global_inflight_enabled`) it waits for nothing: no body, no Redis reply, and no
//! queue, since its refusals never wait (`Rejection::may_wait`). Routed, such a request is
//! only what the machine's `Routed` phase would hold: for cluster_metrics, the service's
//! in-flight count with the response's status and first byte; for cluster_hash, nothing
//! (a cluster route has no debug header: `config::route` gives it `Common::defaults()`). So
//! cluster_metrics keeps it here as a [`ClusterStream`] from its decision to its end, and the
//! callbacks after the decision read and update that alone; cluster_hash keeps nothing.
//!
//! Every other outcome — a refusal, a fallback, a publish that failed — goes to the request
//! machine as the decision it is (`Event::Decided`), so their rules stay in one place.
//!
//! Why it exists: with every worker cold at each request, a request's cost follows the code
//! and data it touches, and for a request that never waits the machine's events, effects and
//! phases were a fifth (AdaptiveScore) to a third (cluster_hash) of it (docs/plugin-cpu.md).

use super::events::{Decision, Hold};
use super::held::response_ok;
use super::pick::ServiceLease;
use super::policies::cluster_metrics;
use super::publish;
use super::telemetry::Telemetry;
use crate::config::{PluginConfig, PolicyConfig, Publish, RequestKeys, RouteConfig};
use crate::host::{Host, LogLevel};
use crate::id_map::IdMap;
use crate::reason::Reason;
use crate::stats::{Counter, Outcome};
use std::rc::Rc;

/// A routed cluster_metrics request: the machine's `Held::Service`.
struct ClusterStream {
    /// The service's in-flight count, given back at stream end with the latency.
    lease: ServiceLease,
    /// `:status` of the response is Go's success, `200` (false until the response headers,
    /// and without them).
    ok: bool,
    first_byte: bool,
}

/// Whether requests of `config` take this path: a cluster policy that asks Redis nothing and
/// writes no debug header (the machine writes it, should a cluster route ever have one).
pub fn takes(config: &RouteConfig) -> bool {
    config.policy.is_cluster()
        && config.policy.global_inflight().is_none()
        && config.common.debug_header.is_none()
}

/// The route every request of a plugin config takes, fixed when the config loads: a config
/// without rules, whose requests' route is known before their headers are read, and whose
/// one config [`takes`] this path. Such a request reads no request names, selects no config
/// and checks nothing before its decision: 25 code lines of 519 per request
/// (docs/plugin-cpu.md).
pub struct Lane {
    pub config: Rc<RouteConfig>,
    /// [`replaces_client_headers`] of the config.
    pub replaced: bool,
}

impl Lane {
    pub fn of(plugin: &PluginConfig, destination: &[String]) -> Option<Lane> {
        if plugin.needs_request_names() {
            return None;
        }
        let config = plugin.select(&RequestKeys::default())?;
        takes(config).then(|| Lane {
            replaced: replaces_client_headers(config, destination),
            config: config.clone(),
        })
    }
}

/// This VM's routed cluster requests, by http context id.
#[derive(Default)]
pub struct ClusterStreams(IdMap<ClusterStream>);

/// Whether a routed request of `config` (a route this path [`takes`]) needs no strip of the
/// client's destination headers (`destination`, every config's): cluster_metrics reads no
/// request header, and when its cluster header is the only destination header, publishing it
/// replaces every client copy (a replace drops all copies of the name: Envoy's
/// `HeaderMap::setCopy`, the emulator alike). One host call less per request; an outcome not
/// published strips as usual (the balancer).
pub fn replaces_client_headers(config: &RouteConfig, destination: &[String]) -> bool {
    let PolicyConfig::ClusterMetrics(_) = &config.policy else {
        return false;
    };
    match (&config.publish, destination) {
        (Publish::ClusterHeader { name }, [only]) => name == only,
        _ => false,
    }
}

impl ClusterStreams {
    /// A policy's decision for request `ctx` of a route that [`takes`] this path: a plain
    /// route is published, counted and kept here (cluster_metrics) or done with
    /// (cluster_hash), and None is left. Anything else — a refusal, a fallback, a publish
    /// that failed — is returned, for the request machine to take as the decision it is.
    pub fn route(
        &mut self,
        host: &mut dyn Host,
        tel: &Telemetry,
        ctx: u32,
        config: &RouteConfig,
        decision: Decision,
    ) -> Option<Decision> {
        let Decision::Route {
            endpoint,
            fallbacks,
            reason,
            hold,
        } = decision
        else {
            return Some(decision);
        };
        let lease = match hold {
            None => None,
            Some(Hold::Service(lease)) => Some(lease),
            // Not a cluster policy's: the machine gives it back.
            hold @ Some(Hold::Local(_)) => {
                return Some(Decision::Route {
                    endpoint,
                    fallbacks,
                    reason,
                    hold,
                })
            }
        };
        if publish::publish(host, config, &endpoint, &fallbacks).is_err() {
            // The machine publishes once more, and answers 500 as Higress does if that fails
            // too, giving the count back.
            return Some(Decision::Route {
                endpoint,
                fallbacks,
                reason,
                hold: lease.map(Hold::Service),
            });
        }
        self.routed(host, tel, ctx, config, &endpoint, reason);
        if let Some(lease) = lease {
            self.keep(ctx, lease);
        }
        None
    }

    /// [`ClusterStreams::route`] of a cluster_metrics decision counted in this proxy
    /// (`cluster_metrics::decide_local`), without a [`Decision`] built to be taken apart: the
    /// header is published from the statistics' own name. A publish that failed is returned,
    /// for the machine, as the decision it is.
    pub fn route_lease(
        &mut self,
        host: &mut dyn Host,
        tel: &Telemetry,
        ctx: u32,
        config: &RouteConfig,
        lease: ServiceLease,
    ) -> Option<Decision> {
        let name = lease.name();
        if publish::publish(host, config, name, &[]).is_err() {
            return Some(Decision::Route {
                endpoint: name.to_string(),
                fallbacks: Vec::new(),
                reason: Reason::ClusterMetrics,
                hold: Some(Hold::Service(lease)),
            });
        }
        self.routed(host, tel, ctx, config, name, Reason::ClusterMetrics);
        self.keep(ctx, lease);
        None
    }

    /// A published route: counted, and logged where the route asks.
    fn routed(
        &self,
        host: &mut dyn Host,
        tel: &Telemetry,
        ctx: u32,
        config: &RouteConfig,
        endpoint: &str,
        reason: Reason,
    ) {
        tel.inc(
            host,
            Counter::Decision(config.policy.kind(), Outcome::Routed),
        );
        if config.common.detail_log && tel.enabled(LogLevel::Debug) {
            tel.log(
                host,
                LogLevel::Debug,
                ctx,
                format_args!("routed to {endpoint} ({})", reason.name()),
            );
        }
    }

    /// Keeps routed stream `ctx` with its count until its end.
    fn keep(&mut self, ctx: u32, lease: ServiceLease) {
        let stream = ClusterStream {
            lease,
            ok: false,
            first_byte: false,
        };
        self.0.insert(ctx, stream);
    }

    /// The response headers of a stream kept here: its status, for the statistics. Whether
    /// its body chunks matter next; None when `ctx` is not one.
    pub fn response_headers(&mut self, host: &mut dyn Host, ctx: u32) -> Option<bool> {
        let stream = self.0.get_mut(&ctx)?;
        stream.ok = response_ok(host);
        Some(!stream.first_byte)
    }

    /// A response body chunk of a stream kept here: the first one is its time to first byte.
    /// Whether later chunks matter (never); None when `ctx` is not one.
    pub fn response_body(
        &mut self,
        host: &mut dyn Host,
        tel: &Telemetry,
        ctx: u32,
    ) -> Option<bool> {
        let stream = self.0.get_mut(&ctx)?;
        if !stream.first_byte {
            stream.first_byte = true;
            cluster_metrics::first_byte(host, tel, &stream.lease, stream.ok);
        }
        Some(false)
    }

    /// Whether a stream kept here still reads its response body; None when `ctx` is not one.
    pub fn wants_response_body(&self, ctx: u32) -> Option<bool> {
        self.0.get(&ctx).map(|s| !s.first_byte)
    }

    /// Stream end of a stream kept here: its count back, with its latency and outcome. False
    /// when `ctx` is not one.
    pub fn done(&mut self, host: &mut dyn Host, tel: &Telemetry, ctx: u32) -> bool {
        let Some(stream) = self.0.remove(&ctx) else {
            return false;
        };
        let outcome = Some(stream.ok);
        cluster_metrics::done(host, tel, stream.lease, outcome);
        true
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}
