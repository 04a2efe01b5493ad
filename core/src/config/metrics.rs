//! `endpoint_metrics` keys of `lb_config`: Higress's `metric_policy`, `target_metric` and
//! `rate_limit` (read as its Go plugin reads them), plus our source, thresholds, weights and
//! shedding keys (strict). The scraper's keys are in scrape.rs.

use super::common::is_header_name;
use super::error::ConfigError;
use super::raw::{RawLbConfig, RawWeights};
use super::read::{In, Reader};
use super::scrape::{self, ScrapeConfig};
use super::values::Build;
use crate::hash;
use crate::model_metrics::{Aggregation, ExtraMetric, MetricPolicy, SchedulerConfig, Weights};

pub const METRICS_KEYS: &[&str] = &[
    "metric_policy",
    "target_metric",
    "rate_limit",
    "window_size",
    "window_seconds",
    "engine",
    "metricsSource",
    "hostListCacheMs",
    "queueingThresholdLora",
    "loraAffinityThreshold",
    "weights",
    "maxRunningHint",
    "criticalityHeader",
    "sheddableModels",
];

/// The scraper's keys and the saturation thresholds (`saturation_keys`): read alike by
/// endpoint_metrics and by the plain-Envoy prefix_cache's metrics guard (prefix.rs).
pub const SATURATION_SCRAPE_KEYS: &[&str] = &[
    "scrapeCluster",
    "scrapePath",
    "scrapePort",
    "scrapeHostHeader",
    "scrapeIntervalMs",
    "scrapeTimeoutMs",
    "metricsMaxAgeMs",
    "queueThresholdCritical",
    "kvCacheThreshold",
];

pub use super::values::MetricsSource;

/// The validated `endpoint_metrics` settings of one route.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsConfig {
    pub scheduler: SchedulerConfig,
    /// `target_metric` (for `least` / `most`), read from each scrape.
    pub extra: Option<ExtraMetric>,
    pub source: MetricsSource,
    pub scrape: Option<ScrapeConfig>,
    /// A request whose header has the value `sheddable` may be rejected with 429.
    pub criticality_header: String,
    /// Requests for these models (Higress build: `model` of the body) are sheddable.
    pub sheddable_models: Vec<String>,
    /// Higress host source: the host list (and its metrics) is re-read at most this often per
    /// worker; 0 = on every request.
    pub host_list_cache_ms: u64,
}

impl MetricsConfig {
    /// Shared-data namespace of this scrape target: every route scraping the same pods the
    /// same way shares one scraper and one snapshot.
    pub fn scrape_namespace(&self, endpoints: &[String]) -> Option<String> {
        let s = self.scrape.as_ref()?;
        let port = s.port.map(|p| p.to_string()).unwrap_or_default();
        let h = [
            s.cluster.as_str(),
            s.path.as_str(),
            port.as_str(),
            &s.host_header,
        ]
        .into_iter()
        .chain(endpoints.iter().map(String::as_str))
        .fold(hash::FNV_OFFSET, |h, part| {
            hash::fnv1a(hash::fnv1a(h, part.as_bytes()), &[0])
        });
        Some(format!("{h:016x}"))
    }
}

pub const DEFAULT_CRITICALITY_HEADER: &str = "x-ai-lb-criticality";

impl TryFrom<In<'_, '_, RawLbConfig>> for MetricsConfig {
    type Error = ConfigError;

