//! `lb_type: cluster`, `lb_policy: cluster_hash`: Higress's keys, defaults and checks (README
//! "Cluster policies" table), Go's error texts. Weights must be positive and sum to exactly
//! 100; there is no normalisation.

use super::cluster_metrics::DEFAULT_CLUSTER_HEADER;
use super::error::ConfigError;
use super::go::Field;
use super::hash_key::{self, HashKey};
use super::raw::RawLbConfig;
use super::read::header_or;
use super::read::In;

pub const CLUSTER_HASH_KEYS: &[&str] = &["hash_header", "key", "cluster_header", "clusters"];
pub const DEFAULT_HASH_HEADER: &str = "x-mse-consumer";

/// One `clusters` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightedCluster {
    pub cluster: String,
    /// 1-100: the entry owns this many of the 100 slots, after the entries before it.
    pub weight: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterHashConfig {
    /// The request header whose value is hashed; a request without it is answered 403.
    pub hash_header: String,
    /// Where the hashed key comes from: `hash_header`, or Higress PR #3921's `key` block.
    pub key: HashKey,
    /// The config has a `key` block: a request without its key is answered 403 `hash key
    /// required` (the PR's text), else `hash header required` (the released plugin's).
    pub key_block: bool,
    pub cluster_header: String,
    /// In list order (slot order); duplicate names allowed, as in Go.
    pub clusters: Vec<WeightedCluster>,
}

impl TryFrom<In<'_, '_, RawLbConfig>> for ClusterHashConfig {
    type Error = ConfigError;

    fn try_from(i: In<'_, '_, RawLbConfig>) -> Result<Self, ConfigError> {
        let (raw, r) = (i.raw, i.r);
        let hash_header = header_or(r, "hash_header", &raw.hash_header, DEFAULT_HASH_HEADER);
        // Read before the other keys, as the PR's Go code does: its errors come first.
        let block = hash_key::read(&raw.key, r, &hash_header)?;
        let key_block = block.is_some();
        let key = block.unwrap_or_else(|| HashKey::Header(hash_header.clone()));
        let cluster_header = header_or(
            r,
            "cluster_header",
            &raw.cluster_header,
            DEFAULT_CLUSTER_HEADER,
        );
        // Unlike other lists, Go requires a real JSON array here (`IsArray`).
        let items = match raw.clusters.as_ref() {
            Some(v) if v.is_array() => v.array().0,
            _ => Vec::new(),
        };
        if items.is_empty() {
            return Err(r.err_higress(
                "clusters",
                "clusters is required and must be a non-empty array",
            ));
        }
        let mut clusters = Vec::with_capacity(items.len());
        let mut total: i64 = 0;
        for (n, item) in items.iter().enumerate() {
            let mut e = r.nested(&format!("clusters[{n}]"));
            let cluster = e
                .string("cluster", &Field(item.get("cluster")))
                .unwrap_or_default();
            if cluster.is_empty() {
                return Err(
                    e.err_higress("cluster", "each entry must have a non-empty cluster field")
                );
            }
            let weight = e.int("weight", &Field(item.get("weight"))).unwrap_or(0);
            if weight <= 0 {
                return Err(e.err_higress(
                    "weight",
                    // Backticks, not `{:?}`: a cluster given as an object is its JSON text,
                    // and only a backtick quote has it elided (config/error.rs).
                    format!("cluster `{cluster}` has invalid weight {weight}, must be > 0"),
                ));
            }
            // Go's int sum wraps; a sum that overflows is refused outright (it could only
            // "wrap to 100" with weights Go would then try to expand into slots).
            total = total.checked_add(weight).ok_or_else(|| {
                r.err_higress(
                    "clusters",
                    "sum of cluster weights must be 100, got an overflowing sum",
                )
            })?;
            clusters.push(WeightedCluster {
                cluster,
                weight: u32::try_from(weight).unwrap_or(u32::MAX),
            });
        }
        if total != 100 {
            return Err(r.err_higress(
                "clusters",
                format!("sum of cluster weights must be 100, got {total}"),
            ));
        }
        Ok(ClusterHashConfig {
            hash_header,
            key,
            key_block,
            cluster_header,
            clusters,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{parse, Build};

    /// Found by `make fuzz` (config): the cluster was quoted with `{:?}`, whose escaped JSON
    /// text of a misplaced block slipped past the elision and showed its password.
    #[test]
    fn a_misplaced_block_as_cluster_name_is_not_quoted() {
        let cfg = br#"{"lb_type":"cluster","lb_policy":"cluster_hash","lb_config":{"clusters":[
            {"weight":100,"cluster":"outbound|80||a.static"},
            {"weight":0,"cluster":{"password":"hunter2-secret"}}]}}"#;
        let e = parse(cfg, Build::Higress).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid configuration: lb_config.clusters[1].weight: cluster `{…}` has invalid \
             weight 0, must be > 0"
        );
    }
}
