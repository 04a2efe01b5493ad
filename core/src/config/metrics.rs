//! `endpoint_metrics` keys of `lb_config`: Higress's `metric_policy`, `target_metric` and
//! `rate_limit` (same names and meaning), plus the scraper, thresholds, weights and shedding.

use super::fields::Fields;
use super::{Build, ConfigError};
use crate::model_metrics::{Aggregation, ExtraMetric, MetricPolicy, SchedulerConfig, Weights};
use serde_json::{Map, Value};

/// Where endpoint metrics come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsSource {
    /// The `metrics` field of Higress's upstream host list (its active health check body).
    Host,
    /// The plugin's own scraper (HTTP callouts from the root context on a tick).
    Scrape,
}

/// How the scraper reaches each pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrapeConfig {
    /// The Envoy cluster the callouts go to (an ORIGINAL_DST cluster honouring `host_header`).
    pub cluster: String,
    pub path: String,
    /// Metrics port when it differs from the serving port.
    pub port: Option<u16>,
    /// Header naming the pod (`ip:port`) for the ORIGINAL_DST cluster.
    pub host_header: String,
    pub interval_ms: u32,
    pub timeout_ms: u32,
    /// A snapshot older than this counts as unknown.
    pub max_age_ms: u64,
}

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
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let port = s.port.map(|p| p.to_string()).unwrap_or_default();
        for part in [
            s.cluster.as_str(),
            s.path.as_str(),
            port.as_str(),
            &s.host_header,
        ]
        .into_iter()
        .chain(endpoints.iter().map(String::as_str))
        {
            for b in part.bytes().chain(std::iter::once(0)) {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        Some(format!("{h:016x}"))
    }
}

const DEFAULT_INTERVAL_MS: u64 = 500;
const DEFAULT_TIMEOUT_MS: u64 = 400;
const DEFAULT_MAX_AGE_MS: u64 = 5000;
pub const DEFAULT_CRITICALITY_HEADER: &str = "x-ai-lb-criticality";

