//! What a metrics text said besides its numbers, counted and logged: a cut page, values read
//! as unknown (cut off, NaN/±Inf, out of range, a malformed line), malformed lines, a JSON
//! answer where Prometheus text was expected (trtllm-serve's `/metrics`), a sleeping vLLM
//! engine. Each problem is logged at warn once per pod until a clean text, at most a few lines
//! per interval ([`NoteLog`]); the counters count every text (malformed lines one by one).

use crate::balancer::telemetry::Telemetry;
use crate::host::{Host, LogLevel};
use crate::model_metrics::engines::Scrape;
use crate::model_metrics::note_log::NoteLog;
use crate::model_metrics::{MapError, Unknown};
use crate::stats::Counter;

/// Where the text came from, for a log line that says what to change.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// The plugin's scraper, at this path; `bytes`: the page's size as the host gave it.
    Scrape { path: &'a str, bytes: usize },
    /// Higress's host list: the body of the host's active health check, `bytes` of it kept.
    HealthCheck { bytes: usize },
}

/// The Prometheus path of trtllm-serve (its `/metrics` answers JSON iteration statistics).
const TRTLLM_PROMETHEUS_PATH: &str = "/prometheus/metrics";

/// Keys of the problems that are not one value's ([`NoteLog`] remembers them per pod).
const KEY_JSON: &str = "json";
const KEY_ASLEEP: &str = "asleep";
const KEY_CUT: &str = "cut";
const KEY_MALFORMED: &str = "malformed";

#[derive(Debug, Default)]
pub struct Report {
    log: NoteLog,
}

impl Report {
    pub fn text(
        &mut self,
        host: &mut dyn Host,
        tel: &Telemetry,
        pod: &str,
        source: Source<'_>,
        out: &Scrape,
    ) {
        let cut = out.stats.truncated.is_some();
        if cut {
            tel.inc(host, Counter::MetricsTruncated);
        }
        if !out.unknown.is_empty() {
            tel.inc(host, Counter::MetricsUnknownValue);
        }
        if out.stats.malformed > 0 {
            let n = i64::try_from(out.stats.malformed).unwrap_or(i64::MAX);
            tel.add(host, Counter::MetricsMalformed, n);
        }
        let mut keys: Vec<String> = out
            .unknown
            .iter()
            .map(|u| format!("{} {}", u.metric, u.why.as_str()))
            .collect();
        match out.result {
            Err(MapError::NotPrometheus) => {
                tel.inc(host, Counter::MetricsNotPrometheus);
                keys.push(KEY_JSON.into());
            }
            Err(MapError::Asleep(_)) => keys.push(KEY_ASLEEP.into()),
            _ => {}
        }
        // The cut left the pod without metrics: before any known family, or a load family
        // past it (docs/model-server-metrics.md §2 "Cut pages").
        let cut_unknown = cut
            && match out.result {
                Err(MapError::UnknownEngine) => true,
                Err(MapError::LoadUnknown(_)) => out.unknown.iter().any(|u| u.why == Unknown::Cut),
                _ => false,
            };
        if cut_unknown {
            keys.push(KEY_CUT.into());
        }
        if out.stats.malformed > 0 {
            keys.push(KEY_MALFORMED.into());
        }
        if keys.is_empty() {
            self.log.clear(pod);
            return;
        }
        // A sleeping engine is a state an operator chose, not a fault.
        let level = match out.result {
            Err(MapError::Asleep(_)) => LogLevel::Info,
            _ => LogLevel::Warn,
        };
        if !tel.enabled(level) {
            return;
        }
        let fresh = self.log.admit(pod, &keys, host.now_ms());
        if fresh.is_empty() {
            return;
        }
        let line = describe(pod, source, out, &fresh);
        tel.log(host, level, 0, format_args!("{line}"));
    }
}

/// The log line for the problems of `fresh` (keys not logged for the pod yet).
fn describe(pod: &str, source: Source<'_>, out: &Scrape, fresh: &[String]) -> String {
    let from = match source {
        Source::Scrape { path, .. } => format!("scrape of {pod}{path}"),
        Source::HealthCheck { .. } => format!("health-check body of {pod}"),
    };
    let has = |k: &str| fresh.iter().any(|f| f == k);
    let values: Vec<&str> = fresh
        .iter()
        .map(String::as_str)
        .filter(|k| ![KEY_JSON, KEY_ASLEEP, KEY_CUT, KEY_MALFORMED].contains(k))
        .collect();
    let mut line = match out.result {
        Err(MapError::NotPrometheus) => match source {
            Source::Scrape { .. } => format!(
                "{from}: JSON, not Prometheus text; trtllm-serve serves Prometheus text at \
                 {TRTLLM_PROMETHEUS_PATH} (set scrapePath): endpoint unknown"
            ),
            Source::HealthCheck { .. } => format!(
                "{from}: JSON, not Prometheus text; trtllm-serve serves Prometheus text at \
                 {TRTLLM_PROMETHEUS_PATH}: point the health check there: endpoint unknown"
            ),
        },
        Err(MapError::Asleep(_)) => {
            format!("{from}: vllm:engine_sleep_state says asleep: not a candidate")
        }
        Err(MapError::UnknownEngine) if has(KEY_CUT) => {
            format!("{from}: cut before any family of a known engine: endpoint unknown")
        }
        Err(MapError::LoadUnknown(_)) if !values.is_empty() => format!(
            "{from}: unknown {}: endpoint not a candidate until a whole, valid page",
            values.join(", ")
        ),
        _ if !values.is_empty() => format!("{from}: unknown {} (ignored)", values.join(", ")),
        Err(MapError::LoadUnknown(_)) => {
            format!("{from}: endpoint not a candidate until a whole, valid page")
        }
        _ => from,
    };
    if has(KEY_CUT) {
        line.push_str(&cut_hint(source));
    }
    if has(KEY_MALFORMED) {
        let first = out
            .stats
            .first_error
            .map(|(at, e)| format!(", the first at line {at}: {e}"))
            .unwrap_or_default();
        line.push_str(&format!(
            "; {} malformed line(s){first}: their families read as unknown",
            out.stats.malformed
        ));
    }
    line
}

/// What a cut page costs and how to avoid it, with the page's size.
fn cut_hint(source: Source<'_>) -> String {
    match source {
        Source::HealthCheck { bytes } => format!(
            "; Higress keeps the first 64 KiB of a health-check body ({bytes} bytes here): a \
             vLLM <= 0.10 or V0 page, or an SGLang page without its disaggregation queue \
             gauges, always reads unknown when cut; use the plugin's own scraper \
             (metricsSource: scrape, which reads 4 MiB) or a page under 64 KiB \
             (docs/metrics.md \"Cut pages\")"
        ),
        Source::Scrape { bytes, .. } => format!(
            "; the page is {bytes} bytes and the scraper reads the first 4 MiB: a page under \
             4 MiB reads whole (docs/metrics.md \"Cut pages\")"
        ),
    }
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
