//! One route's balancing config: `lb_type`, `lb_policy` and `lb_config` (Higress's keys plus
//! the new ones documented in the README).

use super::metrics::MetricsConfig;
use super::{fields, Build, ConfigError};
use serde_json::{Map, Value};
use std::fmt;
use std::rc::Rc;

/// The balancing policy of a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    GlobalLeastRequest,
    PrefixCache,
    EndpointMetrics,
}

impl Policy {
    pub const ALL: [Policy; 3] = [
        Policy::GlobalLeastRequest,
        Policy::PrefixCache,
        Policy::EndpointMetrics,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::GlobalLeastRequest => "global_least_request",
            Policy::PrefixCache => "prefix_cache",
            Policy::EndpointMetrics => "endpoint_metrics",
        }
    }

    /// Short label used in metric names.
    pub fn metric_label(self) -> &'static str {
        match self {
            Policy::GlobalLeastRequest => "glr",
            Policy::PrefixCache => "prefix",
            Policy::EndpointMetrics => "metrics",
        }
    }

    /// Whether the policy keeps its state in Redis (and so needs the Redis keys). In the
    /// plain-Envoy build, global_least_request keeps it per proxy in shared data instead.
    pub fn uses_redis(self, build: Build) -> bool {
        match self {
            Policy::GlobalLeastRequest => build == Build::Higress,
            Policy::PrefixCache => true,
            Policy::EndpointMetrics => false,
        }
    }
}

/// A route's policy with its own settings: the balancer dispatches on this enum, and each
/// variant is served by one module of `balancer::policies`.
#[derive(Debug, Clone)]
pub enum PolicyConfig {
    /// Settings are the route's common ones (Redis target, `maxRequestCount`, cost).
    GlobalLeastRequest,
    PrefixCache(super::prefix::PrefixSettings),
    EndpointMetrics(Rc<MetricsConfig>),
}

impl PolicyConfig {
    /// The policy's kind (metric labels, summaries).
    pub fn kind(&self) -> Policy {
        match self {
            PolicyConfig::GlobalLeastRequest => Policy::GlobalLeastRequest,
            PolicyConfig::PrefixCache(_) => Policy::PrefixCache,
            PolicyConfig::EndpointMetrics(_) => Policy::EndpointMetrics,
        }
    }

    /// endpoint_metrics settings, if this is that policy.
    pub fn metrics(&self) -> Option<&Rc<MetricsConfig>> {
        match self {
            PolicyConfig::EndpointMetrics(m) => Some(m),
            _ => None,
        }
    }
}

/// What one request adds to its endpoint's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CostMode {
    /// 1 per request (Higress's behaviour).
    Requests,
    /// The request body's size in bytes.
    Bytes,
    /// An estimate of prompt tokens: body bytes / 4, at least 1.
    Tokens,
}

/// What happens when the plugin cannot decide (Redis down, no healthy host, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureMode {
    /// Let the cluster's own load balancer pick (fail open; Higress's behaviour).
    Allow,
    /// Answer 503.
    Deny,
}

/// A secret that never prints.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "\"***\"" })
    }
}

/// The Redis service, reached through an Envoy cluster named like Higress does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisTarget {
    /// `outbound|<port>||<fqdn>`: the name `proxy_redis_call` takes.
    pub cluster: String,
    /// The cluster name plus init parameters (`?db=N`, flush settings) for `proxy_redis_init`.
    pub init_cluster: String,
    pub username: String,
    pub password: Secret,
    pub timeout_ms: u32,
    pub database: u32,
}

/// How the choice reaches the router.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Publish {
    /// Higress: `proxy_set_upstream_override_host`.
    OverrideHost,
    /// Plain Envoy: an `ip:port[,ip:port]` request header for the `override_host` LB policy,
    /// with up to `fallbacks` further endpoints after the choice.
    Header { name: String, fallbacks: usize },
}

