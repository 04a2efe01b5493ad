//! Model-server engines: detection from the metric names present, and mapping of their families
//! to one normalised [`EndpointMetrics`] snapshot per endpoint.
//!
//! Names are from docs/model-server-metrics.md §1 (vLLM §1.1, SGLang §1.2, TRT-LLM/TGI §1.3,
//! GIE protocol §1.4); what is read from each, §2. Matching is always on exact series names.
//!
//! Aggregation across series of one family (data-parallel and multi-model pods):
//! * series are grouped by (`model_name`, `model`, `engine`|`dp_rank`); series inside one group
//!   that differ only by other labels (SGLang `tp_rank`/`pp_rank`, `priority`, extra labels) are
//!   replicas of one scheduler's state, so the group takes their **max**;
//! * queue and running counts are **summed** over groups (a DP pod behind one API server takes
//!   the whole pod's load; GIE instead reads the first series only, docs/model-server-metrics.md
//!   §1.4);
//! * KV usage is the **mean** over groups: the API server's own DP balancer spreads requests over
//!   ranks, so the pod's headroom is the aggregate free cache; max would shed a whole pod for one
//!   hot rank.
//!
//! Non-finite and negative series are ignored; KV usage clamps to 0..=1.

pub use super::names::ModelServer;
use super::names::{s, sl, Sel, SPECS, TRITON_KV, VLLM_LORA, WANTED};
use super::prom::{self, Exposition, ParseStats, Sample};

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

/// How the series of a configured extra metric combine into one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Aggregation {
    /// Max within a DP group, summed over groups (right for counts).
    #[default]
    Sum,
    /// Max within a DP group, mean over groups (right for ratios).
    Mean,
    /// Max over all series.
    Max,
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

/// Maps a parsed page to a snapshot. Optional families (KV, LoRA, prefix, cache config) only
/// ever become `None`.
pub fn map_exposition(
    expo: &Exposition,
    extra: Option<&ExtraMetric>,
) -> Result<EndpointMetrics, MapError> {
    let engine = detect_engine(expo).ok_or(MapError::UnknownEngine)?;
    let spec = SPECS
        .iter()
        .find(|sp| sp.engine == engine)
        .ok_or(MapError::UnknownEngine)?;
    let waiting = first_agg(expo, spec.waiting, Aggregation::Sum);
    let running = first_agg(expo, spec.running, Aggregation::Sum);
    if waiting.is_none() && running.is_none() {
        return Err(MapError::NoLoadMetrics(engine));
    }
    let kv_usage = first_agg(expo, spec.kv, Aggregation::Mean)
        .map(|a| a.value)
        .or_else(|| {
            (engine == ModelServer::TritonTrtLlm)
                .then(|| triton_kv_fallback(expo))
                .flatten()
        })
        .map(|v| v.clamp(0.0, 1.0));
    let prefix_cache_counters = spec.hit_counters.iter().find_map(|(h, q)| {
        let hits = agg(expo, &s(h), Aggregation::Sum)?.value;
        let queries = agg(expo, &s(q), Aggregation::Sum)?.value;
        Some((hits, queries))
    });
    let prefix_hit_rate = first_agg(expo, spec.hit_rate, Aggregation::Mean)
        .map(|a| a.value)
        .filter(|v| *v >= 0.0)
        .or_else(|| prefix_cache_counters.and_then(|(h, q)| (q > 0.0).then_some(h / q)))
        .map(|v| v.clamp(0.0, 1.0));
    let (mut block_size, mut num_gpu_blocks) = match spec.cache_info {
        Some((family, bs, nb)) => cache_info(expo, family, bs, nb),
        None => (None, None),
    };
    block_size = block_size.or_else(|| {
        first_agg(expo, spec.block_size, Aggregation::Max).and_then(|a| to_u32(a.value))
    });
    num_gpu_blocks = num_gpu_blocks.or_else(|| {
        first_agg(expo, spec.num_blocks, Aggregation::Sum).and_then(|a| to_u64(a.value))
    });
    let extra_value =
        extra.and_then(|x| agg_named(expo, &x.name, None, x.aggregation, false).map(|a| a.value));
    let extra_counts_requests = extra.is_some_and(|x| {
        spec.waiting
            .iter()
            .chain(spec.running)
            .any(|sel| sel.label.is_none() && sel.name == x.name)
    });
    Ok(EndpointMetrics {
        engine,
        waiting: waiting.map_or(0.0, |a| a.value.max(0.0)),
        running: running.map_or(0.0, |a| a.value.max(0.0)),
        kv_usage,
        lora: (engine == ModelServer::Vllm)
            .then(|| lora_info(expo))
            .flatten(),
        prefix_hit_rate,
        prefix_cache_counters,
        block_size,
        num_gpu_blocks,
        dp_groups: waiting.or(running).map_or(0, |a| a.groups),
        extra: extra_value,
        extra_counts_requests,
    })
}

