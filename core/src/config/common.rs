//! The keys every endpoint policy shares: Higress's `maxRequestCount`, `cleanInterval` and
//! `enableDetailLog` (read as Go reads them), our own `leaseTTL`, `costMode`, `failureMode`,
//! `debugHeader`, `maxBodyBytes`, `redisKeyPrefix` (strict), and the plain-Envoy build's
//! `endpoints`, `destinationHeader`, `fallbackCount`, `maxBodyWaitMs` (strict).

pub use super::data_parallel::DataParallel;
pub use super::ejection::Ejection;
use super::error::ConfigError;
pub use super::priority::Priority;
pub use super::queue::Queue;
use super::raw::RawLbConfig;
use super::read::In;
use super::values::Build;
use super::values::{CostMode, FailureMode, Publish};

pub const COMMON_KEYS: &[&str] = &[
    "maxRequestCount",
    "cleanInterval",
    "enableDetailLog",
    "leaseTTL",
    "costMode",
    "failureMode",
    "debugHeader",
    "maxBodyBytes",
    "redisKeyPrefix",
    "priorityHeader",
    "priorityClasses",
    "defaultPriorityClass",
    "criticalHeadroom",
    "priorityReserve",
    "queueTimeoutMs",
    "maxQueued",
];
pub const ENVOY_KEYS: &[&str] = &[
    "endpoints",
    "destinationHeader",
    "fallbackCount",
    "maxBodyWaitMs",
];
pub const DEFAULT_DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
pub const DEFAULT_MAX_BODY_BYTES: u64 = 10 * 1024 * 1024;
pub const DEFAULT_LEASE_TTL_S: u64 = 600;
/// Plain Envoy: how long a request is held for its body before it is balanced without it
/// (docs/higress-abi.md §10: without `allow_on_headers_stop_iteration` the body never comes).
pub const DEFAULT_MAX_BODY_WAIT_MS: u64 = 1000;

/// The shared settings of an endpoint policy.
#[derive(Debug, Clone)]
pub struct Common {
    /// `ailb` by default: keys are `<prefix>:{<route>|<cluster>}:<name>`.
    pub key_prefix: String,
    pub lease_ttl_ms: u64,
    pub cost: CostMode,
    /// `maxRequestCount`: cap on an endpoint's load (0 = none); 429 when every endpoint is at it.
    pub max_load: u64,
    pub failure_mode: FailureMode,
    pub debug_header: Option<String>,
    pub max_body_bytes: usize,
    /// Plain Envoy: the longest a request is held waiting for its body (0: no limit, the
    /// Higress build, where the host always delivers the body of a held request).
    pub max_body_wait_ms: u64,
    pub detail_log: bool,
    /// Priority classes (docs/sessions-and-queues.md "Priority classes"); None: every request alike.
    pub priority: Option<Priority>,
    /// The waiting queue (docs/sessions-and-queues.md "Waiting queue"); None: refuse at once.
    pub queue: Option<Queue>,
    /// `maxPoolRequests`: cap on the load summed over every endpoint (0 = none).
    pub max_pool: u64,
    /// Tenant fairness (docs/sessions-and-queues.md "Tenant fairness"); None: off.
    pub fairness: Option<std::rc::Rc<super::fairness::Fairness>>,
    /// Failure memory (global_least_request, prefix_cache; `config/ejection.rs`): off for the
    /// other policies.
    pub ejection: Ejection,
    /// Data-parallel ranks (global_least_request, prefix_cache; `config/data_parallel.rs`):
    /// off for the other policies.
    pub dp: DataParallel,
}

impl Common {
    /// What a policy whose keys these are not (cluster policies) gets.
    pub fn defaults() -> Common {
        Common {
            key_prefix: "ailb".into(),
            lease_ttl_ms: DEFAULT_LEASE_TTL_S * 1000,
            cost: CostMode::Requests,
            max_load: 0,
            failure_mode: FailureMode::Allow,
            debug_header: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES as usize,
            max_body_wait_ms: 0,
            detail_log: true,
            priority: None,
            queue: None,
            max_pool: 0,
            fairness: None,
            ejection: Ejection::OFF,
            dp: DataParallel::OFF,
        }
    }
}

