//! A cluster policy's route config (`lb_type: cluster`): its policy keys, the Redis target of
//! cluster_metrics' global in-flight counts, the common settings it needs, and where it
//! publishes (`cluster_header`, in both builds: the route's `cluster_header` action reads it,
//! docs/configuration.md "Cluster policies").

use super::cluster_hash::ClusterHashConfig;
use super::cluster_metrics::{ClusterMetricsConfig, DEFAULT_CLUSTER_HEADER};
use super::common::{Common, DEFAULT_MAX_BODY_WAIT_MS};
use super::error::ConfigError;
use super::hash_key::HashKey;
use super::raw::RawLbConfig;
use super::read::{In, Reader};
use super::types::{PolicyConfig, Publish, RedisTarget};
use super::values::Build;

pub fn compile(
    policy: &str,
    lb: &RawLbConfig,
    r: &mut Reader<'_>,
    build: Build,
) -> Result<(PolicyConfig, Option<RedisTarget>, Common, Publish), ConfigError> {
    let (p, redis) = if policy == "cluster_metrics" {
        let c = ClusterMetricsConfig::try_from(In {
            raw: lb,
            r: &mut *r,
            build,
        })?;
        let redis = c.global_inflight.as_ref().map(|g| g.redis.clone());
        (PolicyConfig::ClusterMetrics(c), redis)
    } else {
        let c = ClusterHashConfig::try_from(In {
            raw: lb,
            r: &mut *r,
            build,
        })?;
        (PolicyConfig::ClusterHash(c), None)
    };
    let name = match &p {
        PolicyConfig::ClusterMetrics(c) => c.cluster_header.clone(),
        PolicyConfig::ClusterHash(c) => c.cluster_header.clone(),
        _ => DEFAULT_CLUSTER_HEADER.to_string(),
    };
    let publish = Publish::ClusterHeader {
        name: name.to_ascii_lowercase(),
    };
    let common = match &p {
        PolicyConfig::ClusterMetrics(c) if c.global_inflight.is_some() => Common {
            lease_ttl_ms: super::inflight::lease_ttl_ms(lb, r)?,
            ..Common::defaults()
        },
        // A body key holds the request for its body, up to the key's limit (Higress PR #3921
        // `max_body_bytes`) and, in plain Envoy, the usual wait for it.
        PolicyConfig::ClusterHash(ClusterHashConfig {
            key: HashKey::Body { max_body_bytes, .. },
            ..
        }) => Common {
            max_body_bytes: usize::try_from(*max_body_bytes).unwrap_or(usize::MAX),
            max_body_wait_ms: match build {
                Build::Higress => 0,
                Build::Envoy => DEFAULT_MAX_BODY_WAIT_MS,
            },
            ..Common::defaults()
        },
        _ => Common::defaults(),
    };
    Ok((p, redis, common, publish))
}