/// Parse-and-map for one scrape body, reading only the families the mappings need.
pub fn scrape(
    body: &[u8],
    extra: Option<&ExtraMetric>,
) -> (Result<EndpointMetrics, MapError>, ParseStats) {
    let extra_name = extra.map(|x| x.name.as_str());
    let expo = prom::parse_filtered(body, |n| is_wanted(n, extra_name));
    (map_exposition(&expo, extra), expo.stats)
}

/// Picks the `vllm:lora_requests_info` series with the largest value: the value is the update
/// time and every label combination seen stays exported (docs/model-server-metrics.md §1.1; GIE
/// `getLatestMetric`).
pub fn lora_info(expo: &Exposition) -> Option<LoraInfo> {
    let latest = expo
        .series(VLLM_LORA)
        .filter(|x| !x.value.is_nan())
        .reduce(|best, x| if x.value > best.value { x } else { best })?;
    Some(LoraInfo {
        running: split_list(latest.label("running_lora_adapters")),
        waiting: split_list(latest.label("waiting_lora_adapters")),
        max_lora: latest
            .label("max_lora")
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0),
    })
}

/// Adapter names beyond this are dropped; keeps per-pod state bounded.
const MAX_ADAPTERS: usize = 256;

fn split_list(v: Option<&str>) -> Vec<String> {
    v.unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .take(MAX_ADAPTERS)
        .map(str::to_owned)
        .collect()
}

/// `used / max` blocks for Triton builds without the `fraction` series.
fn triton_kv_fallback(expo: &Exposition) -> Option<f64> {
    let used = agg(
        expo,
        &sl(TRITON_KV, "kv_cache_block_type", "used"),
        Aggregation::Sum,
    )?
    .value;
    let max = agg(
        expo,
        &sl(TRITON_KV, "kv_cache_block_type", "max"),
        Aggregation::Sum,
    )?
    .value;
    (max > 0.0).then_some(used / max)
}

/// Block size and count from the labels of an info gauge (vLLM: one series per DP engine, same
/// config; the first series wins).
fn cache_info(expo: &Exposition, family: &str, bs: &str, nb: &str) -> (Option<u32>, Option<u64>) {
    let Some(first) = expo.series(family).next() else {
        return (None, None);
    };
    let num = |k: &str| first.label(k).and_then(|v| v.trim().parse::<u64>().ok());
    (num(bs).and_then(|v| u32::try_from(v).ok()), num(nb))
}

fn to_u32(v: f64) -> Option<u32> {
    (0.0..=f64::from(u32::MAX)).contains(&v).then_some(v as u32)
}

fn to_u64(v: f64) -> Option<u64> {
    (0.0..1.8e19).contains(&v).then_some(v as u64)
}

#[derive(Debug, Clone, Copy)]
struct Agg {
    value: f64,
    groups: u32,
}

fn first_agg(expo: &Exposition, sels: &[Sel], how: Aggregation) -> Option<Agg> {
    sels.iter().find_map(|sel| agg(expo, sel, how))
}

