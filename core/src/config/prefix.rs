//! `prefix_cache` keys: Higress's `redisKeyTTL` (read as Go reads it), plus how prompts are cut
//! into blocks, how much imbalance an affinity may cost and, in the plain-Envoy build, how large
//! the per-proxy prefix index may grow, which block a request is hashed by, and the scraped
//! metrics its load guard also reads (ours, strict).

use super::error::ConfigError;
use super::gate::TokenGate;
use super::latency::LatencySettings;
use super::metrics::{saturation_keys, MetricsConfig, DEFAULT_CRITICALITY_HEADER};
use super::raw::RawLbConfig;
use super::read::In;
use super::scrape;
use super::values::{Build, MetricsSource, BYTES_PER_TOKEN};
use crate::model_metrics::SchedulerConfig;
use crate::prefix::local_index;
use crate::prefix::{Anchor, CanonConfig};
use std::rc::Rc;

pub const PREFIX_KEYS: &[&str] = &[
    "redisKeyTTL",
    "blockChunkBytes",
    "blockTokens",
    "maxBlocks",
    "affinityMaxImbalance",
    "affinityMaxImbalanceRatio",
    "localIndexMaxEntries",
    "prefixAnchor",
    "affinityThreshold",
    "maxTTFTPenaltyMs",
    "peakPrefillThroughput",
    "verifyCachedTokens",
    "latencyModel",
];

/// The keys that turn on the plain-Envoy metrics guard: the scraper's and the saturation
/// thresholds, read as endpoint_metrics reads them (`maxRunningHint` only corrects
/// endpoint_metrics' picks, so it is not among them).
pub use super::metrics::SATURATION_SCRAPE_KEYS as GUARD_KEYS;

/// A prefix_cache route's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixSettings {
    /// TTL of prefix keys, refreshed on every hit (`redisKeyTTL`).
    pub ttl_s: u64,
    /// How request bodies become blocks (chunk size, block cap, body cap).
    pub canon: CanonConfig,
    /// Leave the cached endpoint only when it carries more than this much load above the
    /// least-loaded one...
    pub max_imbalance: u64,
    /// ...and more than this many times its load.
    pub max_imbalance_ratio: f64,
    /// Plain-Envoy build: most prefix keys the per-proxy index holds (`localIndexMaxEntries`;
    /// docs/redis-data-model.md §9).
    pub index_max_entries: usize,
    /// The first block whose prefix key is matched and recorded (`prefixAnchor`), in both
    /// builds; in the plain-Envoy build also the block a request is hashed by where the index
    /// knows nothing (docs/redis-data-model.md §5, §9).
    pub anchor: Anchor,
    /// Plain-Envoy build: the scraped engine metrics the load guard also reads (present when
    /// `scrapeCluster` is set): a saturated pod is left and not chosen while another is not.
    pub guard: Option<Rc<MetricsConfig>>,
    /// Sticky until saturated: the token-aware gate (config/gate.rs).
    pub gate: TokenGate,
    /// Compare the engines' `cached_tokens` with each pick's predicted prefix and correct the
    /// index (`verifyCachedTokens`, both builds; docs/redis-data-model.md §5).
    pub verify: bool,
    /// Latency-aware placement (`latencyModel`, config/latency.rs; docs/latency-model.md).
    pub latency: Option<LatencySettings>,
}

const DEFAULT_TTL_S: i64 = 1800;
const DEFAULT_MAX_IMBALANCE: u64 = 8;
const DEFAULT_MAX_IMBALANCE_RATIO: f64 = 1.5;

/// `max_body_bytes` is the route's `maxBodyBytes` (the canonicaliser's body cap).
impl TryFrom<(In<'_, '_, RawLbConfig>, usize)> for PrefixSettings {
    type Error = ConfigError;