/// A route's validated config.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    pub policy: PolicyConfig,
    /// Present for the policies that use Redis.
    pub redis: Option<RedisTarget>,
    /// `ailb` by default: keys are `<prefix>:{<route>|<cluster>}:<name>`.
    pub key_prefix: String,
    pub lease_ttl_ms: u64,
    pub cost: CostMode,
    /// `maxRequestCount`: cap on an endpoint's load (0 = none); 429 when every endpoint is at it.
    pub max_load: u64,
    pub failure_mode: FailureMode,
    pub debug_header: Option<String>,
    pub max_body_bytes: usize,
    pub detail_log: bool,
    /// Plain-Envoy build: the endpoints to choose from (`ip:port`, sorted, deduplicated).
    pub endpoints: Rc<Vec<String>>,
    pub publish: Publish,
    /// Decide in the request-headers phase (plain Envoy: the body comes after routing).
    pub decide_at_headers: bool,
}

const DEFAULT_TIMEOUT_MS: u64 = 3000;
const DEFAULT_LEASE_TTL_S: u64 = 600;
const DEFAULT_MAX_BODY_BYTES: u64 = 10 * 1024 * 1024;

impl RouteConfig {
    /// Reads `lb_type`, `lb_policy` and `lb_config` from one config object (global or rule).
    pub fn parse(map: &Map<String, Value>, build: Build) -> Result<RouteConfig, ConfigError> {
        let mut f = fields(map);
        let lb_type: Option<String> = f.get("lb_type")?;
        match lb_type.as_deref() {
            None | Some("endpoint") => {}
            Some("cluster") => {
                return Err(ConfigError::new(
                    "lb_type",
                    "`cluster` (cluster_metrics, cluster_hash) is not supported: this plugin balances endpoints",
                ))
            }
            Some(other) => return Err(ConfigError::new("lb_type", format!("unknown value `{other}` (expected `endpoint`)"))),
        }
        let policy = match f.get::<String>("lb_policy")?.as_deref() {
            Some("global_least_request") => Policy::GlobalLeastRequest,
            Some("prefix_cache") => Policy::PrefixCache,
            Some("endpoint_metrics" | "metrics_based") => Policy::EndpointMetrics,
            Some(other) => {
                return Err(ConfigError::new(
                    "lb_policy",
                    format!("unknown policy `{other}`"),
                ))
            }
            None => return Err(ConfigError::new("lb_policy", "missing")),
        };
        if build == Build::Envoy && policy == Policy::PrefixCache {
            return Err(ConfigError::new(
                "lb_policy",
                "prefix_cache needs the request body before routing: Higress build only",
            ));
        }
        let empty = Map::new();
        let lb_config = match f.raw("lb_config") {
            None | Some(Value::Null) => &empty,
            Some(Value::Object(m)) => m,
            Some(_) => return Err(ConfigError::new("lb_config", "must be an object")),
        };
        f.finish()?;
        parse_lb_config(policy, lb_config, build).map_err(|e| e.within("lb_config"))
    }
}

