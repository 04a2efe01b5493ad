//! prefix_cache's token-aware gate, "sticky until saturated" (docs/redis-data-model.md §13):
//! llm-d's knobs under llm-d's names, strict like every key of ours. The defaults keep
//! Higress's meaning of a match (any known prefix is sticky) and llm-d's TTFT penalty.

use super::error::ConfigError;
use super::raw::RawLbConfig;
use super::read::Reader;

/// What the gate weighs a warm pod against the best cold one with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenGate {
    /// The share of the prompt a match must cover to be sticky (`affinityThreshold`, 0-1).
    /// 0: any match (Higress's prefix_cache); llm-d uses 0.8.
    pub threshold: f64,
    /// Leave the warm pod when its estimated TTFT exceeds the best cold pod's by more than
    /// this (`maxTTFTPenaltyMs`; llm-d's default 5,000 ms).
    pub penalty_ms: u64,
    /// Prefill tokens per second per pod: fixed (`peakPrefillThroughput`), or learned from the
    /// TTFT the plugin measures, starting from [`DEFAULT_PREFILL_RATE`].
    pub rate: PrefillRate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillRate {
    Fixed(u64),
    Learned,
}

/// llm-d's calibrated prefill rate for Qwen3-32B on an H100 pair (16k-20k tokens/s; its b2b
/// setup, ../shared/spec/anchors.md §6): the estimate until a pod's own TTFTs are measured.
pub const DEFAULT_PREFILL_RATE: u64 = 16_000;
const DEFAULT_PENALTY_MS: u64 = 5_000;

impl Default for TokenGate {
    fn default() -> Self {
        TokenGate {
            threshold: 0.0,
            penalty_ms: DEFAULT_PENALTY_MS,
            rate: PrefillRate::Learned,
        }
    }
}

impl TokenGate {
    /// The rate a pod is estimated at before (or instead of) learning.
    pub fn start_rate(&self) -> u64 {
        match self.rate {
            PrefillRate::Fixed(r) => r,
            PrefillRate::Learned => DEFAULT_PREFILL_RATE,
        }
    }

    pub fn read(raw: &RawLbConfig, r: &Reader<'_>) -> Result<TokenGate, ConfigError> {
        let d = TokenGate::default();
        let threshold = r
            .own("affinityThreshold", &raw.affinity_threshold)?
            .unwrap_or(d.threshold);
        if !(0.0..=1.0).contains(&threshold) {
            return Err(r.err("affinityThreshold", format!("{threshold} is outside 0-1")));
        }
        let penalty_ms = r
            .own("maxTTFTPenaltyMs", &raw.max_ttft_penalty_ms)?
            .unwrap_or(d.penalty_ms);
        if !(1..=3_600_000).contains(&penalty_ms) {
            return Err(r.err(
                "maxTTFTPenaltyMs",
                format!("{penalty_ms} is outside 1-3600000"),
            ));
        }
        let rate = match r.own("peakPrefillThroughput", &raw.peak_prefill_throughput)? {
            None => PrefillRate::Learned,
            Some(t) if (1..=100_000_000).contains(&t) => PrefillRate::Fixed(t),
            Some(t) => {
                return Err(r.err(
                    "peakPrefillThroughput",
                    format!("{t} tokens/s is outside 1-100000000"),
                ))
            }
        };
        Ok(TokenGate {
            threshold,
            penalty_ms,
            rate,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::warning::Warnings;
    use serde_json::json;

    fn read(lb: serde_json::Value) -> Result<TokenGate, ConfigError> {
        let raw = RawLbConfig::from_value(&lb);
        let mut warnings = Warnings::default();
        let r = Reader::new("lb_config", &mut warnings);
        TokenGate::read(&raw, &r)
    }

    #[test]
    fn defaults_keep_any_match_sticky_and_learn_the_rate() {
        let g = read(json!({})).unwrap();
        assert_eq!(g, TokenGate::default());
        assert_eq!(g.start_rate(), DEFAULT_PREFILL_RATE);
        let g = read(json!({"affinityThreshold": 0.8, "maxTTFTPenaltyMs": 200,
            "peakPrefillThroughput": 18000}))
        .unwrap();
        assert_eq!(g.threshold, 0.8);
        assert_eq!(g.penalty_ms, 200);
        assert_eq!(g.rate, PrefillRate::Fixed(18000));
        assert_eq!(g.start_rate(), 18000);
    }

    #[test]
    fn bad_values_name_their_field() {
        for (lb, want) in [
            (
                json!({"affinityThreshold": 1.5}),
                "affinityThreshold: 1.5 is outside 0-1",
            ),
            (
                json!({"affinityThreshold": "0.8"}),
                "affinityThreshold: wrong type",
            ),
            (
                json!({"maxTTFTPenaltyMs": 0}),
                "maxTTFTPenaltyMs: 0 is outside",
            ),
            (
                json!({"maxTTFTPenaltyMs": -5}),
                "maxTTFTPenaltyMs: wrong type",
            ),
            (
                json!({"peakPrefillThroughput": 0}),
                "peakPrefillThroughput: 0 tokens/s",
            ),
        ] {
            let e = read(lb).unwrap_err();
            assert!(e.to_string().contains(want), "{e}");
        }
    }
}
