//! What prefix_cache adds to the endpoint scripts: its chain and token gate in an acquire, and
//! the batched first-bytes call (docs/redis-data-model.md §5, §13).

use crate::config::{PrefillRate, TokenGate};

/// A prompt's prefix chain as the acquire sends it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixChain {
    /// Full Redis keys of the chain from the anchor block on, shortest prefix first.
    pub keys: Vec<String>,
    /// The prompt's tokens (estimate) up to the end of each key's block.
    pub cached_tokens: Vec<u64>,
    /// The prompt's tokens (estimate).
    pub prompt_tokens: u64,
    /// A streamed request: its first response bytes time the prefill.
    pub stream: bool,
}

/// What a prefix_cache pick adds to an acquire.
#[derive(Debug, Clone)]
pub struct PrefixArgs<'a> {
    pub chain: &'a PrefixChain,
    pub ttl_s: u64,
    pub max_imbalance: u64,
    pub max_imbalance_ratio: f64,
    pub gate: TokenGate,
    /// Latency-aware placement (§15); None: the token gate.
    pub latency: Option<LatencyArgs>,
}

/// What latency-aware placement adds to a prefix_cache acquire: the request's objectives
/// (0: none) and whether it may be shed for a predicted miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LatencyArgs {
    pub slo_ttft_ms: u64,
    pub slo_tpot_ms: u64,
    pub sheddable: bool,
}

impl PrefixArgs<'_> {
    /// ARGV[18..] of prefix_acquire.lua, before the endpoint list: exactly one token figure
    /// per chain key, as the script counts them.
    pub(super) fn gate_args(&self) -> Vec<String> {
        let g = &self.gate;
        let cached = &self.chain.cached_tokens;
        let per_key = (0..self.chain.keys.len()).map(|i| cached.get(i).copied().unwrap_or(0));
        [
            self.chain.prompt_tokens.to_string(),
            g.threshold.to_string(),
            g.penalty_ms.to_string(),
            g.start_rate().to_string(),
            u8::from(g.rate == PrefillRate::Learned).to_string(),
        ]
        .into_iter()
        .chain(per_key.map(|t| t.to_string()))
        .collect()
    }
}

impl PrefixArgs<'_> {
    /// ARGV[24..27] of prefix_acquire.lua.
    pub(super) fn latency_args(&self) -> Vec<String> {
        let l = self.latency.unwrap_or_default();
        vec![
            u8::from(self.latency.is_some()).to_string(),
            l.slo_ttft_ms.to_string(),
            l.slo_tpot_ms.to_string(),
            u8::from(l.sheddable).to_string(),
        ]
    }
}

/// The lease id a booking is filed under: the lease member's first part (`lease_member`).
pub fn lease_id(request_id: &str, tenant: Option<&str>) -> String {
    match tenant {
        Some(t) => format!("{request_id}~{t}"),
        None => request_id.to_string(),
    }
}
