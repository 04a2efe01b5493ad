//! What a parse yields ([`Exposition`]: the kept samples, `# TYPE` entries, statistics, and
//! which families the page may not hold whole) and the parser's bounds.

use crate::model_metrics::scan::{LineError, MAX_LABEL_VALUE_LEN, MAX_LIST_LABEL_VALUE_LEN};

/// Bytes of input looked at; the rest is dropped (cut at the last complete line). A page this
/// long or longer is read as cut (see [`parse_page`]). Higress stored only 64 KiB of the probe
/// body (docs/higress-abi.md §7), which cut real vLLM expositions with many histograms; 4 MiB is
/// ~40x the biggest vLLM page we have seen.
pub const MAX_INPUT_BYTES: usize = 4 * 1024 * 1024;
/// Lines looked at (comments and blank lines included).
pub const MAX_LINES: usize = 200_000;
/// Samples kept in one [`Exposition`].
pub const MAX_SERIES: usize = 50_000;
/// `# TYPE` entries kept.
pub const MAX_TYPES: usize = 10_000;
/// Labels per sample; a line with more is malformed.
pub const MAX_LABELS: usize = 64;
/// Families whose label values are lists and may be up to [`MAX_LIST_LABEL_VALUE_LEN`] long:
/// vLLM's LoRA info names every adapter in two labels (docs/model-server-metrics.md §1.1).
pub const LIST_LABEL_FAMILIES: &[&str] = &["vllm:lora_requests_info"];
/// Families with a malformed line remembered by name; past this many every family reads as
/// damaged ([`Exposition::gap`]).
pub const MAX_MALFORMED_FAMILIES: usize = 32;

/// The longest label value a line of series `name` may carry.
pub fn label_value_limit(name: &str) -> usize {
    if LIST_LABEL_FAMILIES.contains(&name) {
        MAX_LIST_LABEL_VALUE_LEN
    } else {
        MAX_LABEL_VALUE_LEN
    }
}

/// Type declared by a `# TYPE` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
    Summary,
    Untyped,
    /// Anything else (e.g. OpenMetrics `info`, `stateset`); kept rather than rejected.
    Other,
}

/// One series value: `name{labels} value [timestamp]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Full series name, e.g. `vllm:e2e_request_latency_seconds_bucket`.
    pub name: String,
    /// Labels in exposition order, unescaped.
    pub labels: Vec<(String, String)>,
    /// May be NaN or ±Inf; consumers decide what that means.
    pub value: f64,
    /// Milliseconds since the epoch, if the line had one.
    pub timestamp_ms: Option<i64>,
}

impl Sample {
    /// Value of label `key` (first occurrence).
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Which limit cut the input short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Truncation {
    InputBytes,
    Lines,
    Series,
}

/// What the parser did; cheap to copy into counters and logs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParseStats {
    /// Lines looked at.
    pub lines: usize,
    /// Samples kept.
    pub samples: usize,
    /// Sample lines whose name the filter rejected (their rest is not validated).
    pub filtered_out: usize,
    /// Lines skipped as malformed.
    pub malformed: usize,
    /// 1-based line number and cause of the first malformed line.
    pub first_error: Option<(usize, LineError)>,
    pub truncated: Option<Truncation>,
}

/// Result of a parse: the kept samples, the `# TYPE` declarations, and statistics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exposition {
    pub samples: Vec<Sample>,
    pub types: Vec<(String, MetricType)>,
    pub stats: ParseStats,
    /// On a cut page ([`ParseStats::truncated`]): the family the cut went through, whose
    /// remaining series may lie past it: that of the last line naming a family (a sample line,
    /// kept or filtered, or a `# HELP` / `# TYPE` line), or of the partial line the cut left
    /// when that names another family.
    pub open_family: Option<String>,
    /// Families with a malformed line: their other lines are not all of them, so they read as
    /// unknown ([`Gap::Malformed`]). A line whose own name is damaged marks the families of the
    /// sample lines on either side of it, the ones it most likely belongs to.
    pub malformed_families: Vec<String>,
    /// A malformed line whose name could not be read: it may have been any family's only line,
    /// so a family absent from the page proves nothing (as on a cut page).
    pub malformed_unnamed: bool,
}

/// Why a family of a page may be incomplete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gap {
    /// The page was cut before the family ended (or, absent, before it began).
    Cut,
    /// A line of the family was malformed (or, absent, a line with a damaged name may have
    /// been its only one).
    Malformed,
}

impl Exposition {
    /// All samples with exactly this series name (never a prefix match: `vllm:x_hits` must not
    /// pick up `vllm:x_hits_created`).
    pub fn series<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }

    /// Whether any sample has this exact series name.
    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }

    /// Whether every series of `name` is on the page ([`Self::gap`] is `None`).
    pub fn is_complete(&self, name: &str) -> bool {
        self.gap(name).is_none()
    }

    /// Why the series of `name` on the page may not be all of them: a malformed line of its
    /// family; on a cut page, the name not seen or its family the one the cut went through (a
    /// family past the cut is not on the page at all, so absence proves nothing there); on a
    /// page with a line whose name is damaged, the name not seen. `None`: the page holds every
    /// series of `name` (or, absent, the producer exports none).
    pub fn gap(&self, name: &str) -> Option<Gap> {
        let fam = family(name);
        if self.malformed_in(name) {
            return Some(Gap::Malformed);
        }
        let seen = self.has(name);
        if self.stats.truncated.is_some() && (!seen || self.open_family.as_deref() == Some(fam)) {
            return Some(Gap::Cut);
        }
        (self.malformed_unnamed && !seen).then_some(Gap::Malformed)
    }

    /// Whether a line of `name`'s family was malformed (or too many families were to tell).
    pub fn malformed_in(&self, name: &str) -> bool {
        let fam = family(name);
        self.malformed_families.len() > MAX_MALFORMED_FAMILIES
            || self.malformed_families.iter().any(|f| f == fam)
    }

    /// Type declared for a family name (`# TYPE` lines), if any.
    pub fn metric_type(&self, family: &str) -> Option<MetricType> {
        self.types
            .iter()
            .find(|(n, _)| n == family)
            .map(|(_, t)| *t)
    }
}

/// What counters, histograms and summaries add to their family's name.
pub(super) const SUFFIXES: [&str; 7] = [
    "_total", "_created", "_bucket", "_count", "_sum", "_gcount", "_gsum",
];

/// The family a series name belongs to: the name without the suffix a counter, histogram or
/// summary adds (`x_total`, `x_created`, `x_bucket`, … → `x`). Only used to compare names, so
/// stripping a suffix a gauge happens to end with merely groups more names together.
pub fn family(name: &str) -> &str {
    SUFFIXES
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name)
}
