//! What the scheduler ([`super::scheduler`]) takes and answers: the candidates with their
//! metrics, what the request needs, the policy settings, and the decision.

use super::engines::EndpointMetrics;

/// One upstream endpoint as the plugin sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// `ip:port`.
    pub addr: String,
    /// Latest snapshot; `None` when never scraped, scrape failed, stale or unknown engine.
    pub metrics: Option<EndpointMetrics>,
    /// Requests this proxy sent to the endpoint since the snapshot was taken.
    pub in_flight_since_scrape: u32,
}

/// What the scheduler needs from the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestInfo<'a> {
    pub model: &'a str,
    /// LoRA adapter named by `model`, if it names one.
    pub lora_adapter: Option<&'a str>,
    /// May be rejected with 429 under saturation (GIE "sheddable" criticality).
    pub sheddable: bool,
}

/// `metric_policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetricPolicy {
    /// GIE v0 filter tree (docs/model-server-metrics.md §3.1).
    #[default]
    Default,
    /// Lowest `(max-min)/N` band of the extra (`target_metric`) value, then random (Higress).
    Least,
    /// Highest band of the extra value, then random (Higress).
    Most,
    /// Lowest weighted score, ties random.
    Weighted,
}

/// Weights of [`MetricPolicy::Weighted`]. Score = queue·norm(waiting) + kv·kv_usage +
/// running·norm(running) + in_flight·norm(in-flight), where norm(x) = (x - min)/(max - min)
/// over the eligible pods (0 when all equal) and kv_usage is already 0..1. Lower is better.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weights {
    pub queue: f64,
    pub kv: f64,
    pub running: f64,
    pub in_flight: f64,
}

impl Default for Weights {
    /// queue 2 and KV 2 as GIE's default `queue-scorer`/`kv-cache-utilization-scorer` weights
    /// (docs/model-server-metrics.md §3.2). Running and in-flight are 0: in-flight is already
    /// folded into the effective waiting count, and running is not a GIE default signal.
    fn default() -> Self {
        Self {
            queue: 2.0,
            kv: 2.0,
            running: 0.0,
            in_flight: 0.0,
        }
    }
}

/// Thresholds and knobs; defaults are GIE v0.2+ constants (docs/model-server-metrics.md §3.1)
/// unless noted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SchedulerConfig {
    pub policy: MetricPolicy,
    /// Critical requests first keep pods with waiting < this (GIE `queueingThresholdLoRA` = 128
    /// since v0.2.0; v0.1.0 and Higress's fork used 50).
    pub queueing_threshold_lora: f64,
    /// Saturation queue bound: sheddable requests need waiting <= this (GIE
    /// `queueThresholdCritical` = 5; also the GIE saturation detector's queue default).
    pub queue_threshold_critical: f64,
    /// Saturation KV bound: sheddable requests need KV <= this (GIE `kvCacheThreshold` = 0.8).
    pub kv_cache_threshold: f64,
    /// Probability of preferring pods that already run the adapter over pods with a free LoRA
    /// slot (GIE `loraAffinityThreshold` = 0.999).
    pub lora_affinity_threshold: f64,
    pub weights: Weights,
    /// Higress `rate_limit`: max share of the window's decisions per pod; 1.0 = off.
    pub rate_limit: f64,
    /// Decisions the `rate_limit` window holds (Higress PR #4260 `window_size`; 100).
    pub rate_window: usize,
    /// Oldest decision the window holds, ms (PR #4260 `window_seconds`; `None`: any age, as
    /// Higress's released plugin keeps the last 100 however old).
    pub rate_window_ms: Option<u64>,
    /// Per-pod batch capacity (e.g. vLLM `max_num_seqs`) for the in-flight correction; `None`
    /// (default) = unknown, every in-flight request counts as queued.
    pub max_running_hint: Option<u32>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            policy: MetricPolicy::Default,
            queueing_threshold_lora: 128.0,
            queue_threshold_critical: 5.0,
            kv_cache_threshold: 0.8,
            lora_affinity_threshold: 0.999,
            weights: Weights::default(),
            rate_limit: 1.0,
            rate_window: super::rate_limit::WINDOW,
            rate_window_ms: None,
            max_running_hint: None,
        }
    }
}

/// Outcome of one selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Route to `candidates[index]`; `rate_limited` when the rate limit moved the pick.
    Pick { index: usize, rate_limited: bool },
    /// Sheddable request and every pod is saturated: answer 429.
    Shed,
    /// No candidate has usable metrics (or none has the target metric): fall back.
    NoMetrics,
    /// Empty candidate list.
    NoCandidates,
}