/// Letters, digits, '-' and '_': what a header name config key accepts.
pub fn is_header_name(h: &str) -> bool {
    !h.is_empty()
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl TryFrom<In<'_, '_, RawLbConfig>> for Common {
    type Error = ConfigError;

    fn try_from(i: In<'_, '_, RawLbConfig>) -> Result<Common, ConfigError> {
        let (raw, r) = (i.raw, i.r);
        let max_request_count = r
            .int("maxRequestCount", &raw.max_request_count)
            .unwrap_or(0);
        if max_request_count < 0 {
            r.warn(
                "maxRequestCount",
                "negative: no cap (as in Higress, where <= 0 is unlimited)",
            );
        }
        // Read for its warnings only: the membership sync (docs/redis-data-model.md §3) already drops endpoints
        // that left the cluster, which is all Higress's periodic clean-up did.
        let _ = r.int("cleanInterval", &raw.clean_interval);
        let detail_log = r
            .bool("enableDetailLog", &raw.enable_detail_log)
            .unwrap_or(true);

        let lease_ttl_s = r
            .own("leaseTTL", &raw.lease_ttl)?
            .unwrap_or(DEFAULT_LEASE_TTL_S);
        if !(1..=86_400).contains(&lease_ttl_s) {
            return Err(r.err("leaseTTL", format!("{lease_ttl_s} s is outside 1-86400")));
        }
        let cost = match r.own("costMode", &raw.cost_mode)?.as_deref() {
            None | Some("requests") => CostMode::Requests,
            Some("bytes") => CostMode::Bytes,
            Some("tokens") => CostMode::Tokens,
            Some(other) => {
                return Err(r.err(
                    "costMode",
                    format!("unknown value `{other}` (requests, bytes, tokens)"),
                ))
            }
        };
        let failure_mode = match r.own("failureMode", &raw.failure_mode)?.as_deref() {
            None | Some("allow") => FailureMode::Allow,
            Some("deny") => FailureMode::Deny,
            Some(other) => {
                return Err(r.err(
                    "failureMode",
                    format!("unknown value `{other}` (allow, deny)"),
                ))
            }
        };
        let debug_header = r.own("debugHeader", &raw.debug_header)?;
        if debug_header.as_deref().is_some_and(|h| !is_header_name(h)) {
            return Err(r.err(
                "debugHeader",
                "must be a header name (letters, digits, '-', '_')",
            ));
        }
        let max_body_bytes = r
            .own("maxBodyBytes", &raw.max_body_bytes)?
            .unwrap_or(DEFAULT_MAX_BODY_BYTES);
        if max_body_bytes == 0 || max_body_bytes > 1 << 30 {
            return Err(r.err("maxBodyBytes", "must be between 1 and 1073741824"));
        }
        let max_body_wait_ms =
            match (i.build, r.own("maxBodyWaitMs", &raw.max_body_wait_ms)?) {
                (Build::Higress, Some(_)) => return Err(r.err(
                    "maxBodyWaitMs",
                    "only in the plain-Envoy build (Higress always delivers a held request's body)",
                )),
                (Build::Higress, None) => 0,
                (Build::Envoy, None) => DEFAULT_MAX_BODY_WAIT_MS,
                (Build::Envoy, Some(ms)) if (10..=600_000).contains(&ms) => ms,
                (Build::Envoy, Some(ms)) => {
                    return Err(r.err("maxBodyWaitMs", format!("{ms} ms is outside 10-600000")))
                }
            };
        let key_prefix = r
            .own("redisKeyPrefix", &raw.redis_key_prefix)?
            .unwrap_or_else(|| "ailb".to_string());
        if key_prefix.is_empty()
            || !key_prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return Err(r.err(
                "redisKeyPrefix",
                "must be non-empty letters, digits, '-', '_' or '.'",
            ));
        }
        let (max_pool, fairness) = super::fairness::read(raw, r)?;
        if fairness
            .as_ref()
            .is_some_and(|f| !is_header_name(&f.header))
        {
            return Err(r.err(
                "tenantHeader",
                "must be a header name (letters, digits, '-', '_')",
            ));
        }
        if fairness.is_some() && max_pool == 0 && max_request_count <= 0 {
            return Err(r.err(
                "tenantHeader",
                "tenant fairness needs `maxPoolRequests` or `maxRequestCount` (the capacity shares are of)",
            ));
        }
        let priority = Priority::read(raw, r)?;
        if let Some(p) = &priority {
            if !is_header_name(&p.header) {
                return Err(r.err(
                    "priorityHeader",
                    "must be a header name (letters, digits, '-', '_')",
                ));
            }
            if max_request_count <= 0 && max_pool == 0 {
                return Err(r.err(
                    "priorityHeader",
                    "priority classes need `maxRequestCount` or `maxPoolRequests` (the caps classes are refused against)",
                ));
            }
            if max_request_count > 0
                && i64::try_from(p.reserve).map_or(true, |v| v >= max_request_count)
            {
                return Err(r.err(
                    "priorityReserve",
                    "must be below `maxRequestCount` (the lowest class would never be admitted)",
                ));
            }
            if max_pool > 0 && p.reserve >= max_pool {
                return Err(r.err(
                    "priorityReserve",
                    "must be below `maxPoolRequests` (the lowest class would never be admitted)",
                ));
            }
        }
        let queue = Queue::read(raw, r)?;
        Ok(Common {
            priority,
            queue,
            max_pool,
            fairness: fairness.map(std::rc::Rc::new),
            key_prefix,
            lease_ttl_ms: lease_ttl_s * 1000,
            cost,
            max_load: u64::try_from(max_request_count).unwrap_or(0),
            failure_mode,
            debug_header: debug_header.map(|h| h.to_ascii_lowercase()),
            max_body_bytes: max_body_bytes as usize,
            max_body_wait_ms,
            detail_log,
            ejection: Ejection::OFF,
            dp: DataParallel::OFF,
        })
    }
}

