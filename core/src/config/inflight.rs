//! `cluster_metrics` AdaptiveScore's global in-flight count: Higress's
//! `global_inflight_*` keys and, when `global_inflight_enabled` is on, its Redis keys. The
//! timeout and TTL are checked even when the count is off, as Go checks them.

use super::common::DEFAULT_LEASE_TTL_S;
use super::error::ConfigError;
use super::raw::RawLbConfig;
use super::read::header_or;
use super::read::Reader;
use super::redis;
use super::values::Build;
use super::values::RedisTarget;

/// Read only when `global_inflight_enabled` is on: the Redis target, and our own `leaseTTL` for
/// the counts' leases (docs/redis-data-model.md §8).
pub const INFLIGHT_REDIS_KEYS: &[&str] = &[
    "serviceFQDN",
    "servicePort",
    "username",
    "password",
    "database",
    "leaseTTL",
];
pub const DEFAULT_INFLIGHT_KEY_PREFIX: &str = "higress:adaptive_score_inflight";

/// AdaptiveScore's Redis-backed in-flight count shared by every gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalInflight {
    /// Timeout = `global_inflight_timeout`.
    pub redis: RedisTarget,
    /// The hash key is `<key_prefix>:<route_name>:AdaptiveScore`.
    pub key_prefix: String,
    /// Refreshed on every selection.
    pub key_ttl_s: u64,
}

pub fn read(
    raw: &RawLbConfig,
    r: &mut Reader<'_>,
    build: Build,
) -> Result<Option<GlobalInflight>, ConfigError> {
    let enabled = r
        .bool("global_inflight_enabled", &raw.global_inflight_enabled)
        .unwrap_or(false);
    let key_prefix = header_or(
        r,
        "global_inflight_key_prefix",
        &raw.global_inflight_key_prefix,
        DEFAULT_INFLIGHT_KEY_PREFIX,
    );
    let timeout = r.int_or(
        "global_inflight_timeout",
        &raw.global_inflight_timeout,
        3000,
        " ms",
    );
    if timeout < 0 {
        return Err(r.err_higress(
            "global_inflight_timeout",
            "global_inflight_timeout must be greater than or equal to 0",
        ));
    }
    let ttl = r.int_or(
        "global_inflight_key_ttl",
        &raw.global_inflight_key_ttl,
        1800,
        " s",
    );
    if ttl < 0 {
        return Err(r.err_higress(
            "global_inflight_key_ttl",
            "global_inflight_key_ttl must be greater than or equal to 0",
        ));
    }
    if !enabled {
        return Ok(None);
    }
    let redis = redis::target(raw, r, "global_inflight_timeout", timeout)?;
    if build == Build::Envoy {
        r.warn(
            "global_inflight_enabled",
            "the plain-Envoy build has no Redis: in-flight counts stay per proxy (as in Higress when its Redis init fails)",
        );
        return Ok(None);
    }
    Ok(Some(GlobalInflight {
        redis,
        key_prefix,
        key_ttl_s: u64::try_from(ttl).unwrap_or(1800),
    }))
}

/// `leaseTTL` of the counts' leases (ms), read when the global count is on: a count not given
/// back within it (crashed gateway, a release lost in a Redis failover) is reclaimed.
pub fn lease_ttl_ms(raw: &RawLbConfig, r: &mut Reader<'_>) -> Result<u64, ConfigError> {
    let lease_ttl_s = r
        .own("leaseTTL", &raw.lease_ttl)?
        .unwrap_or(DEFAULT_LEASE_TTL_S);
    if !(1..=86_400).contains(&lease_ttl_s) {
        return Err(r.err("leaseTTL", format!("{lease_ttl_s} s is outside 1-86400")));
    }
    Ok(lease_ttl_s * 1000)
}