    fn try_from(i: In<'_, '_, RawLbConfig>) -> Result<MetricsConfig, ConfigError> {
        let (raw, r, build) = (i.raw, i.r, i.build);
        let defaults = SchedulerConfig::default();
        let (policy, extra) = higress_keys(raw, r);
        let rate_limit = rate_limit(raw, r);
        let (rate_window, rate_window_ms) = rate_window(raw, r);
        engine(raw, r);
        let (queue_threshold_critical, kv_cache_threshold) = saturation_keys(raw, r)?;
        let queueing_threshold_lora = number_in(
            r,
            "queueingThresholdLora",
            &raw.queueing_threshold_lora,
            defaults.queueing_threshold_lora,
            1e9,
        )?;
        let lora_affinity_threshold = number_in(
            r,
            "loraAffinityThreshold",
            &raw.lora_affinity_threshold,
            defaults.lora_affinity_threshold,
            1.0,
        )?;
        let weights = match r.own("weights", &raw.weights)? {
            None => Weights::default(),
            Some(v) if v.is_object() => {
                weights(&RawWeights::from_value(&v), &mut r.nested("weights"))?
            }
            Some(_) => return Err(r.err("weights", "must be an object")),
        };
        let max_running_hint = r.own("maxRunningHint", &raw.max_running_hint)?;
        if max_running_hint == Some(0) {
            return Err(r.err("maxRunningHint", "must be at least 1"));
        }
        let source = match (
            r.own("metricsSource", &raw.metrics_source)?.as_deref(),
            build,
        ) {
            (None, Build::Higress) | (Some("host"), Build::Higress) => MetricsSource::Host,
            (None, Build::Envoy) | (Some("scrape"), _) => MetricsSource::Scrape,
            (Some("host"), Build::Envoy) => {
                return Err(r.err(
                    "metricsSource",
                    "`host` needs Higress's upstream host list; the plain-Envoy build scrapes",
                ))
            }
            (Some(other), _) => {
                return Err(r.err(
                    "metricsSource",
                    format!("unknown value `{other}` (host, scrape)"),
                ))
            }
        };
        let scrape = scrape::read(raw, r, source)?;
        let criticality_header = r
            .own("criticalityHeader", &raw.criticality_header)?
            .unwrap_or_else(|| DEFAULT_CRITICALITY_HEADER.to_string());
        if !is_header_name(&criticality_header) {
            return Err(r.err(
                "criticalityHeader",
                "must be a header name (letters, digits, '-', '_')",
            ));
        }
        let sheddable_models = r
            .own("sheddableModels", &raw.sheddable_models)?
            .unwrap_or_default();
        let host_list_cache_ms = r
            .own("hostListCacheMs", &raw.host_list_cache_ms)?
            .unwrap_or(100);
        if host_list_cache_ms > 10_000 {
            return Err(r.err(
                "hostListCacheMs",
                format!("{host_list_cache_ms} ms is over 10000"),
            ));
        }
        Ok(MetricsConfig {
            scheduler: SchedulerConfig {
                policy,
                queueing_threshold_lora,
                queue_threshold_critical,
                kv_cache_threshold,
                lora_affinity_threshold,
                weights,
                rate_limit,
                rate_window,
                rate_window_ms,
                max_running_hint,
            },
            extra,
            source,
            scrape,
            criticality_header: criticality_header.to_ascii_lowercase(),
            sheddable_models,
            host_list_cache_ms,
        })
    }
}

/// What makes a pod saturated (its queue over `queueThresholdCritical`, or its KV cache use
/// over `kvCacheThreshold`): endpoint_metrics' shedding and the plain-Envoy prefix_cache's
/// metrics guard (prefix.rs) read them the same way.
pub(super) fn saturation_keys(
    raw: &RawLbConfig,
    r: &Reader<'_>,
) -> Result<(f64, f64), ConfigError> {
    let defaults = SchedulerConfig::default();
    let queue = number_in(
        r,
        "queueThresholdCritical",
        &raw.queue_threshold_critical,
        defaults.queue_threshold_critical,
        1e9,
    )?;
    let kv = number_in(
        r,
        "kvCacheThreshold",
        &raw.kv_cache_threshold,
        defaults.kv_cache_threshold,
        1.0,
    )?;
    Ok((queue, kv))
}

/// `metric_policy` and `target_metric` as Higress reads them: any policy other than `least` /
/// `most` (and our `weighted`) is the default filter chain; Higress never refuses a name.
fn higress_keys(raw: &RawLbConfig, r: &mut Reader<'_>) -> (MetricPolicy, Option<ExtraMetric>) {
    let policy = match r.string("metric_policy", &raw.metric_policy).as_deref() {
        None | Some("default") => MetricPolicy::Default,
        Some("least") => MetricPolicy::Least,
        Some("most") => MetricPolicy::Most,
        Some("weighted") => MetricPolicy::Weighted,
        Some(other) => {
            r.warn(
                "metric_policy",
                format!("unknown value `{other}` (default, least, most, weighted): the default filter chain, as Higress uses for it"),
            );
            MetricPolicy::Default
        }
    };
    let target = r
        .string("target_metric", &raw.target_metric)
        .unwrap_or_default();
    let extra = if target.is_empty() {
        None
    } else if !valid_metric_name(&target) {
        r.warn(
            "target_metric",
            format!("`{target}` is not a Prometheus metric name, so no pod exports it (Higress then falls back to the cluster's own load balancing on every request); ignored"),
        );
        None
    } else {
        Some(ExtraMetric {
            aggregation: if target.contains("perc") || target.contains("usage") {
                Aggregation::Mean
            } else {
                Aggregation::Sum
            },
            name: target,
        })
    };
    if policy == MetricPolicy::Default && extra.is_some() {
        r.warn(
            "target_metric",
            "used only by `least` and `most`: the default filter chain here reads the real \
             queue and KV metrics (Higress's Go plugin, given a target_metric, runs its default \
             filter on zeroed metrics instead)",
        );
    }
    if matches!(policy, MetricPolicy::Least | MetricPolicy::Most) && extra.is_none() {
        r.warn(
            "metric_policy",
            "least/most without a usable target_metric compares nothing (Higress then picks at random among the pods); assumed `default`",
        );
        return (MetricPolicy::Default, None);
    }
    (policy, extra)
}

