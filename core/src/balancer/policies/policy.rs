//! What a policy is: one object per route config, built at configure ([`super::build`]), that
//! answers one question — where does this request go — as a [`Decision`]. It is given the
//! request it decides for ([`Input`]) and the VM's shared services ([`Env`]); the request's
//! state machine does the rest.

use crate::balancer::events::{Decision, PromptRead};
use crate::balancer::healthy::HealthyLists;
use crate::balancer::metrics::Metrics;
use crate::balancer::pick::tenant_capacity;
use crate::balancer::redis_client::RedisClient;
use crate::balancer::rng::VmRng;
use crate::balancer::telemetry::Telemetry;
use crate::config::{tenant_id, Class, Fairness, RouteConfig};
use crate::hash::{fnv1a, FNV_OFFSET};
use crate::host::Host;
use crate::redis::inflight::InflightKeys;
use crate::redis::scripts::Keys;
use crate::stats::Counter;
use std::fmt;
use std::rc::Rc;

/// What a policy knows about the request it decides for.
pub struct Input<'a> {
    pub ctx: u32,
    pub config: &'a Rc<RouteConfig>,
    /// The route's Redis keys (None when the host did not name the route and cluster).
    pub keys: Option<&'a Rc<Keys>>,
    pub body_bytes: usize,
    /// False for a body over `maxBodyBytes`: decide without reading it.
    pub read_body: bool,
    /// A waiting request's retry (plain Envoy): what its first decision read from the body.
    pub read: Option<&'a Rc<PromptRead>>,
    /// cluster_metrics with `global_inflight_enabled`: the route's Redis count (None when the
    /// host did not name the route: the local path decides, as in Higress).
    pub inflight: Option<&'a Rc<InflightKeys>>,
    /// The endpoint-set fingerprint Redis holds for these keys, as far as this VM knows.
    pub synced: Option<&'a Rc<str>>,
}

/// A route's policy, with whatever state it keeps (built once per route config).
pub trait Policy {
    fn decide(&mut self, host: &mut dyn Host, env: Env, input: &Input) -> Decision;

    /// The root context's tick: a policy's own timed work (prefix_cache: the latency models'
    /// merge). Most policies have none.
    fn tick(&mut self, _host: &mut dyn Host, _tel: &mut Telemetry, _redis: &mut RedisClient) {}
}

/// What every policy may use besides the host: the VM's counters and randomness, its one view of
/// the endpoints' model-server metrics (the scraper feeds every route), and its Redis client.
pub struct Env<'a> {
    pub tel: &'a mut Telemetry,
    pub rng: &'a mut VmRng,
    pub metrics: &'a mut Metrics,
    /// The Redis client, for a policy's fire-and-forget calls at its decision (prefix_cache:
    /// a restarted pod's generation bumped); picks go through `Decision::Acquire`.
    pub redis: &'a mut RedisClient,
    /// The healthy endpoints of each route cluster, as the Redis picks last read them.
    pub hosts: &'a mut HealthyLists,
}

/// The request's priority class (None when the route has no `priorityHeader`): the class its
/// header names, held to its tenant's ceiling when the route has priority ceilings. The one
/// place a class is computed, for every policy and both builds. A value naming no class is
/// counted; a header asking above the ceiling is clamped, counted and logged at most once per
/// tenant per minute (docs/sessions-and-queues.md "Priority classes", "Priority ceilings").
pub fn priority_class(
    host: &mut dyn Host,
    tel: &mut Telemetry,
    ctx: u32,
    config: &RouteConfig,
) -> Option<Class> {
    let p = config.common.priority.as_ref()?;
    let value = host.request_header(&p.header).ok().flatten();
    // The tenant as tenant fairness reads it; ceilings need `tenantHeader` (config/ceiling.rs).
    let tenant = match (&p.ceilings, &config.common.fairness) {
        (Some(_), Some(f)) => host.request_header_bytes(&f.header).ok().flatten(),
        _ => None,
    };
    let name = tenant.as_deref().and_then(Fairness::name_of);
    let class = p.class_for(value.as_deref(), name);
    if class.unknown {
        tel.inc(host, Counter::PriorityUnknownClass);
    }
    if let (Some(asked), Some(ceilings)) = (class.clamped_from, &p.ceilings) {
        let (_, listed) = ceilings.of(name);
        let class_name = |rank: usize| p.classes.get(rank).map_or("?", String::as_str);
        tel.priority_clamped(
            host,
            ctx,
            name.map_or(0, |n| fnv1a(FNV_OFFSET, n)),
            format_args!(
                "priority clamped: {} asked for `{}` above its ceiling `{}` (counted in ai_lb.priority.clamped)",
                Caller { listed, name },
                class_name(asked),
                class_name(class.rank)
            ),
        );
    }
    Some(class)
}

/// Who a clamped request came from, for its log line: a tenant of `priorityCeilings` by its
/// config name, another by its id (the SHA-1 prefix fairness keys it by, never the bytes the
/// client sent), or no tenant. Formatted only when the line is logged.
struct Caller<'a> {
    listed: Option<&'a str>,
    name: Option<&'a [u8]>,
}

impl fmt::Display for Caller<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.listed, self.name) {
            (Some(listed), _) => write!(f, "tenant `{listed}`"),
            (None, Some(name)) => write!(f, "unlisted tenant id {}", tenant_id(name)),
            (None, None) => write!(f, "a caller without a tenant"),
        }
    }
}

/// The request's tenant id and the most it may hold while another tenant is active (its
/// share of the capacity of the pool's `endpoints`), when the route has tenant fairness and
/// the request names a tenant (docs/sessions-and-queues.md "Tenant fairness").
pub fn tenant(host: &dyn Host, config: &RouteConfig, endpoints: usize) -> Option<(String, u64)> {
    let f = config.common.fairness.as_ref()?;
    let value = host.request_header_bytes(&f.header).ok().flatten();
    let t = f.tenant_of(value.as_deref())?;
    let limit = Fairness::limit(t.share, tenant_capacity(config, endpoints));
    Some((t.id, limit))
}
