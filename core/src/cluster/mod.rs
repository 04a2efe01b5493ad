//! Higress's cluster-level policies (`lb_type: cluster`), decision logic only: no host calls,
//! deterministic given the inputs and an rng. Both policies pick one Envoy cluster name per
//! request; the glue writes it into `cluster_header` (default `x-higress-target-cluster`), which
//! the route's `cluster_header` action follows. Facts, with file and line references into the
//! Go source: docs/higress-cluster-policies.md.
//!
//! * `cluster_hash` ([`hash`]): FNV-1a 32 of the `hash_header` value, modulo 100, indexes 100
//!   slots filled by weight in list order (weights must be positive and sum to exactly 100). A
//!   missing or empty header is answered 403 `hash header required`. Same header value → same
//!   slot as Higress, so a mixed fleet agrees (docs/higress-cluster-policies.md §2). Higress PR
//!   #3921's `key` block takes the key from a header, a cookie ([`cookie`]), a JSON body field
//!   ([`json_path`]) or a Wasm property instead; a request without it is answered 403
//!   `hash key required`.
//! * `cluster_metrics` ([`stats`], [`select`]): per-service in-flight and selection counts, rings
//!   of the last `queue_size` TTFT and total-latency samples (ms), EWMAs and error counters for
//!   `AdaptiveScore`. Modes `LeastBusy`, `LeastTotalLatency`, `LeastFirstTokenLatency` sweep from
//!   a random start and skip services whose share of selections reached `rate_limit`;
//!   `AdaptiveScore` filters by rate limit and failure cooldown, samples `p2c_choices` services,
//!   and takes the lowest latency × load × error score. Any other `mode` is a uniform random
//!   pick. It never rejects a request: every filter falls back to the unfiltered set
//!   (docs/higress-cluster-policies.md §3).
//!
//! Higress keeps this state per config instance and per worker VM; [`stats::table::ServiceTable`] has a
//! line codec so the caller may instead keep it in proxy-wide shared data.

pub mod cookie;
pub mod hash;
pub mod json_path;
pub mod select;
pub mod stats;

/// Header the chosen cluster is written to when `cluster_header` is empty or absent.
pub const DEFAULT_CLUSTER_HEADER: &str = "x-higress-target-cluster";
/// `cluster_hash`'s key header when `hash_header` is empty or absent.
pub const DEFAULT_HASH_HEADER: &str = "x-mse-consumer";

/// `cluster_metrics` defaults (docs/higress-cluster-policies.md §3.1).
pub const DEFAULT_RATE_LIMIT: f64 = 1.0;
pub const DEFAULT_QUEUE_SIZE: i64 = 100;
pub const DEFAULT_EWMA_BETA: f64 = 0.5;
pub const DEFAULT_P2C_CHOICES: usize = 2;
pub const DEFAULT_TTFT_WEIGHT: f64 = 0.7;
pub const DEFAULT_TOTAL_LATENCY_WEIGHT: f64 = 0.3;
pub const DEFAULT_ERROR_PENALTY: f64 = 3.0;
pub const DEFAULT_FAILURE_COOLDOWN_MS: i64 = 30_000;
/// The only `metrics_missing_policy` Higress knows; every other value is replaced by it.
pub const METRICS_MISSING_LEAST_BUSY: &str = "least_busy";
pub const DEFAULT_GLOBAL_INFLIGHT_KEY_PREFIX: &str = "higress:adaptive_score_inflight";
pub const DEFAULT_GLOBAL_INFLIGHT_TIMEOUT_MS: i64 = 3000;
pub const DEFAULT_GLOBAL_INFLIGHT_KEY_TTL_S: i64 = 1800;
/// A ring created with a non-positive capacity gets this many slots (Go `NewFixedQueue`).
const RING_FALLBACK_CAPACITY: usize = 16;

/// `cluster_metrics` `mode`, matched exactly (case-sensitive) as Go does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    LeastBusy,
    LeastTotalLatency,
    LeastFirstTokenLatency,
    AdaptiveScore,
    /// Any other value, including absent: Go keeps its uniformly random starting candidate.
    Random,
}

impl Mode {
    pub fn from_higress(mode: &str) -> Mode {
        match mode {
            "LeastBusy" => Mode::LeastBusy,
            "LeastTotalLatency" => Mode::LeastTotalLatency,
            "LeastFirstTokenLatency" => Mode::LeastFirstTokenLatency,
            "AdaptiveScore" => Mode::AdaptiveScore,
            _ => Mode::Random,
        }
    }

    /// Samples to keep per latency ring: only the Least*Latency modes read ring means, so the
    /// others keep none. Go fills its rings in every mode, but nothing reads them there; an
    /// empty ring keeps the shared-data record a few hundred bytes instead of ~5 KB, which
    /// every request copies in and out three times (docs/higress-cluster-policies.md §6.1).
    pub fn ring_capacity(self, params: &MetricsParams) -> usize {
        match self {
            Mode::LeastTotalLatency | Mode::LeastFirstTokenLatency => params.ring_capacity(),
            Mode::LeastBusy | Mode::AdaptiveScore | Mode::Random => 0,
        }
    }