/// `rate_limit` as Higress reads it: a share in (0, 1]; above 1 never limits; 0 or below (and
/// null, which Go reads as 0) would make Higress move almost every pick to a random other pod.
fn rate_limit(raw: &RawLbConfig, r: &mut Reader<'_>) -> f64 {
    let v = r.float("rate_limit", &raw.rate_limit).unwrap_or(1.0);
    if v > 1.0 {
        r.warn(
            "rate_limit",
            format!("{v} is above 1: no limit, as in Higress"),
        );
        1.0
    } else if v > 0.0 {
        v
    } else {
        r.warn(
            "rate_limit",
            format!("{v} is not a share in (0, 1]: Higress then moves nearly every pick to a random other pod; here no pod can meet it once the window fills, so the metrics pick stands"),
        );
        0.0
    }
}

/// Most decisions a `rate_limit` window holds here (16 bytes each in shared data).
pub const MAX_RATE_WINDOW: usize = 10_000;

/// `window_size` / `window_seconds` of Higress PR #4260 (open), read as its Go code reads them:
/// either key turns the window into at most `window_size` decisions (0 or below: 100) none
/// older than `window_seconds` (0 or below: 60). With neither, the released plugin's window:
/// the last 100 decisions, however old.
fn rate_window(raw: &RawLbConfig, r: &mut Reader<'_>) -> (usize, Option<u64>) {
    let size = r.int("window_size", &raw.window_size);
    let seconds = r.int("window_seconds", &raw.window_seconds);
    if size.is_none() && seconds.is_none() {
        return (crate::model_metrics::rate_limit::WINDOW, None);
    }
    let mut size = size.filter(|n| *n > 0).unwrap_or(100);
    if size > MAX_RATE_WINDOW as i64 {
        r.warn(
            "window_size",
            format!("{size} decisions: this plugin keeps at most {MAX_RATE_WINDOW}"),
        );
        size = MAX_RATE_WINDOW as i64;
    }
    let seconds = seconds.filter(|n| *n > 0).unwrap_or(60);
    let ms = u64::try_from(seconds)
        .unwrap_or(u64::MAX / 1000)
        .saturating_mul(1000);
    (usize::try_from(size).unwrap_or(MAX_RATE_WINDOW), Some(ms))
}

/// `engine` of Higress PR #4043 (open): `vllm` (the default) or `sglang` names the metric
/// names Go reads. Here every pod's engine is told from its metric names, which reads what
/// either value names, and a pod of another engine too; an unknown value is said.
fn engine(raw: &RawLbConfig, r: &mut Reader<'_>) {
    let Some(engine) = r.string("engine", &raw.engine) else {
        return;
    };
    if !matches!(engine.as_str(), "vllm" | "sglang") {
        r.warn(
            "engine",
            format!(
                "unknown value `{engine}` (vllm, sglang; Go reads it as vllm): each pod's engine \
                 is detected from its metric names (vLLM, SGLang, TRT-LLM, TGI)"
            ),
        );
    }
}

fn weights(raw: &RawWeights, r: &mut Reader<'_>) -> Result<Weights, ConfigError> {
    if let Some(key) = raw.other.keys().next() {
        return Err(r.err(
            key,
            format!(
                "unknown field (known here: {})",
                RawWeights::KEYS.join(", ")
            ),
        ));
    }
    let d = Weights::default();
    let w = Weights {
        queue: number_in(r, "queue", &raw.queue, d.queue, 1e6)?,
        kv: number_in(r, "kv", &raw.kv, d.kv, 1e6)?,
        running: number_in(r, "running", &raw.running, d.running, 1e6)?,
        in_flight: number_in(r, "inFlight", &raw.in_flight, d.in_flight, 1e6)?,
    };
    if w.queue + w.kv + w.running + w.in_flight <= 0.0 {
        return Err(r.err("queue", "all weights are 0"));
    }
    Ok(w)
}

/// One of our numbers: finite, in `0..=max`, or the default.
fn number_in(
    r: &Reader<'_>,
    key: &str,
    v: &super::go::Field<super::go::Own<f64>>,
    default: f64,
    max: f64,
) -> Result<f64, ConfigError> {
    let v = r.own(key, v)?.unwrap_or(default);
    if !(0.0..=max).contains(&v) {
        return Err(r.err(key, format!("{v} is outside 0-{max}")));
    }
    Ok(v)
}

fn valid_metric_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_' || b == b':')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}
