//! Model-server engines: detection from the metric names present, and mapping of their families
//! to one normalised [`EndpointMetrics`] snapshot per endpoint.
//!
//! Names are from docs/model-server-metrics.md §1 (vLLM §1.1, SGLang §1.2, TRT-LLM/TGI §1.3,
//! GIE protocol §1.4); what is read from each, §2. Matching is always on exact series names.
//!
//! Mapping a page to a snapshot (how the series of a family aggregate, when a value is unknown)
//! is in the `map` submodule.

pub use super::names::ModelServer;
use super::names::{SPECS, WANTED};
use super::prom::{self, Exposition, ParseStats};
pub use super::read::{Aggregation, Unknown, UnknownValue};

mod map;
use map::map_noting;
pub use map::{lora_info, map_exposition};

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
    /// Values read as unknown, at most [`super::read::MAX_NOTES`], each named once.
    pub unknown: Vec<UnknownValue>,
}

/// Filter for [`prom::parse_filtered`]: true for every series name some engine mapping reads,
/// plus `extra` (a configured `target_metric`). Called once per line, so it is a binary search.
pub fn is_wanted(name: &str, extra: Option<&str>) -> bool {
    extra == Some(name) || WANTED.binary_search(&name).is_ok()
}

/// ModelServer whose queue or running family is present; else the engine any mapped family belongs
/// to (so a page with only `vllm:cache_config_info` reports `NoLoadMetrics(Vllm)`).
pub fn detect_engine(expo: &Exposition) -> Option<ModelServer> {
    let by_load = SPECS.iter().find(|sp| {
        sp.waiting
            .iter()
            .chain(sp.running)
            .any(|x| expo.has(x.name))
    });
    let by_any = || {
        expo.samples.iter().find_map(|smp| {
            SPECS
                .iter()
                .find(|sp| is_wanted(&smp.name, None) && smp.name.starts_with(prefix(sp.engine)))
        })
    };
    by_load.or_else(by_any).map(|sp| sp.engine)
}

fn prefix(e: ModelServer) -> &'static str {
    match e {
        ModelServer::Vllm => "vllm:",
        ModelServer::Sglang => "sglang:",
        ModelServer::TritonTrtLlm => "nv_trt_llm_",
        ModelServer::TrtllmServe => "trtllm_",
        ModelServer::Tgi => "tgi_",
    }
}

/// Parse-and-map for one scrape body, reading only the families the mappings need.
pub fn scrape(
    body: &[u8],
    extra: Option<&ExtraMetric>,
) -> (Result<EndpointMetrics, MapError>, ParseStats) {
    let out = scrape_page(body, prom::MAX_INPUT_BYTES, extra);
    (out.result, out.stats)
}

/// [`scrape`] for a body its producer cuts at `cut_at` bytes (the scraper's read limit,
/// Higress's health-check body limit): see [`prom::parse_page`]. A JSON body is refused as
/// [`MapError::NotPrometheus`] without parsing.
pub fn scrape_page(body: &[u8], cut_at: usize, extra: Option<&ExtraMetric>) -> Scrape {
    if looks_like_json(body) {
        return Scrape {
            result: Err(MapError::NotPrometheus),
            stats: ParseStats::default(),
            unknown: Vec::new(),
        };
    }
    let extra_name = extra.map(|x| x.name.as_str());
    let expo = prom::parse_page(body, cut_at, |n| is_wanted(n, extra_name));
    let (result, unknown) = map_noting(&expo, extra);
    Scrape {
        result,
        stats: expo.stats,
        unknown,
    }
}

/// A Prometheus text line starts with a metric name, `#` or whitespace, never with `{` or `[`,
/// which every JSON document (object or array) does.
pub fn looks_like_json(body: &[u8]) -> bool {
    let body = body.strip_prefix(b"\xef\xbb\xbf").unwrap_or(body);
    matches!(
        body.iter().find(|b| !b.is_ascii_whitespace()),
        Some(b'{' | b'[')
    )
}

#[cfg(test)]
mod tests;
