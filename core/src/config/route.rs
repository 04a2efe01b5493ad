//! One route's config (the global config or a `_rules_` entry): `lb_type` and `lb_policy`
//! chosen as Higress's Go plugin chooses them, `lb_config` compiled by the policy's module,
//! and every `lb_config` key the policy does not read reported (Higress ignores them too).

use super::ceiling::CEILING_KEYS;
use super::cluster_hash::CLUSTER_HASH_KEYS;
use super::cluster_metrics::CLUSTER_METRICS_KEYS;
use super::common::{self, Common, COMMON_KEYS, ENVOY_KEYS};
use super::data_parallel::{DataParallel, DP_KEYS};
use super::ejection::{Ejection, EJECTION_KEYS};
use super::error::ConfigError;
use super::fairness::FAIRNESS_KEYS;
use super::inflight::INFLIGHT_REDIS_KEYS;
use super::metrics::{MetricsConfig, METRICS_KEYS, SATURATION_SCRAPE_KEYS};
use super::prefix::{PrefixSettings, GUARD_KEYS, PREFIX_KEYS};
use super::raw::{RawLbConfig, RawRoute, LEGACY_KEYS};
use super::read::{In, Reader};
use super::redis;
use super::route_cluster;
use super::session::{self, AGENT_KEYS, SESSION_KEYS};
use super::types::{Policy, PolicyConfig, RouteConfig};
use super::values::Build;
use super::warning::nearest;
use serde_json::Value;
use std::rc::Rc;

const REDIS_KEYS: &[&str] = &[
    "serviceFQDN",
    "servicePort",
    "username",
    "password",
    "timeout",
    "database",
];
const DEFAULT_REDIS_TIMEOUT_MS: i64 = 3000;

/// Which `lb_config` keys each policy reads (for the "ignored" warnings).
const OWNERS: &[(&str, &[&[&str]])] = &[
    (
        "global_least_request",
        &[
            REDIS_KEYS,
            COMMON_KEYS,
            ENVOY_KEYS,
            SESSION_KEYS,
            AGENT_KEYS,
            FAIRNESS_KEYS,
            EJECTION_KEYS,
            CEILING_KEYS,
            DP_KEYS,
        ],
    ),
    (
        "prefix_cache",
        &[
            REDIS_KEYS,
            COMMON_KEYS,
            ENVOY_KEYS,
            PREFIX_KEYS,
            GUARD_KEYS,
            SESSION_KEYS,
            AGENT_KEYS,
            FAIRNESS_KEYS,
            EJECTION_KEYS,
            CEILING_KEYS,
            DP_KEYS,
        ],
    ),
    (
        "endpoint_metrics",
        &[
            COMMON_KEYS,
            ENVOY_KEYS,
            METRICS_KEYS,
            SATURATION_SCRAPE_KEYS,
            SESSION_KEYS,
            AGENT_KEYS,
        ],
    ),
    (
        "cluster_metrics",
        &[CLUSTER_METRICS_KEYS, INFLIGHT_REDIS_KEYS],
    ),
    ("cluster_hash", &[CLUSTER_HASH_KEYS]),
];

impl TryFrom<In<'_, '_, RawRoute>> for RouteConfig {
    type Error = ConfigError;