/// Letters, digits, '-' and '_': what a header name config key accepts.
pub(super) fn is_header_name(h: &str) -> bool {
    !h.is_empty()
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn parse_lb_config(
    policy: Policy,
    map: &Map<String, Value>,
    build: Build,
) -> Result<RouteConfig, ConfigError> {
    let mut f = fields(map);
    let redis = parse_redis(&mut f, policy, build)?;
    let metrics = if policy == Policy::EndpointMetrics {
        Some(Rc::new(super::metrics::parse(&mut f, build)?))
    } else {
        None
    };
    let (endpoints, publish) = parse_envoy(&mut f, policy, build)?;
    let max_load: u64 = f.get("maxRequestCount")?.unwrap_or(0);
    // Accepted for compatibility: the membership sync (docs/redis-data-model.md §3) already drops
    // endpoints that left the cluster, which is all Higress's periodic clean-up did.
    let _clean_interval: Option<u64> = f.get("cleanInterval")?;
    let detail_log: bool = f.get("enableDetailLog")?.unwrap_or(true);

    let lease_ttl_s: u64 = f.get("leaseTTL")?.unwrap_or(DEFAULT_LEASE_TTL_S);
    if !(1..=86_400).contains(&lease_ttl_s) {
        return Err(ConfigError::new(
            "leaseTTL",
            format!("{lease_ttl_s} s is outside 1-86400"),
        ));
    }
    let cost = match f.get::<String>("costMode")?.as_deref() {
        None | Some("requests") => CostMode::Requests,
        Some("bytes") => CostMode::Bytes,
        Some("tokens") => CostMode::Tokens,
        Some(other) => {
            return Err(ConfigError::new(
                "costMode",
                format!("unknown value `{other}` (requests, bytes, tokens)"),
            ))
        }
    };
    let failure_mode = match f.get::<String>("failureMode")?.as_deref() {
        None | Some("allow") => FailureMode::Allow,
        Some("deny") => FailureMode::Deny,
        Some(other) => {
            return Err(ConfigError::new(
                "failureMode",
                format!("unknown value `{other}` (allow, deny)"),
            ))
        }
    };
    let debug_header: Option<String> = f.get("debugHeader")?;
    if let Some(h) = &debug_header {
        if !is_header_name(h) {
            return Err(ConfigError::new(
                "debugHeader",
                "must be a header name (letters, digits, '-', '_')",
            ));
        }
    }
    let max_body_bytes: u64 = f.get("maxBodyBytes")?.unwrap_or(DEFAULT_MAX_BODY_BYTES);
    if max_body_bytes == 0 || max_body_bytes > 1 << 30 {
        return Err(ConfigError::new(
            "maxBodyBytes",
            "must be between 1 and 1073741824",
        ));
    }
    let key_prefix: String = f
        .get("redisKeyPrefix")?
        .unwrap_or_else(|| "ailb".to_string());
    if key_prefix.is_empty()
        || !key_prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(ConfigError::new(
            "redisKeyPrefix",
            "must be non-empty letters, digits, '-', '_' or '.'",
        ));
    }
    let policy = match (policy, metrics) {
        (Policy::PrefixCache, _) => {
            PolicyConfig::PrefixCache(super::prefix::parse(&mut f, max_body_bytes as usize)?)
        }
        (Policy::EndpointMetrics, Some(m)) => PolicyConfig::EndpointMetrics(m),
        _ => PolicyConfig::GlobalLeastRequest,
    };
    f.finish()?;

    Ok(RouteConfig {
        policy,
        redis,
        key_prefix,
        lease_ttl_ms: lease_ttl_s * 1000,
        cost,
        max_load,
        failure_mode,
        debug_header: debug_header.map(|h| h.to_ascii_lowercase()),
        max_body_bytes: max_body_bytes as usize,
        detail_log,
        endpoints: Rc::new(endpoints),
        publish,
        decide_at_headers: build == Build::Envoy,
    })
}

/// The plain-Envoy keys: `endpoints` (required there) and `destinationHeader`/`fallbackCount`.
/// The Higress build takes its endpoints from the host and rejects them.
fn parse_envoy(
    f: &mut super::fields::Fields<'_>,
    policy: Policy,
    build: Build,
) -> Result<(Vec<String>, Publish), ConfigError> {
    let endpoints: Option<Vec<String>> = f.get("endpoints")?;
    let header: Option<String> = f.get("destinationHeader")?;
    let fallbacks: Option<u64> = f.get("fallbackCount")?;
    if build == Build::Higress {
        for (key, set) in [
            ("endpoints", endpoints.is_some()),
            ("destinationHeader", header.is_some()),
            ("fallbackCount", fallbacks.is_some()),
        ] {
            if set {
                return Err(ConfigError::new(
                    key,
                    "only in the plain-Envoy build (Higress gives the endpoints and the override call)",
                ));
            }
        }
        return Ok((Vec::new(), Publish::OverrideHost));
    }
    let mut endpoints = endpoints.unwrap_or_default();
    if endpoints.is_empty() && policy != Policy::PrefixCache {
        return Err(ConfigError::new(
            "endpoints",
            "missing: the plain-Envoy build needs the pods as [\"ip:port\", ...]",
        ));
    }
    for (i, e) in endpoints.iter().enumerate() {
        if !is_endpoint(e) {
            return Err(ConfigError::new(
                format!("endpoints[{i}]"),
                format!("`{e}` is not ip:port"),
            ));
        }
    }
    endpoints.sort_unstable();
    endpoints.dedup();
    let name = header.unwrap_or_else(|| DEFAULT_DESTINATION_HEADER.to_string());
    if !is_header_name(&name) {
        return Err(ConfigError::new(
            "destinationHeader",
            "must be a header name (letters, digits, '-', '_')",
        ));
    }
    let fallbacks = fallbacks.unwrap_or(2);
    if fallbacks > 16 {
        return Err(ConfigError::new("fallbackCount", "at most 16"));
    }
    Ok((
        endpoints,
        Publish::Header {
            name: name.to_ascii_lowercase(),
            fallbacks: fallbacks as usize,
        },
    ))
}

