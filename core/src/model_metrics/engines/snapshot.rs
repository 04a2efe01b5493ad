//! The normalised per-endpoint snapshot every engine's page maps to, and what a scrape yields
//! besides it (parse statistics, why values were unknown, why no snapshot could be made).

use crate::model_metrics::names::ModelServer;
use crate::model_metrics::prom::ParseStats;
use crate::model_metrics::read::{Aggregation, UnknownValue};

/// LoRA state from `vllm:lora_requests_info` (series with the largest value = latest update).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoraInfo {
    /// Adapters with requests in the batch. Current V1 also lists adapters that only have queued
    /// requests here (docs/model-server-metrics.md §1.1, llm-d-router#2605).
    pub running: Vec<String>,
    pub waiting: Vec<String>,
    pub max_lora: u32,
}

impl LoraInfo {
    pub fn is_running(&self, adapter: &str) -> bool {
        self.running.iter().any(|a| a == adapter)
    }

    pub fn is_waiting(&self, adapter: &str) -> bool {
        self.waiting.iter().any(|a| a == adapter)
    }

    /// A new adapter can be loaded without evicting one.
    pub fn has_free_slot(&self) -> bool {
        self.running.len() < self.max_lora as usize
    }
}

/// A raw Prometheus series name to carry along (`target_metric` of `least`/`most`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraMetric {
    pub name: String,
    pub aggregation: Aggregation,
}

/// Normalised per-endpoint snapshot, produced once per scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointMetrics {
    pub engine: ModelServer,
    /// Queued requests (GIE TotalQueuedRequests). 0 if the engine exposes only running.
    pub waiting: f64,
    /// Requests in the running batch (GIE TotalRunningRequests). 0 if not exposed.
    pub running: f64,
    /// KV-cache utilisation, 0..=1.
    pub kv_usage: Option<f64>,
    /// `None` when the pod exposes no LoRA info (LoRA disabled): never disables the endpoint.
    pub lora: Option<LoraInfo>,
    /// Prefix-cache hit rate 0..=1. vLLM V1 has only counters, so this is hits/queries since
    /// start; [`Self::prefix_cache_counters`] lets a caller diff two scrapes instead.
    pub prefix_hit_rate: Option<f64>,
    /// (hits, queries) counters when the engine has them (vLLM V1).
    pub prefix_cache_counters: Option<(f64, f64)>,
    /// KV block size in tokens (vLLM `cache_config_info.block_size`, SGLang `page_size`, TRT-LLM
    /// `tokens_per`), for prefix-scorer autotune.
    pub block_size: Option<u32>,
    /// Number of GPU KV blocks (`num_gpu_blocks`, `num_pages`, TRT-LLM `max`).
    pub num_gpu_blocks: Option<u64>,
    /// Data-parallel groups seen in the queue family (1 for a plain pod).
    pub dp_groups: u32,
    /// Value of the configured [`ExtraMetric`], if present.
    pub extra: Option<f64>,
    /// The extra metric is this engine's waiting or running count, so in-flight correction
    /// applies to it.
    pub extra_counts_requests: bool,
}

/// Why no snapshot could be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapError {
    /// No known engine family present.
    UnknownEngine,
    /// ModelServer recognised (e.g. only `vllm:cache_config_info`) but neither queue nor running.
    NoLoadMetrics(ModelServer),
    /// A load signal (waiting, running, KV use, vLLM sleep state) is unknown: the page was cut
    /// before it, or it is NaN/±Inf or out of range ([`Scrape::unknown`] says which). Read as 0
    /// the pod would look idle, so it is not a candidate until a page reads cleanly.
    LoadUnknown(ModelServer),
    /// vLLM's `engine_sleep_state` says the engine sleeps (weights offloaded or discarded): it
    /// serves nothing until woken, so it is not a candidate.
    Asleep(ModelServer),
    /// The body is JSON, not Prometheus text: trtllm-serve answers `/metrics` with its iteration
    /// statistics in JSON and serves Prometheus text at `/prometheus/metrics`.
    NotPrometheus,
}

/// Everything one metrics text yields.
#[derive(Debug, Clone, PartialEq)]
pub struct Scrape {
    pub result: Result<EndpointMetrics, MapError>,
    pub stats: ParseStats,
    /// Values read as unknown, at most [`crate::model_metrics::read::MAX_NOTES`], each named once.
    pub unknown: Vec<UnknownValue>,
}
