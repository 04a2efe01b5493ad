//! `prefix_cache` keys: Higress's `redisKeyTTL` (read as Go reads it), plus how prompts are cut
//! into blocks and how much imbalance an affinity may cost (ours, strict).

use super::error::ConfigError;
use super::raw::RawLbConfig;
use super::read::In;
use crate::prefix::CanonConfig;

pub const PREFIX_KEYS: &[&str] = &[
    "redisKeyTTL",
    "blockChunkBytes",
    "maxBlocks",
    "affinityMaxImbalance",
    "affinityMaxImbalanceRatio",
];

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
}