    fn try_from(
        (i, max_body_bytes): (In<'_, '_, RawLbConfig>, usize),
    ) -> Result<Self, ConfigError> {
        let (raw, r) = (i.raw, i.r);
        let ttl = r.int_or("redisKeyTTL", &raw.redis_key_ttl, DEFAULT_TTL_S, " s");
        let ttl_s = u64::try_from(ttl).unwrap_or(0).max(1);
        if ttl < 0 {
            r.warn(
                "redisKeyTTL",
                format!(
                    "{ttl} s: Higress's prefix keys then expire at once (no affinity); assumed 1 s"
                ),
            );
        }
        let defaults = CanonConfig::default();
        let chunk_bytes = r
            .own("blockChunkBytes", &raw.block_chunk_bytes)?
            .unwrap_or(defaults.chunk_bytes as u64);
        if chunk_bytes != 0 && !(64..=1 << 20).contains(&chunk_bytes) {
            return Err(r.err(
                "blockChunkBytes",
                "must be 0 (off) or between 64 and 1048576",
            ));
        }
        // The block size in approximate prompt tokens, to match an engine's prefix-cache block
        // (a Mooncake trace's 512-token blocks, docs/trace-bench.md).
        let chunk_bytes = match r.own("blockTokens", &raw.block_tokens)? {
            None => chunk_bytes,
            Some(_) if raw.block_chunk_bytes.is_some() => {
                return Err(r.err(
                    "blockTokens",
                    "set blockTokens or blockChunkBytes, not both",
                ));
            }
            Some(t) if !(16..=262_144).contains(&t) => {
                return Err(r.err("blockTokens", format!("{t} is outside 16-262144")));
            }
            Some(t) => t * BYTES_PER_TOKEN,
        };
        let max_blocks = r
            .own("maxBlocks", &raw.max_blocks)?
            .unwrap_or(defaults.max_blocks as u64);
        if !(1..=4096).contains(&max_blocks) {
            return Err(r.err("maxBlocks", format!("{max_blocks} is outside 1-4096")));
        }
        let max_imbalance = r
            .own("affinityMaxImbalance", &raw.affinity_max_imbalance)?
            .unwrap_or(DEFAULT_MAX_IMBALANCE);
        let ratio = r
            .own(
                "affinityMaxImbalanceRatio",
                &raw.affinity_max_imbalance_ratio,
            )?
            .unwrap_or(DEFAULT_MAX_IMBALANCE_RATIO);
        if !(1.0..=1000.0).contains(&ratio) {
            return Err(r.err(
                "affinityMaxImbalanceRatio",
                format!("{ratio} is outside 1.0-1000"),
            ));
        }
        let index_max_entries = r.own("localIndexMaxEntries", &raw.local_index_max_entries)?;
        if index_max_entries.is_some() && i.build == Build::Higress {
            return Err(r.err(
                "localIndexMaxEntries",
                "only in the plain-Envoy build (Higress keeps prefixes in Redis)",
            ));
        }
        let index_max_entries =
            index_max_entries.unwrap_or(local_index::DEFAULT_MAX_ENTRIES as u64);
        let range = local_index::MIN_MAX_ENTRIES as u64..=local_index::MAX_MAX_ENTRIES as u64;
        if !range.contains(&index_max_entries) {
            return Err(r.err(
                "localIndexMaxEntries",
                format!(
                    "{index_max_entries} is outside {}-{}",
                    range.start(),
                    range.end()
                ),
            ));
        }
        let anchor = match r.own("prefixAnchor", &raw.prefix_anchor)? {
            None => Anchor::default(),
            Some(name) => Anchor::from_name(&name).ok_or_else(|| {
                r.err(
                    "prefixAnchor",
                    format!("unknown value `{name}` ({})", Anchor::NAMES.join(", ")),
                )
            })?,
        };
        let guard = guard(raw, r, i.build)?.map(Rc::new);
        let gate = TokenGate::read(raw, r)?;
        let verify = r
            .own("verifyCachedTokens", &raw.verify_cached_tokens)?
            .unwrap_or(true);
        let latency = LatencySettings::read(raw, r, i.build)?;
        Ok(PrefixSettings {
            ttl_s,
            canon: CanonConfig {
                chunk_bytes: chunk_bytes as usize,
                max_blocks: max_blocks as usize,
                max_body_bytes,
            },
            max_imbalance,
            max_imbalance_ratio: ratio,
            index_max_entries: index_max_entries as usize,
            anchor,
            guard,
            gate,
            verify,
            latency,
        })
    }
}

