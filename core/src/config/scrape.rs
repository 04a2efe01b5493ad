//! `endpoint_metrics` scraper keys (ours, strict): where the plugin's own metrics callouts go,
//! how often, and how old a snapshot may get.

use super::common::is_header_name;
use super::error::ConfigError;
use super::raw::RawLbConfig;
use super::read::Reader;
use super::values::MetricsSource;

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

const DEFAULT_INTERVAL_MS: u64 = 500;
const DEFAULT_TIMEOUT_MS: u64 = 400;
const DEFAULT_MAX_AGE_MS: u64 = 5000;

/// The scrape settings; `None` for the host source (the keys are still type-checked).
pub fn read(
    raw: &RawLbConfig,
    r: &Reader<'_>,
    source: MetricsSource,
) -> Result<Option<ScrapeConfig>, ConfigError> {
    let cluster = r.own("scrapeCluster", &raw.scrape_cluster)?;
    let path = r.own("scrapePath", &raw.scrape_path)?;
    let port = r.own("scrapePort", &raw.scrape_port)?;
    let host_header = r.own("scrapeHostHeader", &raw.scrape_host_header)?;
    let interval = r.own("scrapeIntervalMs", &raw.scrape_interval_ms)?;
    let timeout = r.own("scrapeTimeoutMs", &raw.scrape_timeout_ms)?;
    let max_age = r.own("metricsMaxAgeMs", &raw.metrics_max_age_ms)?;
    if source == MetricsSource::Host {
        return Ok(None);
    }
    let cluster = cluster.filter(|c| !c.is_empty()).ok_or_else(|| {
        r.err(
            "scrapeCluster",
            "missing (the Envoy cluster the scrape callouts use, e.g. an ORIGINAL_DST cluster)",
        )
    })?;
    let path = path.unwrap_or_else(|| "/metrics".to_string());
    if !path.starts_with('/') || path.contains([' ', '\r', '\n']) {
        return Err(r.err("scrapePath", "must start with '/' and hold no spaces"));
    }
    if port == Some(0) {
        return Err(r.err("scrapePort", "0 is not a port"));
    }
    let host_header = host_header.unwrap_or_else(|| "x-envoy-original-dst-host".to_string());
    if !is_header_name(&host_header) {
        return Err(r.err(
            "scrapeHostHeader",
            "must be a header name (letters, digits, '-', '_')",
        ));
    }
    let interval_ms = interval.unwrap_or(DEFAULT_INTERVAL_MS);
    if !(50..=60_000).contains(&interval_ms) {
        return Err(r.err(
            "scrapeIntervalMs",
            format!("{interval_ms} ms is outside 50-60000"),
        ));
    }
    let timeout_ms = timeout.unwrap_or(DEFAULT_TIMEOUT_MS.min(interval_ms));
    if !(10..=60_000).contains(&timeout_ms) {
        return Err(r.err(
            "scrapeTimeoutMs",
            format!("{timeout_ms} ms is outside 10-60000"),
        ));
    }
    let max_age_ms = max_age.unwrap_or(DEFAULT_MAX_AGE_MS.max(3 * interval_ms));
    if max_age_ms < interval_ms {
        return Err(r.err(
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
