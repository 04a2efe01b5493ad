//! `prefix_cache` keys: Higress's `redisKeyTTL`, plus how prompts are cut into blocks and how
//! much imbalance an affinity may cost.

use super::fields::Fields;
use super::ConfigError;
use crate::prefix::CanonConfig;

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
}

const DEFAULT_TTL_S: u64 = 1800;
const DEFAULT_MAX_IMBALANCE: u64 = 8;
const DEFAULT_MAX_IMBALANCE_RATIO: f64 = 1.5;

pub fn parse(f: &mut Fields<'_>, max_body_bytes: usize) -> Result<PrefixSettings, ConfigError> {
    let ttl_s: u64 = f.get("redisKeyTTL")?.unwrap_or(DEFAULT_TTL_S);
    if !(1..=30 * 86_400).contains(&ttl_s) {
        return Err(ConfigError::new(
            "redisKeyTTL",
            format!("{ttl_s} s is outside 1-2592000"),
        ));
    }
    let defaults = CanonConfig::default();
    let chunk_bytes: u64 = f
        .get("blockChunkBytes")?
        .unwrap_or(defaults.chunk_bytes as u64);
    if chunk_bytes != 0 && !(64..=1 << 20).contains(&chunk_bytes) {
        return Err(ConfigError::new(
            "blockChunkBytes",
            "must be 0 (off) or between 64 and 1048576",
        ));
    }
    let max_blocks: u64 = f.get("maxBlocks")?.unwrap_or(defaults.max_blocks as u64);
    if !(1..=4096).contains(&max_blocks) {
        return Err(ConfigError::new(
            "maxBlocks",
            format!("{max_blocks} is outside 1-4096"),
        ));
    }
    let max_imbalance: u64 = f
        .get("affinityMaxImbalance")?
        .unwrap_or(DEFAULT_MAX_IMBALANCE);
    let ratio: f64 = f
        .get("affinityMaxImbalanceRatio")?
        .unwrap_or(DEFAULT_MAX_IMBALANCE_RATIO);
    if !(1.0..=1000.0).contains(&ratio) {
        return Err(ConfigError::new(
            "affinityMaxImbalanceRatio",
            format!("{ratio} is outside 1.0-1000"),
        ));
    }
    Ok(PrefixSettings {
        ttl_s,
        canon: CanonConfig {
            chunk_bytes: chunk_bytes as usize,
            max_blocks: max_blocks as usize,
            max_body_bytes,
        },
        max_imbalance,
        max_imbalance_ratio: ratio,
    })
}