    fn try_from(i: In<'_, '_, RawRoute>) -> Result<RouteConfig, ConfigError> {
        let (raw, r, build) = (i.raw, i.r, i.build);
        for key in raw.other.keys().filter(|k| !k.starts_with('_')) {
            let mut message = "unknown key: ignored, as Higress ignores it".to_string();
            if let Some(near) = nearest(key, RawRoute::KEYS) {
                message.push_str(&format!("; did you mean `{near}`?"));
            }
            r.warn(key, message);
        }
        let lb_type = r.string("lb_type", &raw.lb_type).unwrap_or_default();
        if lb_type.is_empty() && raw.lb_type.is_some() {
            r.warn("lb_type", "empty: assumed `endpoint` (as in Higress)");
        }
        let lb_policy = r.string("lb_policy", &raw.lb_policy).unwrap_or_default();
        let policy = choose(&lb_type, &lb_policy, r)?;
        let lb = match raw.lb_config.as_ref() {
            None => Value::Null,
            Some(v) if v.0.is_object() || v.is_null() => v.0.clone(),
            Some(_) => {
                r.warn(
                    "lb_config",
                    "not an object: read as {} (as Higress reads it)",
                );
                Value::Null
            }
        };
        let lb = RawLbConfig::from_value(&lb);
        let mut lr = r.nested("lb_config");
        let (config, read) = compile(policy, &lb, &mut lr, build)?;
        warn_unread(&lb, &mut lr, config.policy.name(), &read);
        Ok(config)
    }
}

const ENDPOINT_POLICIES: &[&str] = &[
    "global_least_request",
    "prefix_cache",
    "endpoint_metrics",
    "metrics_based",
];
const CLUSTER_POLICIES: &[&str] = &["cluster_metrics", "cluster_hash"];
const LEAST_BUSY: &str = "`least_busy` was removed from Higress's ai-load-balancer, use \
    endpoint_metrics (Higress: lb_psolicy least_busy is not supported)";

