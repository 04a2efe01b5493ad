//! Prometheus text exposition parser (format 0.0.4, as emitted by `prometheus_client` and the Go
//! client), tolerant of what model servers really emit.
//!
//! Never fails as a whole and never panics: a malformed line is skipped, counted in
//! [`ParseStats`] and, when its name can be read, its family marked ([`Exposition::gap`]), so a
//! reader never takes the rest of that family for all of it; work is bounded by the `MAX_*`
//! constants (over-limit input is cut and flagged in [`ParseStats::truncated`]). Output memory
//! is bounded by the input size, itself capped at [`MAX_INPUT_BYTES`]. The reading loop is in
//! `page`, one line in `line`.

mod exposition;
mod line;
mod page;

pub use super::scan::{LineError, MAX_LABEL_VALUE_LEN, MAX_LIST_LABEL_VALUE_LEN, MAX_NAME_LEN};
pub use exposition::{
    family, label_value_limit, Exposition, Gap, MetricType, ParseStats, Sample, Truncation,
    LIST_LABEL_FAMILIES, MAX_INPUT_BYTES, MAX_LABELS, MAX_LINES, MAX_MALFORMED_FAMILIES,
    MAX_SERIES, MAX_TYPES,
};

/// Parses a whole exposition, keeping every sample.
pub fn parse(input: &[u8]) -> Exposition {
    parse_filtered(input, |_| true)
}

/// Parses an exposition, materialising only samples (and `# TYPE` entries) whose series name
/// `wanted` accepts. Rejected lines cost a name scan, no allocation. `wanted` sees the full
/// series name (`…_bucket`, `…_total`), not the family name.
pub fn parse_filtered<F: FnMut(&str) -> bool>(input: &[u8], wanted: F) -> Exposition {
    parse_page(input, MAX_INPUT_BYTES, wanted)
}

/// [`parse_filtered`] for a page its producer cuts at `cut_at` bytes (the scraper's read limit,
/// Higress's 64 KiB health-check body, docs/higress-abi.md §7): a page that long or longer (or
/// over [`MAX_INPUT_BYTES`]) is read as cut. Its partial last line is dropped, so `1234` cut to
/// `12` is never read as 12; [`ParseStats::truncated`] and [`Exposition::open_family`] tell the
/// mapping which families may be incomplete ([`Exposition::is_complete`]). A whole page that is
/// exactly `cut_at` long cannot be told from a cut one and is read as cut too.
pub fn parse_page<F: FnMut(&str) -> bool>(input: &[u8], cut_at: usize, wanted: F) -> Exposition {
    page::parse_page(input, cut_at, wanted)
}

#[cfg(test)]
mod tests;