/// The metrics guard's settings: an endpoint_metrics scrape config (its scraper, snapshot and
/// saturation rule), None when no guard key is set. `scrapeCluster` is then required.
fn guard(
    raw: &RawLbConfig,
    r: &super::read::Reader<'_>,
    build: Build,
) -> Result<Option<MetricsConfig>, ConfigError> {
    let Some(key) = raw.present().into_iter().find(|k| GUARD_KEYS.contains(k)) else {
        return Ok(None);
    };
    if build == Build::Higress {
        return Err(r.err(
            key,
            "only in the plain-Envoy build (Higress's prefix_cache guard is the Redis script's)",
        ));
    }
    let (queue, kv) = saturation_keys(raw, r)?;
    let scrape = scrape::read(raw, r, MetricsSource::Scrape)?;
    Ok(Some(MetricsConfig {
        scheduler: SchedulerConfig {
            queue_threshold_critical: queue,
            kv_cache_threshold: kv,
            ..SchedulerConfig::default()
        },
        extra: None,
        source: MetricsSource::Scrape,
        scrape,
        criticality_header: DEFAULT_CRITICALITY_HEADER.to_string(),
        sheddable_models: Vec::new(),
        host_list_cache_ms: 0,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::read::Reader;
    use crate::config::warning::Warnings;
    use crate::config::{PluginConfig, PolicyConfig};
    use serde_json::json;

    /// The plain-Envoy build's reading of a prefix_cache `lb_config` (the settings step alone).
    fn envoy(lb: serde_json::Value) -> Result<PrefixSettings, ConfigError> {
        let raw = RawLbConfig::from_value(&lb);
        let mut warnings = Warnings::default();
        let mut r = Reader::new("lb_config", &mut warnings);
        let i = In {
            raw: &raw,
            r: &mut r,
            build: Build::Envoy,
        };
        PrefixSettings::try_from((i, 1 << 20))
    }

    #[test]
    fn local_index_max_entries_defaults_and_is_checked() {
        let s = envoy(json!({})).unwrap();
        assert_eq!(s.index_max_entries, local_index::DEFAULT_MAX_ENTRIES);
        let s = envoy(json!({"localIndexMaxEntries": 4096})).unwrap();
        assert_eq!(s.index_max_entries, 4096);
        for (bad, want) in [
            (
                json!(255),
                "localIndexMaxEntries: 255 is outside 256-1048576",
            ),
            (json!(2_000_000), "outside 256-1048576"),
            (json!("4096"), "localIndexMaxEntries: wrong type"),
            (json!(-1), "wrong type"),
        ] {
            let e = envoy(json!({ "localIndexMaxEntries": bad })).unwrap_err();
            assert!(e.to_string().contains(want), "{e}");
        }
    }

    #[test]
    fn local_index_max_entries_is_refused_by_the_higress_build() {
        let cfg = json!({"lb_policy": "prefix_cache", "lb_config": {
            "serviceFQDN": "redis.static", "servicePort": 6379, "localIndexMaxEntries": 4096}});
        let e = PluginConfig::parse_for(cfg.to_string().as_bytes(), Build::Higress).unwrap_err();
        assert!(
            e.to_string().contains("only in the plain-Envoy build"),
            "{e}"
        );
        let cfg = json!({"lb_policy": "prefix_cache", "lb_config": {
            "serviceFQDN": "redis.static", "servicePort": 6379}});
        let g = PluginConfig::parse_for(cfg.to_string().as_bytes(), Build::Higress).unwrap();
        let Some(PolicyConfig::PrefixCache(s)) = g.global.as_ref().map(|c| &c.policy) else {
            panic!("not prefix_cache");
        };
        assert_eq!(s.index_max_entries, local_index::DEFAULT_MAX_ENTRIES);
    }

    #[test]
    fn block_tokens_sets_the_block_size_in_approximate_tokens() {
        assert_eq!(envoy(json!({})).unwrap().canon.chunk_bytes, 4096);
        let s = envoy(json!({"blockTokens": 512})).unwrap();
        assert_eq!(s.canon.chunk_bytes, 512 * BYTES_PER_TOKEN as usize);
        for (lb, want) in [
            (
                json!({"blockTokens": 8}),
                "blockTokens: 8 is outside 16-262144",
            ),
            (json!({"blockTokens": "512"}), "blockTokens: wrong type"),
            (
                json!({"blockTokens": 512, "blockChunkBytes": 2048}),
                "blockTokens: set blockTokens or blockChunkBytes, not both",
            ),
        ] {
            let e = envoy(lb).unwrap_err();
            assert!(e.to_string().contains(want), "{e}");
        }
    }

    #[test]
    fn verify_cached_tokens_is_on_unless_turned_off() {
        assert!(envoy(json!({})).unwrap().verify);
        assert!(!envoy(json!({"verifyCachedTokens": false})).unwrap().verify);
        let e = envoy(json!({"verifyCachedTokens": "no"})).unwrap_err();
        assert!(
            e.to_string().contains("verifyCachedTokens: wrong type"),
            "{e}"
        );
    }
}
