//! Model-server engines: detection from the metric names present, and mapping of their families
//! to one normalised [`EndpointMetrics`] snapshot per endpoint.
//!
//! Names are from docs/model-server-metrics.md §1 (vLLM §1.1, SGLang §1.2, TRT-LLM/TGI §1.3,
//! GIE protocol §1.4); what is read from each, §2. Matching is always on exact series names.
//!
//! Aggregation across series of one family (data-parallel and multi-model pods, details in
//! [`super::read`]): queue and running counts are **summed** over data-parallel groups (a DP pod
//! behind one API server takes the whole pod's load; GIE instead reads the first series only,
//! docs/model-server-metrics.md §1.4); KV usage is the **mean** over groups: the API server's own
//! DP balancer spreads requests over ranks, so the pod's headroom is the aggregate free cache;
//! max would shed a whole pod for one hot rank.
//!
//! A value that cannot be trusted (page cut before it, NaN/±Inf, out of range) is unknown, never
//! 0: an unknown load signal (waiting, running, KV use, vLLM sleep state) makes the pod unknown
//! ([`MapError::LoadUnknown`]), an unknown optional one is `None`. [`Scrape::unknown`] says which
//! and why, for the caller's log.

pub use super::names::ModelServer;
use super::names::{Sel, SPECS, TRITON_KV, VLLM_LORA, VLLM_SLEEP, WANTED};
use super::prom::{self, Exposition, ParseStats};
use super::read::{check, Agg, Range, Read, Reader};
pub use super::read::{Aggregation, Unknown, UnknownValue};

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

/// Maps a parsed page to a snapshot. Optional families (KV on engines without it, LoRA, prefix,
/// cache config, `target_metric`) only ever become `None`.
pub fn map_exposition(
    expo: &Exposition,
    extra: Option<&ExtraMetric>,
) -> Result<EndpointMetrics, MapError> {
    map_noting(expo, extra).0
}

fn sels(
    list: &'static [Sel],
) -> impl Iterator<Item = (&'static str, Option<(&'static str, &'static str)>)> {
    list.iter().map(|x| (x.name, x.label))
}

/// [`map_exposition`], plus why values were unknown.
fn map_noting(
    expo: &Exposition,
    extra: Option<&ExtraMetric>,
) -> (Result<EndpointMetrics, MapError>, Vec<UnknownValue>) {
    let mut r = Reader::new(expo);
    let res = map_with(&mut r, extra);
    (res, r.notes)
}

fn map_with(r: &mut Reader<'_>, extra: Option<&ExtraMetric>) -> Result<EndpointMetrics, MapError> {
    let expo = r.expo;
    let engine = detect_engine(expo).ok_or(MapError::UnknownEngine)?;
    let spec = SPECS
        .iter()
        .find(|sp| sp.engine == engine)
        .ok_or(MapError::UnknownEngine)?;
    let asleep = match engine {
        ModelServer::Vllm => vllm_asleep(r),
        _ => Some(false),
    };
    if asleep == Some(true) {
        return Err(MapError::Asleep(engine));
    }
    let waiting = r.first(sels(spec.waiting), Aggregation::Sum, Range::Count);
    let queues: Vec<Read> = spec
        .queues
        .iter()
        .map(|q| r.first(sels(q), Aggregation::Sum, Range::Count))
        .collect();
    let waiting = queues.iter().fold(waiting, |acc, q| add(acc, *q));
    let running = r.first(sels(spec.running), Aggregation::Sum, Range::Count);
    let kv = match r.first(sels(spec.kv), Aggregation::Mean, Range::Ratio) {
        Read::Absent if engine == ModelServer::TritonTrtLlm => triton_kv_fallback(r),
        other => other,
    };
    if [waiting, running, kv].contains(&Read::Unknown) || asleep.is_none() {
        return Err(MapError::LoadUnknown(engine));
    }
    let (waiting, running) = match (waiting, running) {
        (Read::Absent, Read::Absent) => return Err(MapError::NoLoadMetrics(engine)),
        (w, r) => (agg_of(w), agg_of(r)),
    };
    let mut prefix_cache_counters = None;
    for (h, q) in spec.hit_counters {
        let hits = r.first_optional([(*h, None)], Aggregation::Sum, Range::NonNegative);
        let queries = r.first_optional([(*q, None)], Aggregation::Sum, Range::NonNegative);
        if let (Some(hits), Some(queries)) = (hits.value(), queries.value()) {
            prefix_cache_counters = Some((hits, queries));
            break;
        }
    }
    let prefix_hit_rate = r
        .first_optional(sels(spec.hit_rate), Aggregation::Mean, Range::HitRate)
        .value()
        .or_else(|| {
            let (h, q) = prefix_cache_counters?;
            let rate = (q > 0.0).then_some(h / q)?;
            check(rate, Range::Ratio).ok().flatten()
        });
    let (mut block_size, mut num_gpu_blocks) = match spec.cache_info {
        Some((family, bs, nb)) => cache_info(expo, family, bs, nb),
        None => (None, None),
    };
    block_size = block_size.or_else(|| {
        r.first_optional(sels(spec.block_size), Aggregation::Max, Range::NonNegative)
            .value()
            .and_then(to_u32)
    });
    num_gpu_blocks = num_gpu_blocks.or_else(|| {
        r.first_optional(sels(spec.num_blocks), Aggregation::Sum, Range::NonNegative)
            .value()
            .and_then(to_u64)
    });
    let extra_value = extra.and_then(|x| {
        r.first([(x.name.as_str(), None)], x.aggregation, Range::Any)
            .value()
    });
    let extra_counts_requests = extra.is_some_and(|x| {
        spec.waiting
            .iter()
            .chain(spec.running)
            .any(|sel| sel.label.is_none() && sel.name == x.name)
    });
    let lora = if engine != ModelServer::Vllm {
        None
    } else if expo.is_complete(VLLM_LORA) {
        lora_info(expo)
    } else {
        // The newest series may lie past the cut; an older one could claim a free slot.
        if expo.has(VLLM_LORA) {
            r.note(VLLM_LORA, Unknown::Cut);
        }
        None
    };
    Ok(EndpointMetrics {
        engine,
        waiting: waiting.map_or(0.0, |a| a.value),
        running: running.map_or(0.0, |a| a.value),
        kv_usage: kv.value(),
        lora,
        prefix_hit_rate,
        prefix_cache_counters,
        block_size,
        num_gpu_blocks,
        dp_groups: waiting.or(running).map_or(0, |a| a.groups),
        extra: extra_value,
        extra_counts_requests,
    })
}