/// ModelServer families are counts and ratios, so a negative series is garbage (vLLM's -1 "no
/// queries" hit rate included) and is skipped like NaN.
fn agg(expo: &Exposition, sel: &Sel, how: Aggregation) -> Option<Agg> {
    agg_named(expo, sel.name, sel.label, how, true)
}

/// Aggregates the finite series of `name` whose label matches `label` (see the module doc).
fn agg_named(
    expo: &Exposition,
    name: &str,
    label: Option<(&str, &str)>,
    how: Aggregation,
    skip_negative: bool,
) -> Option<Agg> {
    // (group key, max value in group); pods have a handful of groups, so a Vec beats a map.
    let mut groups: Vec<([Option<&str>; 3], f64)> = Vec::new();
    let usable = |x: &&Sample| x.value.is_finite() && !(skip_negative && x.value < 0.0);
    for smp in expo.series(name).filter(usable) {
        if let Some((k, v)) = label {
            if smp.label(k) != Some(v) {
                continue;
            }
        }
        let key = group_key(smp);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, best)) => *best = best.max(smp.value),
            None => groups.push((key, smp.value)),
        }
    }
    let n = groups.len();
    if n == 0 {
        return None;
    }
    let sum: f64 = groups.iter().map(|(_, v)| v).sum();
    let value = match how {
        Aggregation::Sum => sum,
        Aggregation::Mean => sum / n as f64,
        Aggregation::Max => groups
            .iter()
            .map(|(_, v)| *v)
            .fold(f64::NEG_INFINITY, f64::max),
    };
    Some(Agg {
        value,
        groups: u32::try_from(n).unwrap_or(u32::MAX),
    })
}