pub(super) fn parse(f: &mut Fields<'_>, build: Build) -> Result<MetricsConfig, ConfigError> {
    let defaults = SchedulerConfig::default();
    let policy = match f.get::<String>("metric_policy")?.as_deref() {
        None | Some("default") => MetricPolicy::Default,
        Some("least") => MetricPolicy::Least,
        Some("most") => MetricPolicy::Most,
        Some("weighted") => MetricPolicy::Weighted,
        Some(other) => {
            return Err(ConfigError::new(
                "metric_policy",
                format!("unknown value `{other}` (default, least, most, weighted)"),
            ))
        }
    };
    let target: Option<String> = f.get("target_metric")?;
    let extra = match target.as_deref() {
        None | Some("") => None,
        Some(name) if !valid_metric_name(name) => {
            return Err(ConfigError::new(
                "target_metric",
                format!("`{name}` is not a Prometheus metric name"),
            ))
        }
        Some(name) => Some(ExtraMetric {
            name: name.to_string(),
            aggregation: if name.contains("perc") || name.contains("usage") {
                Aggregation::Mean
            } else {
                Aggregation::Sum
            },
        }),
    };
    if matches!(policy, MetricPolicy::Least | MetricPolicy::Most) && extra.is_none() {
        return Err(ConfigError::new(
            "target_metric",
            "missing: metric_policy least/most needs the metric to compare",
        ));
    }
    let rate_limit: f64 = f.get("rate_limit")?.unwrap_or(1.0);
    if !(rate_limit > 0.0 && rate_limit <= 1.0) {
        return Err(ConfigError::new(
            "rate_limit",
            format!("{rate_limit} is outside (0, 1]"),
        ));
    }
    let queue_threshold_critical = fraction_or(
        f,
        "queueThresholdCritical",
        defaults.queue_threshold_critical,
        1e9,
    )?;
    let kv_cache_threshold = fraction_or(f, "kvCacheThreshold", defaults.kv_cache_threshold, 1.0)?;
    let queueing_threshold_lora = fraction_or(
        f,
        "queueingThresholdLora",
        defaults.queueing_threshold_lora,
        1e9,
    )?;
    let lora_affinity_threshold = fraction_or(
        f,
        "loraAffinityThreshold",
        defaults.lora_affinity_threshold,
        1.0,
    )?;
    let weights = match f.raw("weights") {
        None | Some(Value::Null) => Weights::default(),
        Some(Value::Object(m)) => parse_weights(m).map_err(|e| e.within("weights"))?,
        Some(_) => return Err(ConfigError::new("weights", "must be an object")),
    };
    let max_running_hint: Option<u32> = f.get("maxRunningHint")?;
    if max_running_hint == Some(0) {
        return Err(ConfigError::new("maxRunningHint", "must be at least 1"));
    }
    let default_source = match build {
        Build::Higress => "host",
        Build::Envoy => "scrape",
    };
    let source = match f
        .get::<String>("metricsSource")?
        .as_deref()
        .unwrap_or(default_source)
    {
        "host" if build == Build::Envoy => {
            return Err(ConfigError::new(
                "metricsSource",
                "`host` needs Higress's upstream host list; the plain-Envoy build scrapes",
            ))
        }
        "host" => MetricsSource::Host,
        "scrape" => MetricsSource::Scrape,
        other => {
            return Err(ConfigError::new(
                "metricsSource",
                format!("unknown value `{other}` (host, scrape)"),
            ))
        }
    };
    let scrape = parse_scrape(f, source)?;
    let criticality_header: String = f
        .get("criticalityHeader")?
        .unwrap_or_else(|| DEFAULT_CRITICALITY_HEADER.to_string());
    if !super::lb::is_header_name(&criticality_header) {
        return Err(ConfigError::new(
            "criticalityHeader",
            "must be a header name (letters, digits, '-', '_')",
        ));
    }
    let sheddable_models: Vec<String> = f.get("sheddableModels")?.unwrap_or_default();
    let host_list_cache_ms: u64 = f.get("hostListCacheMs")?.unwrap_or(100);
    if host_list_cache_ms > 10_000 {
        return Err(ConfigError::new(
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

fn parse_scrape(
    f: &mut Fields<'_>,
    source: MetricsSource,
) -> Result<Option<ScrapeConfig>, ConfigError> {
    let cluster: Option<String> = f.get("scrapeCluster")?;
    let path: Option<String> = f.get("scrapePath")?;
    let port: Option<u16> = f.get("scrapePort")?;
    let host_header: Option<String> = f.get("scrapeHostHeader")?;
    let interval: Option<u64> = f.get("scrapeIntervalMs")?;
    let timeout: Option<u64> = f.get("scrapeTimeoutMs")?;
    let max_age: Option<u64> = f.get("metricsMaxAgeMs")?;
    if source == MetricsSource::Host {
        return Ok(None);
    }
    let cluster = cluster.filter(|c| !c.is_empty()).ok_or_else(|| {
        ConfigError::new(
            "scrapeCluster",
            "missing (the Envoy cluster the scrape callouts use, e.g. an ORIGINAL_DST cluster)",
        )
    })?;
    let path = path.unwrap_or_else(|| "/metrics".to_string());
    if !path.starts_with('/') || path.contains([' ', '\r', '\n']) {
        return Err(ConfigError::new(
            "scrapePath",
            "must start with '/' and hold no spaces",
        ));
    }
    if port == Some(0) {
        return Err(ConfigError::new("scrapePort", "0 is not a port"));
    }
    let host_header = host_header.unwrap_or_else(|| "x-envoy-original-dst-host".to_string());
    if !super::lb::is_header_name(&host_header) {
        return Err(ConfigError::new(
            "scrapeHostHeader",
            "must be a header name (letters, digits, '-', '_')",
        ));
    }
    let interval_ms = interval.unwrap_or(DEFAULT_INTERVAL_MS);
    if !(50..=60_000).contains(&interval_ms) {
        return Err(ConfigError::new(
            "scrapeIntervalMs",
            format!("{interval_ms} ms is outside 50-60000"),
        ));
    }
    let timeout_ms = timeout.unwrap_or(DEFAULT_TIMEOUT_MS.min(interval_ms));
    if !(10..=60_000).contains(&timeout_ms) {
        return Err(ConfigError::new(
            "scrapeTimeoutMs",
            format!("{timeout_ms} ms is outside 10-60000"),
        ));
    }
    let max_age_ms = max_age.unwrap_or(DEFAULT_MAX_AGE_MS.max(3 * interval_ms));
    if max_age_ms < interval_ms {
        return Err(ConfigError::new(
            "metricsMaxAgeMs",
            format!("{max_age_ms} ms is shorter than scrapeIntervalMs ({interval_ms} ms)"),
        ));
    }
    Ok(Some(ScrapeConfig {
        cluster,
        path,
        port,
        host_header: host_header.to_ascii_lowercase(),
        interval_ms: interval_ms as u32,
        timeout_ms: timeout_ms as u32,
        max_age_ms,
    }))
}

fn parse_weights(map: &Map<String, Value>) -> Result<Weights, ConfigError> {
    let mut f = Fields::new(map);
    let d = Weights::default();
    let w = Weights {
        queue: fraction_or(&mut f, "queue", d.queue, 1e6)?,
        kv: fraction_or(&mut f, "kv", d.kv, 1e6)?,
        running: fraction_or(&mut f, "running", d.running, 1e6)?,
        in_flight: fraction_or(&mut f, "inFlight", d.in_flight, 1e6)?,
    };
    f.finish()?;
    if w.queue + w.kv + w.running + w.in_flight <= 0.0 {
        return Err(ConfigError::new("queue", "all weights are 0"));
    }
    Ok(w)
}

/// A finite number in `0..=max`, or the default.
fn fraction_or<'a>(
    f: &mut Fields<'a>,
    key: &'a str,
    default: f64,
    max: f64,
) -> Result<f64, ConfigError> {
    let v: f64 = f.get(key)?.unwrap_or(default);
    if !(0.0..=max).contains(&v) {
        return Err(ConfigError::new(key, format!("{v} is outside 0-{max}")));
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
