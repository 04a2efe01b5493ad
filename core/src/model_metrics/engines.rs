//! Model-server engines: detection from the metric names present, and mapping of their families
//! to one normalised [`EndpointMetrics`] snapshot per endpoint.
//!
//! Names are from docs/model-server-metrics.md §1 (vLLM §1.1, SGLang §1.2, TRT-LLM/TGI §1.3,
//! GIE protocol §1.4); what is read from each, §2. Matching is always on exact series names.
//!
//! Detection is in the `detect` submodule, the snapshot types in `snapshot`, and the mapping of a
//! page to a snapshot (how the series of a family aggregate, when a value is unknown) in `map`.

mod detect;
mod map;
mod snapshot;

pub use super::names::ModelServer;
use super::prom::{self, ParseStats};
pub use super::read::{Aggregation, Unknown, UnknownValue};
pub use detect::{detect_engine, is_wanted};
use map::map_noting;
pub use map::{lora_info, map_exposition};
pub use snapshot::{EndpointMetrics, ExtraMetric, LoraInfo, MapError, Scrape};

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

/// A Prometheus text line starts with a metric name, `#` or whitespace, or (Prometheus 3, a
/// quoted name) with `{"name",` / `{"name"}`; a JSON document starts with `[`, or with `{` and
/// then a key followed by `:` (or nothing: `{}`).
pub fn looks_like_json(body: &[u8]) -> bool {
    let body = body.strip_prefix(b"\xef\xbb\xbf").unwrap_or(body);
    let mut rest = body.iter().skip_while(|b| b.is_ascii_whitespace());
    match rest.next() {
        Some(b'[') => true,
        Some(b'{') => {
            let mut rest = rest.skip_while(|b| b.is_ascii_whitespace());
            match rest.next() {
                Some(b'"') => after_string(rest).is_some_and(|b| b == b':'),
                _ => true,
            }
        }
        _ => false,
    }
}

/// The first byte after a JSON string's closing quote and any whitespace (`it` is past the
/// opening quote); `None` when the string does not end.
fn after_string<'a>(mut it: impl Iterator<Item = &'a u8>) -> Option<u8> {
    loop {
        match it.next()? {
            b'\\' => {
                it.next()?;
            }
            b'"' => break,
            _ => {}
        }
    }
    it.find(|b| !b.is_ascii_whitespace()).copied()
}

#[cfg(test)]
mod malformed_tests;
#[cfg(test)]
mod readings_tests;
#[cfg(test)]
mod tests;