fn group_key(smp: &Sample) -> [Option<&str>; 3] {
    [
        smp.label("model_name"),
        smp.label("model"),
        smp.label("engine").or_else(|| smp.label("dp_rank")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(text: &str) -> Result<EndpointMetrics, MapError> {
        scrape(text.as_bytes(), None).0
    }

    fn approx(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    /// vLLM V1 with two data-parallel engines (labels sorted as prometheus_client does).
    const VLLM_V1_DP: &str = r#"# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
vllm:num_requests_running{engine="1",model_name="llama"} 5.0
vllm:num_requests_waiting{engine="0",model_name="llama"} 2.0
vllm:num_requests_waiting{engine="1",model_name="llama"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 0.6
vllm:gpu_cache_usage_perc{engine="0",model_name="llama"} 0.99
vllm:prefix_cache_queries_total{engine="0",model_name="llama"} 1000.0
vllm:prefix_cache_queries_created{engine="0",model_name="llama"} 1.75e+09
vllm:prefix_cache_hits_total{engine="0",model_name="llama"} 250.0
vllm:prefix_cache_hits_created{engine="0",model_name="llama"} 1.75e+09
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="33676"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="33676"} 1.0
"#;

    #[test]
    fn vllm_v1_data_parallel_sums_queues_and_averages_kv() {
        let m = map(VLLM_V1_DP).unwrap();
        assert_eq!(m.engine, ModelServer::Vllm);
        assert_eq!(m.waiting, 9.0);
        assert_eq!(m.running, 8.0);
        assert_eq!(m.dp_groups, 2);
        assert!(
            approx(m.kv_usage.unwrap(), 0.4),
            "new name wins over deprecated"
        );
        assert!(approx(m.prefix_hit_rate.unwrap(), 0.25), "_created ignored");
        assert_eq!(m.prefix_cache_counters, Some((250.0, 1000.0)));
        assert_eq!((m.block_size, m.num_gpu_blocks), (Some(16), Some(33676)));
        assert_eq!(m.lora, None, "no LoRA family: None, endpoint still usable");
    }

    #[test]
    fn vllm_multi_model_and_replica_labels() {
        let text = r#"vllm:num_requests_waiting{model_name="a"} 1
vllm:num_requests_waiting{model_name="b"} 2
vllm:num_requests_running{model_name="a",tp_rank="0"} 4
vllm:num_requests_running{model_name="a",tp_rank="1"} 4
vllm:num_requests_running{model_name="b"} NaN
vllm:num_requests_running{model_name="c"} -3
"#;
        let m = map(text).unwrap();
        assert_eq!(m.waiting, 3.0, "model_name series summed");
        assert_eq!(
            m.running, 4.0,
            "replicas max'ed, NaN ignored, negative series skipped"
        );
        assert_eq!(m.kv_usage, None);
    }

    #[test]
    fn vllm_old_kv_name_and_lora_latest_series() {
        let text = r#"vllm:num_requests_waiting{model_name="m"} 0
vllm:gpu_cache_usage_perc{model_name="m"} 1.7
vllm:gpu_prefix_cache_hit_rate{model_name="m"} -1.0
vllm:lora_requests_info{max_lora="4",running_lora_adapters="a, b,",waiting_lora_adapters="c"} 20
vllm:lora_requests_info{max_lora="4",running_lora_adapters="old",waiting_lora_adapters=""} 10
vllm:lora_requests_info{max_lora="4",running_lora_adapters="nan",waiting_lora_adapters=""} NaN
"#;
        let m = map(text).unwrap();
        assert_eq!(m.kv_usage, Some(1.0), "clamped");
        assert_eq!(m.prefix_hit_rate, None, "-1 = no queries yet");
        let l = m.lora.unwrap();
        assert_eq!(l.running, vec!["a", "b"]);
        assert_eq!(l.waiting, vec!["c"]);
        assert_eq!(l.max_lora, 4);
        assert!(l.has_free_slot() && l.is_running("b") && !l.is_running("c") && l.is_waiting("c"));
    }

    #[test]
    fn sglang() {
        let text = r#"# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",engine_type="unified",model_name="q",pp_rank="0",tp_rank="0"} 6.0
sglang:num_running_reqs{dp_rank="1",engine_type="unified",model_name="q",pp_rank="0",tp_rank="0"} 2.0
sglang:num_queue_reqs{dp_rank="0",engine_type="unified",model_name="q",pp_rank="0",tp_rank="0"} 1.0
sglang:num_queue_reqs{dp_rank="1",engine_type="unified",model_name="q",pp_rank="0",tp_rank="0"} 0.0
sglang:token_usage{dp_rank="0",engine_type="unified",model_name="q",pp_rank="0",tp_rank="0"} 0.28
sglang:token_usage{dp_rank="1",engine_type="unified",model_name="q",pp_rank="0",tp_rank="0"} 0.12
sglang:cache_hit_rate{dp_rank="0",model_name="q"} 0.5
sglang:cache_config_info{num_pages="1000",page_size="1"} 1.0
sglang:gen_throughput{model_name="q"} 88.0
"#;
        let m = map(text).unwrap();
        assert_eq!(m.engine, ModelServer::Sglang);
        assert_eq!((m.waiting, m.running, m.dp_groups), (1.0, 8.0, 2));
        assert!(approx(m.kv_usage.unwrap(), 0.2));
        assert_eq!(m.prefix_hit_rate, Some(0.5));
        assert_eq!((m.block_size, m.num_gpu_blocks), (Some(1), Some(1000)));
    }

    #[test]
    fn triton_trt_llm_with_and_without_fraction() {
        let base = r#"nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 3
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 512
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 4
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 2
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 1000
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 250
"#;
        let m = map(base).unwrap();
        assert_eq!(m.engine, ModelServer::TritonTrtLlm);
        assert_eq!((m.waiting, m.running), (2.0, 3.0));
        assert_eq!(m.kv_usage, Some(0.25), "used/max fallback");
        assert_eq!((m.block_size, m.num_gpu_blocks), (Some(64), Some(1000)));
        let with_fraction = format!(
            "{base}nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type=\"fraction\",model=\"tensorrt_llm\",version=\"1\"}} 0.5\n"
        );
        assert_eq!(map(&with_fraction).unwrap().kv_usage, Some(0.5));
        // Pre-2025-04 builds: no `waiting`, no `scheduled`.
        let old = "nv_trt_llm_request_metrics{model=\"tensorrt_llm\",request_type=\"active\",version=\"1\"} 4\n";
        let m = map(old).unwrap();
        assert_eq!((m.waiting, m.running, m.kv_usage), (0.0, 4.0, None));
    }

    #[test]
    fn trtllm_serve_and_tgi() {
        let text = "trtllm_num_requests_waiting 5\ntrtllm_num_requests_running 9\n\
                    trtllm_kv_cache_utilization 0.75\ntrtllm_kv_cache_tokens_per_block 32\n\
                    trtllm_kv_cache_max_blocks 4096\n";
        let m = map(text).unwrap();
        assert_eq!(m.engine, ModelServer::TrtllmServe);
        assert_eq!((m.waiting, m.running, m.kv_usage), (5.0, 9.0, Some(0.75)));
        assert_eq!((m.block_size, m.num_gpu_blocks), (Some(32), Some(4096)));

        let m = map("# TYPE tgi_queue_size gauge\ntgi_queue_size 3\ntgi_batch_current_size 12\n")
            .unwrap();
        assert_eq!(
            (m.engine, m.waiting, m.running, m.kv_usage),
            (ModelServer::Tgi, 3.0, 12.0, None)
        );
    }

    #[test]
    fn unknown_and_load_less_pages() {
        assert_eq!(map(""), Err(MapError::UnknownEngine));
        assert_eq!(
            map("process_cpu_seconds_total 12\nfoo 1\n"),
            Err(MapError::UnknownEngine)
        );
        assert_eq!(
            map("vllm:cache_config_info{block_size=\"16\"} 1\n"),
            Err(MapError::NoLoadMetrics(ModelServer::Vllm))
        );
    }

    #[test]
    fn extra_metric_for_least_most() {
        let x = |name: &str, aggregation| ExtraMetric {
            name: name.to_owned(),
            aggregation,
        };
        let (m, _) = scrape(
            VLLM_V1_DP.as_bytes(),
            Some(&x("vllm:num_requests_waiting", Aggregation::Sum)),
        );
        let m = m.unwrap();
        assert_eq!(m.extra, Some(9.0));
        assert!(m.extra_counts_requests);
        let (m, _) = scrape(
            VLLM_V1_DP.as_bytes(),
            Some(&x("vllm:kv_cache_usage_perc", Aggregation::Max)),
        );
        let m = m.unwrap();
        assert_eq!(m.extra, Some(0.6));
        assert!(!m.extra_counts_requests);
        let text = format!("{VLLM_V1_DP}custom_load{{pod=\"a\"}} 2\ncustom_load{{pod=\"a\"}} 4\n");
        let (m, _) = scrape(text.as_bytes(), Some(&x("custom_load", Aggregation::Mean)));
        assert_eq!(m.unwrap().extra, Some(4.0), "same group → max");
        let (m, _) = scrape(VLLM_V1_DP.as_bytes(), Some(&x("absent", Aggregation::Sum)));
        assert_eq!(m.unwrap().extra, None);
    }

    #[test]
    fn wanted_filter_is_exact() {
        assert!(is_wanted("vllm:num_requests_waiting", None));
        assert!(is_wanted("vllm:lora_requests_info", None));
        assert!(is_wanted("vllm:prefix_cache_hits_total", None));
        assert!(!is_wanted("vllm:prefix_cache_hits_created", None));
        assert!(!is_wanted("vllm:e2e_request_latency_seconds_bucket", None));
        assert!(!is_wanted("my_metric", None));
        assert!(is_wanted("my_metric", Some("my_metric")));
    }
}