/// The plain-Envoy keys: `endpoints` (required there) and
/// `destinationHeader`/`fallbackCount`. The Higress build takes its endpoints from the host
/// and refuses them.
pub fn publish(i: In<'_, '_, RawLbConfig>) -> Result<(Vec<String>, Publish), ConfigError> {
    let (raw, r) = (i.raw, i.r);
    let endpoints = r.own("endpoints", &raw.endpoints)?;
    let header = r.own("destinationHeader", &raw.destination_header)?;
    let fallbacks = r.own("fallbackCount", &raw.fallback_count)?;
    if i.build == Build::Higress {
        for (key, set) in [
            ("endpoints", endpoints.is_some()),
            ("destinationHeader", header.is_some()),
            ("fallbackCount", fallbacks.is_some()),
        ] {
            if set {
                return Err(r.err(
                    key,
                    "only in the plain-Envoy build (Higress gives the endpoints and the override call)",
                ));
            }
        }
        return Ok((Vec::new(), Publish::OverrideHost));
    }
    let mut endpoints = endpoints.unwrap_or_default();
    if endpoints.is_empty() {
        return Err(r.err(
            "endpoints",
            "missing: the plain-Envoy build needs the pods as [\"ip:port\", ...]",
        ));
    }
    for (n, e) in endpoints.iter().enumerate() {
        if !is_endpoint(e) {
            return Err(r.err(&format!("endpoints[{n}]"), format!("`{e}` is not ip:port")));
        }
    }
    endpoints.sort_unstable();
    endpoints.dedup();
    let name = header.unwrap_or_else(|| DEFAULT_DESTINATION_HEADER.to_string());
    if !is_header_name(&name) {
        return Err(r.err(
            "destinationHeader",
            "must be a header name (letters, digits, '-', '_')",
        ));
    }
    let fallbacks = fallbacks.unwrap_or(2);
    if fallbacks > 16 {
        return Err(r.err("fallbackCount", "at most 16"));
    }
    Ok((
        endpoints,
        Publish::Header {
            name: name.to_ascii_lowercase(),
            fallbacks: fallbacks as usize,
        },
    ))
}

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