fn agg_of(r: Read) -> Option<Agg> {
    match r {
        Read::Value(a) => Some(a),
        _ => None,
    }
}

/// Waiting work from several queues: unknown if any is, absent only if all are.
fn add(a: Read, b: Read) -> Read {
    match (a, b) {
        (Read::Unknown, _) | (_, Read::Unknown) => Read::Unknown,
        (Read::Value(x), Read::Value(y)) => Read::Value(Agg {
            value: x.value + y.value,
            groups: x.groups.max(y.groups),
        }),
        (Read::Value(x), Read::Absent) | (Read::Absent, Read::Value(x)) => Read::Value(x),
        (Read::Absent, Read::Absent) => Read::Absent,
    }
}

/// `Some(true)` when any engine of the pod sleeps (`awake` 0, or `weights_offloaded` /
/// `discard_all` 1); `Some(false)` when all are awake or the page has no sleep family (vLLM
/// before the metric); `None` when unknown (cut page, NaN, a value outside 0..=1).
fn vllm_asleep(r: &mut Reader<'_>) -> Option<bool> {
    if !r.expo.is_complete(VLLM_SLEEP) {
        r.note(VLLM_SLEEP, Unknown::Cut);
        return None;
    }
    let mut asleep = false;
    for smp in r.expo.series(VLLM_SLEEP) {
        let v = match check(smp.value, Range::Ratio) {
            Ok(v) => v.unwrap_or(0.0),
            Err(why) => {
                r.note(VLLM_SLEEP, why);
                return None;
            }
        };
        asleep |= match smp.label("sleep_state") {
            Some("awake") => v < 0.5,
            Some("weights_offloaded" | "discard_all") => v >= 0.5,
            _ => false,
        };
    }
    Some(asleep)
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
fn triton_kv_fallback(r: &mut Reader<'_>) -> Read {
    let sel = |t| [(TRITON_KV, Some(("kv_cache_block_type", t)))];
    let used = r.first(sel("used"), Aggregation::Sum, Range::NonNegative);
    let max = r.first(sel("max"), Aggregation::Sum, Range::NonNegative);
    match (used, max) {
        (Read::Unknown, _) | (_, Read::Unknown) => Read::Unknown,
        (Read::Value(u), Read::Value(m)) if m.value > 0.0 => {
            match check(u.value / m.value, Range::Ratio) {
                Ok(Some(value)) => Read::Value(Agg {
                    value,
                    groups: m.groups,
                }),
                Ok(None) => Read::Absent,
                Err(why) => {
                    r.note(TRITON_KV, why);
                    Read::Unknown
                }
            }
        }
        _ => Read::Absent,
    }
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
vllm:num_requests_running{model_name="b"} 0
"#;
        let m = map(text).unwrap();
        assert_eq!(m.waiting, 3.0, "model_name series summed");
        assert_eq!(m.running, 4.0, "replicas max'ed");
        assert_eq!(m.kv_usage, None);
    }

    /// NaN, ±Inf and out-of-range values are unknown, never 0: before, a NaN or negative
    /// series was skipped, so `running{b} NaN` made the pod look like it ran 4, and a page whose
    /// only queue series was NaN looked idle.
    #[test]
    fn nan_inf_and_out_of_range_make_the_value_unknown_never_0() {
        let page = |waiting: &str, running: &str, kv: &str| {
            format!(
                "vllm:num_requests_waiting{{engine=\"0\",model_name=\"m\"}} 2.0\n\
                 vllm:num_requests_waiting{{engine=\"1\",model_name=\"m\"}} {waiting}\n\
                 vllm:num_requests_running{{engine=\"0\",model_name=\"m\"}} {running}\n\
                 vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"m\"}} {kv}\n"
            )
        };
        let ok = scrape_page(page("1.0", "3.0", "0.5").as_bytes(), 1 << 20, None);
        let m = ok.result.unwrap();
        assert_eq!((m.waiting, m.running, m.kv_usage), (3.0, 3.0, Some(0.5)));
        assert!(ok.unknown.is_empty());
        let cases = [
            (
                page("NaN", "3.0", "0.5"),
                "vllm:num_requests_waiting",
                Unknown::NotFinite,
            ),
            (
                page("+Inf", "3.0", "0.5"),
                "vllm:num_requests_waiting",
                Unknown::NotFinite,
            ),
            (
                page("-1.0", "3.0", "0.5"),
                "vllm:num_requests_waiting",
                Unknown::OutOfRange,
            ),
            (
                page("1.0", "-Inf", "0.5"),
                "vllm:num_requests_running",
                Unknown::NotFinite,
            ),
            (
                page("1.0", "3e12", "0.5"),
                "vllm:num_requests_running",
                Unknown::OutOfRange,
            ),
            (
                page("1.0", "3.0", "NaN"),
                "vllm:kv_cache_usage_perc",
                Unknown::NotFinite,
            ),
            (
                page("1.0", "3.0", "1.7"),
                "vllm:kv_cache_usage_perc",
                Unknown::OutOfRange,
            ),
            (
                page("1.0", "3.0", "-0.2"),
                "vllm:kv_cache_usage_perc",
                Unknown::OutOfRange,
            ),
        ];
        for (text, metric, why) in cases {
            let out = scrape_page(text.as_bytes(), 1 << 20, None);
            assert_eq!(
                out.result,
                Err(MapError::LoadUnknown(ModelServer::Vllm)),
                "{text}"
            );
            assert_eq!(
                out.unknown,
                vec![UnknownValue {
                    metric: metric.into(),
                    why
                }],
                "{text}"
            );
        }
        // Optional signals become None, the pod stays a candidate.
        let text = format!(
            "{}vllm:gpu_prefix_cache_hit_rate{{model_name=\"m\"}} NaN\n\
             vllm:prefix_cache_hits_total{{model_name=\"m\"}} -4\n\
             vllm:prefix_cache_queries_total{{model_name=\"m\"}} 10\n\
             custom{{model_name=\"m\"}} Inf\n",
            page("1.0", "3.0", "0.5")
        );
        let x = ExtraMetric {
            name: "custom".into(),
            aggregation: Aggregation::Sum,
        };
        let out = scrape_page(text.as_bytes(), 1 << 20, Some(&x));
        let m = out.result.unwrap();
        assert_eq!(
            (m.prefix_hit_rate, m.prefix_cache_counters, m.extra),
            (None, None, None)
        );
        let mut why: Vec<(&str, Unknown)> = out
            .unknown
            .iter()
            .map(|u| (u.metric.as_str(), u.why))
            .collect();
        why.sort_unstable_by_key(|(m, _)| *m);
        assert_eq!(
            why,
            vec![
                ("custom", Unknown::NotFinite),
                ("vllm:gpu_prefix_cache_hit_rate", Unknown::NotFinite),
                ("vllm:prefix_cache_hits_total", Unknown::OutOfRange),
            ]
        );
    }

    #[test]
    fn vllm_old_kv_name_and_lora_latest_series() {
        let text = r#"vllm:num_requests_waiting{model_name="m"} 0
vllm:gpu_cache_usage_perc{model_name="m"} 1.0000001
vllm:gpu_prefix_cache_hit_rate{model_name="m"} -1.0
vllm:lora_requests_info{max_lora="4",running_lora_adapters="a, b,",waiting_lora_adapters="c"} 20
vllm:lora_requests_info{max_lora="4",running_lora_adapters="old",waiting_lora_adapters=""} 10
vllm:lora_requests_info{max_lora="4",running_lora_adapters="nan",waiting_lora_adapters=""} NaN
"#;
        let m = map(text).unwrap();
        assert_eq!(m.kv_usage, Some(1.0), "a rounding overshoot is clamped");
        assert_eq!(m.prefix_hit_rate, None, "-1 = no queries yet");
        let l = m.lora.unwrap();
        assert_eq!(l.running, vec!["a", "b"]);
        assert_eq!(l.waiting, vec!["c"]);
        assert_eq!(l.max_lora, 4);
        assert!(l.has_free_slot() && l.is_running("b") && !l.is_running("c") && l.is_waiting("c"));
    }

    /// Found by `tests/fuzz` (prom_cut): on a cut page the preferred KV name may lie past the
    /// cut; falling back to the deprecated name read another value than the whole page would.
    #[test]
    fn a_preferred_name_past_the_cut_is_unknown_not_its_fallback() {
        let page =
            "vllm:engine_sleep_state{engine=\"0\",model_name=\"m\",sleep_state=\"awake\"} 1\n\
                    vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.1\n\
                    vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2.0\n\
                    vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 2.0\n\
                    noise_bucket{le=\"1.0\"} 3\n\
                    vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.9\n";
        let whole = scrape_page(page.as_bytes(), usize::MAX, None)
            .result
            .unwrap();
        assert_eq!(whole.kv_usage, Some(0.9));
        let cut = page.find("vllm:kv_cache").unwrap();
        let out = scrape_page(&page.as_bytes()[..cut], cut, None);
        assert_eq!(out.result, Err(MapError::LoadUnknown(ModelServer::Vllm)));
        assert_eq!(
            out.unknown,
            vec![UnknownValue {
                metric: "vllm:kv_cache_usage_perc".into(),
                why: Unknown::Cut
            }]
        );
        // A NaN preferred name on a whole page still yields to the fallback.
        let nan = page.replace("} 0.9", "} NaN");
        assert_eq!(map(&nan).unwrap().kv_usage, Some(0.1));
    }

    /// A cut through the histograms after the gauges: the pod reads as on the whole page, and
    /// the optional families the page lacks (V0's hit-rate gauge, LoRA) are not reported as
    /// unknown: every cut page would report them.
    #[test]
    fn a_cut_after_the_load_families_reads_whole_and_reports_nothing() {
        let page = format!(
            "{}vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"m\"}} 0.5\n\
             h_bucket{{le=\"1\"}} 1\nh_bucket{{le=\"2\"}} 22",
            sleep_page(["1.0", "0.0", "0.0"])
        );
        let out = scrape_page(page.as_bytes(), page.len(), None);
        assert_eq!(out.stats.truncated, Some(prom::Truncation::InputBytes));
        let m = out.result.unwrap();
        assert_eq!((m.waiting, m.running, m.kv_usage), (0.0, 0.0, Some(0.5)));
        assert_eq!(out.unknown, vec![]);
    }

    /// vLLM V1 as `vllm/v1/metrics/loggers.py` emits it: one series per engine and state.
    fn sleep_page(engine1: [&str; 3]) -> String {
        let mut t = String::from(
            "# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.\n\
             # TYPE vllm:engine_sleep_state gauge\n",
        );
        for (engine, vals) in [("0", ["1.0", "0.0", "0.0"]), ("1", engine1)] {
            for (state, v) in ["awake", "weights_offloaded", "discard_all"]
                .iter()
                .zip(vals)
            {
                t.push_str(&format!(
                    "vllm:engine_sleep_state{{engine=\"{engine}\",model_name=\"m\",sleep_state=\"{state}\"}} {v}\n"
                ));
            }
        }
        t.push_str(
            "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 0.0\n\
             vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 0.0\n\
             vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 0.0\n\
             vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 0.0\n",
        );
        t
    }

    /// A sleeping vLLM engine reports an empty queue: read as idle it would draw every request.
    #[test]
    fn vllm_asleep_is_not_a_candidate() {
        let m = map(&sleep_page(["1.0", "0.0", "0.0"])).unwrap();
        assert_eq!((m.waiting, m.running), (0.0, 0.0));
        for level in [
            ["0.0", "1.0", "0.0"],
            ["0.0", "0.0", "1.0"],
            ["0.0", "0.0", "0.0"],
        ] {
            assert_eq!(
                map(&sleep_page(level)),
                Err(MapError::Asleep(ModelServer::Vllm)),
                "{level:?}"
            );
        }
        let out = scrape_page(sleep_page(["NaN", "0.0", "0.0"]).as_bytes(), 1 << 20, None);
        assert_eq!(out.result, Err(MapError::LoadUnknown(ModelServer::Vllm)));
        assert_eq!(out.unknown[0].metric, "vllm:engine_sleep_state");
        // vLLM before the metric: no family on a whole page = awake.
        assert!(map(VLLM_V1_DP).is_ok());
    }

    /// SGLang prefill/decode disaggregation: requests in the bootstrap, in-flight transfer,
    /// pre-allocation and transfer queues hold no batch slot yet; they are waiting work.
    #[test]
    fn sglang_disaggregation_queues_count_as_waiting() {
        let labels = |rank: u32, mode: &str| {
            format!("dp_rank=\"{rank}\",engine_type=\"{mode}\",model_name=\"q\",pp_rank=\"0\",tp_rank=\"0\"")
        };
        let mut decode = String::new();
        for (name, vals) in [
            ("sglang:num_running_reqs", [8, 8]),
            ("sglang:num_queue_reqs", [0, 1]),
            ("sglang:num_prefill_bootstrap_queue_reqs", [0, 0]),
            ("sglang:num_prefill_inflight_queue_reqs", [0, 0]),
            ("sglang:num_decode_prealloc_queue_reqs", [3, 2]),
            ("sglang:num_decode_transfer_queue_reqs", [2, 0]),
            ("sglang:token_usage", [0, 0]),
        ] {
            decode.push_str(&format!("# TYPE {name} gauge\n"));
            for (rank, v) in vals.iter().enumerate() {
                decode.push_str(&format!(
                    "{name}{{{}}} {v}.0\n",
                    labels(rank as u32, "decode")
                ));
            }
        }
        let m = map(&decode).unwrap();
        assert_eq!((m.waiting, m.running, m.dp_groups), (8.0, 16.0, 2));

        // A prefill pod of a release that still named the bootstrap queue `…prealloc…`.
        let l = labels(0, "prefill");
        let prefill = format!(
            "sglang:num_running_reqs{{{l}}} 1.0\nsglang:num_queue_reqs{{{l}}} 2.0\n\
             sglang:num_prefill_prealloc_queue_reqs{{{l}}} 4.0\n\
             sglang:num_prefill_inflight_queue_reqs{{{l}}} 3.0\n\
             sglang:num_decode_prealloc_queue_reqs{{{l}}} 0.0\n\
             sglang:num_decode_transfer_queue_reqs{{{l}}} 0.0\n"
        );
        assert_eq!(map(&prefill).unwrap().waiting, 9.0);
        // A NaN queue is unknown work, not none.
        let bad = prefill.replace("} 3.0", "} NaN");
        assert_eq!(map(&bad), Err(MapError::LoadUnknown(ModelServer::Sglang)));
    }

    /// trtllm-serve answers `/metrics` with JSON iteration statistics (shaped after its
    /// documentation; `[]` before the first iteration); its Prometheus text is at
    /// `/prometheus/metrics`.
    #[test]
    fn trtllm_serve_json_metrics_are_refused_as_not_prometheus() {
        let json = r#"[{"cpuMemUsage":0,"gpuMemUsage":76665782272,"inflightBatchingStats":{"avgNumDecodedTokensPerIter":0,"microBatchId":0,"numContextRequests":1,"numCtxTokens":5,"numGenRequests":0,"numPausedRequests":0,"numScheduledRequests":1},"iter":154,"iterLatencyMS":7.0,"kvCacheStats":{"allocNewBlocks":3126,"allocTotalBlocks":3126,"cacheHitRate":0.0013,"freeNumBlocks":101253,"maxNumBlocks":101256,"missedBlocks":3121,"reusedBlocks":4,"tokensPerBlock":32,"usedNumBlocks":3},"maxNumActiveRequests":2048,"newActiveRequestsQueueLatencyMS":0.0,"numActiveRequests":1,"numCompletedRequests":0,"numQueuedRequests":0}]"#;
        for body in [json, "[]", " \n{\"detail\":\"Not Found\"}", "\u{feff}[]"] {
            let out = scrape_page(body.as_bytes(), 1 << 20, None);
            assert_eq!(out.result, Err(MapError::NotPrometheus), "{body}");
        }
        assert!(!looks_like_json(b"trtllm_num_requests_waiting 1\n"));
        assert!(!looks_like_json(b"# HELP x\n{"));
        assert!(!looks_like_json(b""));
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