/// Higress's dispatch: `lb_type` `""` is `endpoint`; each type has its own policies.
fn choose(lb_type: &str, lb_policy: &str, r: &Reader<'_>) -> Result<&'static str, ConfigError> {
    let (type_name, known) = match lb_type {
        "" | "endpoint" => ("endpoint", ENDPOINT_POLICIES),
        "cluster" => ("cluster", CLUSTER_POLICIES),
        other => {
            return Err(r.err_higress(
                "lb_type",
                format!(
                    "unknown value `{other}` (endpoint, cluster; \
                     Higress: lb_type {other} is not supported)"
                ),
            ))
        }
    };
    if let Some(p) = known.iter().find(|p| **p == lb_policy) {
        return Ok(p);
    }
    let problem = match lb_policy {
        "" => "missing".to_string(),
        "least_busy" => LEAST_BUSY.to_string(),
        p => format!(
            "unknown policy `{p}` for lb_type {type_name} ({})",
            known.join(", ")
        ),
    };
    Err(r.err_higress("lb_policy", problem))
}

/// Compiles `lb_config` for the policy; also returns the keys the policy read.
fn compile(
    policy: &str,
    lb: &RawLbConfig,
    r: &mut Reader<'_>,
    build: Build,
) -> Result<(RouteConfig, Vec<&'static str>), ConfigError> {
    let mut reads: Vec<&'static str> = OWNERS
        .iter()
        .find(|(p, _)| *p == policy || (policy == "metrics_based" && *p == "endpoint_metrics"))
        .map(|(_, lists)| lists.iter().flat_map(|l| l.iter().copied()).collect())
        .unwrap_or_default();
    let inflight = lb
        .global_inflight_enabled
        .as_ref()
        .is_some_and(|g| g.bool().0);
    if policy == "cluster_metrics" && !inflight {
        reads.retain(|k| !INFLIGHT_REDIS_KEYS.contains(k));
    }
    let (mut session, mut agents) = (None, None);
    let (policy_config, redis, common, endpoints, publish) = match policy {
        "cluster_metrics" | "cluster_hash" => {
            let (p, redis, common, publish) = route_cluster::compile(policy, lb, r, build)?;
            (p, redis, common, Vec::new(), publish)
        }
        _ => {
            let kind = match policy {
                "global_least_request" => Policy::GlobalLeastRequest,
                "prefix_cache" => Policy::PrefixCache,
                _ => Policy::EndpointMetrics,
            };
            if kind == Policy::EndpointMetrics {
                // The pool cap and tenant counts ride in the acquire (Redis script or the
                // plain-Envoy counts record): endpoint_metrics takes neither.
                if let Some(key) = lb.present().into_iter().find(|k| FAIRNESS_KEYS.contains(k)) {
                    return Err(r.err(
                        key,
                        "the pool cap and tenant fairness need global_least_request or prefix_cache",
                    ));
                }
                // Priority ceilings are bound to `tenantHeader`'s tenant, refused just above.
                if let Some(key) = lb.present().into_iter().find(|k| CEILING_KEYS.contains(k)) {
                    return Err(r.err(
                        key,
                        "priority ceilings are bound to `tenantHeader`: global_least_request or prefix_cache",
                    ));
                }
            }
            // endpoint_metrics keeps session bindings in Redis when a sticky route names a
            // Redis service (Higress build; docs/sessions-and-queues.md "Sessions"), else nothing.
            let binds = kind == Policy::EndpointMetrics
                && build == Build::Higress
                && lb.service_fqdn.is_some()
                && lb.present().into_iter().any(|k| SESSION_KEYS.contains(&k));
            let redis = if binds {
                reads.extend_from_slice(REDIS_KEYS);
                let timeout = r.int_or("timeout", &lb.timeout, DEFAULT_REDIS_TIMEOUT_MS, " ms");
                Some(redis::target(lb, r, "timeout", timeout)?)
            } else {
                redis_for(kind, lb, r, build)?
            };
            let metrics = match kind {
                Policy::EndpointMetrics => Some(MetricsConfig::try_from(In {
                    raw: lb,
                    r: &mut *r,
                    build,
                })?),
                _ => None,
            };
            let (endpoints, publish) = common::publish(In {
                raw: lb,
                r: &mut *r,
                build,
            })?;
            let mut common = Common::try_from(In {
                raw: lb,
                r: &mut *r,
                build,
            })?;
            if kind != Policy::EndpointMetrics {
                common.ejection = Ejection::read(lb, r)?;
                common.dp = DataParallel::read(lb, r)?;
            }
            if kind == Policy::PrefixCache && build == Build::Higress && common.max_load > 0 {
                r.warn(
                    "maxRequestCount",
                    "caps each endpoint under prefix_cache here too (a request that finds every \
                     pod at the cap gets 429); Higress's Go prefix_cache never reads it",
                );
            }
            let p = match (kind, metrics) {
                (Policy::EndpointMetrics, Some(m)) => PolicyConfig::EndpointMetrics(Rc::new(m)),
                (Policy::PrefixCache, _) => PolicyConfig::PrefixCache(PrefixSettings::try_from((
                    In {
                        raw: lb,
                        r: &mut *r,
                        build,
                    },
                    common.max_body_bytes,
                ))?),
                _ => PolicyConfig::GlobalLeastRequest,
            };
            session = sticky(
                kind,
                lb,
                r,
                build,
                p.reads_body(common.cost),
                redis.is_some(),
            )?;
            let session_ttl = session
                .as_ref()
                .filter(|_| lb.session_ttl.is_some())
                .map(|s| s.ttl_s);
            agents = session::agents(
                In {
                    raw: lb,
                    r: &mut *r,
                    build,
                },
                session_ttl,
            )?;
            (p, redis, common, endpoints, publish)
        }
    };
    // Cluster policies read only headers (as in Higress), but for a cluster_hash key in the
    // body (Higress PR #3921). Plain Envoy holds a request for its body only where the body is
    // used: the prompt (prefix_cache), the model (endpoint_metrics' LoRA affinity and sheddable
    // models) and the cost (least request by bytes or tokens). The Higress build always waits
    // for an endpoint policy's body: its host delivers it to a held request.
    let decide_at_headers = !policy_config.reads_body(common.cost)
        && (policy_config.is_cluster() || build == Build::Envoy);
    let (endpoints, pods) = common.dp.targets(endpoints);
    let config = RouteConfig {
        policy: policy_config,
        redis,
        common,
        endpoints,
        pods,
        publish,
        decide_at_headers,
        session: session.map(Rc::new),
        agents: agents.map(Rc::new),
    };
    Ok((config, reads))
}

/// Session stickiness, an option of every endpoint policy (docs/sessions-and-queues.md "Sessions"). The binding
/// lives in Redis where the route has Redis (`redis`: global_least_request and prefix_cache,
/// and endpoint_metrics naming a Redis service, Higress build; docs/redis-data-model.md §10);
/// elsewhere the session id is consistent-hashed onto the endpoints and no binding is stored,
/// so `sessionTTL` would be silently ignored: refused.
fn sticky(
    kind: Policy,
    lb: &RawLbConfig,
    r: &mut Reader<'_>,
    build: Build,
    reads_body: bool,
    redis: bool,
) -> Result<Option<session::SessionConfig>, ConfigError> {
    if !lb.present().into_iter().any(|k| SESSION_KEYS.contains(&k)) {
        return Ok(None);
    }
    if !redis && lb.session_ttl.is_some() {
        let why = if kind == Policy::EndpointMetrics && build == Build::Higress {
            "endpoint_metrics without serviceFQDN stores no binding (sessions are \
             consistent-hashed)"
                .to_string()
        } else {
            format!(
                "{} in the {} build stores no binding (sessions are consistent-hashed)",
                kind.name(),
                build.name()
            )
        };
        return Err(r.err("sessionTTL", why));
    }
    session::session(
        In { raw: lb, r, build },
        // The Higress build always waits for the body (see decide_at_headers below).
        reads_body || build == Build::Higress,
    )
}

/// The Redis target of the policies that keep state in Redis. The others read no Redis key:
/// Higress ignores them there (a warning), the plain-Envoy build has no Redis at all (an error).
fn redis_for(
    kind: Policy,
    lb: &RawLbConfig,
    r: &mut Reader<'_>,
    build: Build,
) -> Result<Option<super::types::RedisTarget>, ConfigError> {
    if kind.uses_redis(build) {
        let timeout = r.int_or("timeout", &lb.timeout, DEFAULT_REDIS_TIMEOUT_MS, " ms");
        return redis::target(lb, r, "timeout", timeout).map(Some);
    }
    if build == Build::Envoy {
        if let Some(key) = lb.present().into_iter().find(|k| REDIS_KEYS.contains(k)) {
            return Err(r.err(
                key,
                "the plain-Envoy build has no Redis (state is kept per proxy)",
            ));
        }
    }
    Ok(None)
}

/// Warns about every `lb_config` key the policy did not read.
fn warn_unread(lb: &RawLbConfig, r: &mut Reader<'_>, policy: &str, read: &[&str]) {
    for key in lb.present().into_iter().filter(|k| !read.contains(k)) {
        let owners: Vec<&str> = OWNERS
            .iter()
            .filter(|(_, lists)| lists.iter().any(|l| l.contains(&key)))
            .map(|(p, _)| *p)
            .collect();
        let why = if policy == "cluster_metrics" && INFLIGHT_REDIS_KEYS.contains(&key) {
            "read only with global_inflight_enabled".to_string()
        } else {
            format!("a key of {}", owners.join(", "))
        };
        r.warn(
            key,
            format!("not read by {policy} ({why}): ignored, as Higress ignores it"),
        );
    }
    for key in lb.other.keys().filter(|k| !k.starts_with('_')) {
        let mut message = "unknown key: ignored, as Higress ignores it".to_string();
        if let Some((_, legacy)) = LEGACY_KEYS.iter().find(|(k, _)| k == key) {
            message.push_str(&format!(" ({legacy})"));
        } else if let Some(near) = nearest(key, RawLbConfig::KEYS) {
            message.push_str(&format!("; did you mean `{near}`?"));
        }
        r.warn(key, message);
    }
}