pub const DEFAULT_DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";

/// `a.b.c.d:port` or `[v6]:port`.
fn is_endpoint(e: &str) -> bool {
    let Some((host, port)) = e.rsplit_once(':') else {
        return false;
    };
    let port_ok = port.parse::<u16>().is_ok_and(|p| p != 0);
    let host_ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        v6.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        host.parse::<std::net::Ipv4Addr>().is_ok()
    };
    port_ok && host_ok
}

/// Higress's Redis keys. Required by the policies that keep state in Redis; the others accept
/// none of them (a config naming a Redis it does not use is probably a mistake).
fn parse_redis<'a>(
    f: &mut super::fields::Fields<'a>,
    policy: Policy,
    build: Build,
) -> Result<Option<RedisTarget>, ConfigError> {
    let fqdn: Option<String> = f.get("serviceFQDN")?;
    if !policy.uses_redis(build) {
        let why = if build == Build::Envoy {
            "the plain-Envoy build has no Redis (state is kept per proxy)".to_string()
        } else {
            format!("policy {} does not use Redis", policy.name())
        };
        return match fqdn {
            None => Ok(None),
            Some(_) => Err(ConfigError::new("serviceFQDN", why)),
        };
    }
    let fqdn = fqdn.ok_or_else(|| {
        ConfigError::new(
            "serviceFQDN",
            "missing (the Redis service, e.g. redis.static)",
        )
    })?;
    if fqdn.is_empty() || fqdn.contains(['|', '?', ' ']) {
        return Err(ConfigError::new(
            "serviceFQDN",
            "must be a host name without '|', '?' or spaces",
        ));
    }
    let port: u64 = f
        .get("servicePort")?
        .ok_or_else(|| ConfigError::new("servicePort", "missing (the Redis port, e.g. 6379)"))?;
    if !(1..=65535).contains(&port) {
        return Err(ConfigError::new(
            "servicePort",
            format!("{port} is not a port (1-65535)"),
        ));
    }
    let username: String = f.get("username")?.unwrap_or_default();
    let password: String = f.get("password")?.unwrap_or_default();
    // Higress treats a missing or zero timeout as the default.
    let timeout_ms = match f.get::<u64>("timeout")? {
        None | Some(0) => DEFAULT_TIMEOUT_MS,
        Some(t) if t <= 600_000 => t,
        Some(t) => {
            return Err(ConfigError::new(
                "timeout",
                format!("{t} ms is over the 600000 ms limit"),
            ))
        }
    };
    let database: u64 = f.get("database")?.unwrap_or(0);
    if database > 65535 {
        return Err(ConfigError::new(
            "database",
            format!("{database} is not a database index"),
        ));
    }
    let cluster = format!("outbound|{port}||{fqdn}");
    Ok(Some(RedisTarget {
        init_cluster: init_cluster(&cluster, database),
        cluster,
        username,
        password: Secret(password),
        timeout_ms: timeout_ms as u32,
        database: database as u32,
    }))
}

/// `?db=N` only when N ≠ 0 (as both Higress wrappers do), and immediate writes: by default the
/// host holds small Redis requests up to 3 ms to batch them, which would be most of the
/// routing latency. Hosts that do not know the flush parameters ignore them
/// (docs/higress-abi.md §4).
fn init_cluster(cluster: &str, database: u64) -> String {
    let mut s = format!("{cluster}?");
    if database != 0 {
        s.push_str(&format!("db={database}&"));
    }
    s.push_str("buffer_flush_timeout=0&max_buffer_size_before_flush=0");
    s
}