    /// The Go spelling (`Random` has none; Go's global in-flight key uses the mode string).
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::LeastBusy => "LeastBusy",
            Mode::LeastTotalLatency => "LeastTotalLatency",
            Mode::LeastFirstTokenLatency => "LeastFirstTokenLatency",
            Mode::AdaptiveScore => "AdaptiveScore",
            Mode::Random => "",
        }
    }
}

/// The `cluster_metrics` numbers the decision and the statistics need, already defaulted and
/// validated by the config parser (docs/higress-cluster-policies.md §4.1 has the rules).
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsParams {
    /// Highest share of all selections a service may have and still be preferred.
    pub rate_limit: f64,
    /// Weight of the old value in the EWMAs, in [0, 1].
    pub ewma_beta: f64,
    /// Services sampled by `AdaptiveScore`; 0 is read as the default, as Go reads ≤ 0.
    pub p2c_choices: usize,
    pub ttft_weight: f64,
    pub total_latency_weight: f64,
    pub error_penalty: f64,
    pub failure_cooldown_ms: i64,
    /// Samples kept per latency ring; see [`MetricsParams::ring_capacity`].
    pub queue_size: i64,
    /// Ours: AdaptiveScore's capacity-aware score (`select::adaptive_scores`); None = Go's.
    pub inflight_capacity: Option<u64>,
}

impl Default for MetricsParams {
    fn default() -> Self {
        MetricsParams {
            rate_limit: DEFAULT_RATE_LIMIT,
            ewma_beta: DEFAULT_EWMA_BETA,
            p2c_choices: DEFAULT_P2C_CHOICES,
            ttft_weight: DEFAULT_TTFT_WEIGHT,
            total_latency_weight: DEFAULT_TOTAL_LATENCY_WEIGHT,
            error_penalty: DEFAULT_ERROR_PENALTY,
            failure_cooldown_ms: DEFAULT_FAILURE_COOLDOWN_MS,
            queue_size: DEFAULT_QUEUE_SIZE,
            inflight_capacity: None,
        }
    }
}

impl MetricsParams {
    /// Ring capacity for `queue_size`: 0 means the default 100 (Go's parser), a negative value
    /// 16 (Go's ring constructor). A capacity beyond `usize` cannot fill up anyway.
    pub fn ring_capacity(&self) -> usize {
        match self.queue_size {
            0 => ring_len(DEFAULT_QUEUE_SIZE),
            n if n < 0 => RING_FALLBACK_CAPACITY,
            n => ring_len(n),
        }
    }

    pub(crate) fn p2c(&self) -> usize {
        if self.p2c_choices == 0 {
            DEFAULT_P2C_CHOICES
        } else {
            self.p2c_choices
        }
    }
}

fn ring_len(n: i64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_matches_exactly_and_everything_else_is_random() {
        for m in [
            Mode::LeastBusy,
            Mode::LeastTotalLatency,
            Mode::LeastFirstTokenLatency,
            Mode::AdaptiveScore,
        ] {
            assert_eq!(Mode::from_higress(m.as_str()), m);
        }
        for other in [
            "",
            "leastbusy",
            "LeastBusy ",
            "adaptive_score",
            "RoundRobin",
        ] {
            assert_eq!(Mode::from_higress(other), Mode::Random, "{other:?}");
        }
    }

    #[test]
    fn ring_capacity_follows_go_for_zero_and_negative_queue_size() {
        let with = |queue_size| MetricsParams {
            queue_size,
            ..MetricsParams::default()
        };
        assert_eq!(with(0).ring_capacity(), 100);
        assert_eq!(with(-1).ring_capacity(), 16);
        assert_eq!(with(1).ring_capacity(), 1);
        assert_eq!(with(250).ring_capacity(), 250);
        assert_eq!(MetricsParams::default().ring_capacity(), 100);
    }

    #[test]
    fn only_the_latency_modes_keep_rings() {
        let p = MetricsParams::default();
        assert_eq!(Mode::LeastTotalLatency.ring_capacity(&p), 100);
        assert_eq!(Mode::LeastFirstTokenLatency.ring_capacity(&p), 100);
        for mode in [Mode::LeastBusy, Mode::AdaptiveScore, Mode::Random] {
            assert_eq!(mode.ring_capacity(&p), 0, "{mode:?}");
        }
    }

    #[test]
    fn zero_p2c_choices_reads_as_the_default() {
        let p = MetricsParams {
            p2c_choices: 0,
            ..MetricsParams::default()
        };
        assert_eq!(p.p2c(), 2);
        let p = MetricsParams {
            p2c_choices: 5,
            ..MetricsParams::default()
        };
        assert_eq!(p.p2c(), 5);
    }
}
