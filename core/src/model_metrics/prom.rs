//! Prometheus text exposition parser (format 0.0.4, as emitted by `prometheus_client` and the Go
//! client), tolerant of what model servers really emit.
//!
//! Never fails as a whole and never panics: a malformed line is skipped and counted in
//! [`ParseStats`]; work is bounded by the `MAX_*` constants (over-limit input is cut and flagged in
//! [`ParseStats::truncated`]). Output memory is bounded by the input size, itself capped at
//! [`MAX_INPUT_BYTES`].

use super::scan::{Cursor, Lines};
pub use super::scan::{LineError, MAX_LABEL_VALUE_LEN, MAX_NAME_LEN};

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
    /// On a cut page ([`ParseStats::truncated`]): the family of the last sample line read before
    /// the cut, whose remaining series may lie past it.
    pub open_family: Option<String>,
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

    /// Whether every series of `name` is on the page: always on a whole page; on a cut page only
    /// when the name was seen and its family is not the one the cut went through. A family past
    /// the cut is not on the page at all, so absence proves nothing there.
    pub fn is_complete(&self, name: &str) -> bool {
        self.stats.truncated.is_none()
            || (self.has(name) && self.open_family.as_deref() != Some(family(name)))
    }

    /// Type declared for a family name (`# TYPE` lines), if any.
    pub fn metric_type(&self, family: &str) -> Option<MetricType> {
        self.types
            .iter()
            .find(|(n, _)| n == family)
            .map(|(_, t)| *t)
    }
}

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
pub fn parse_page<F: FnMut(&str) -> bool>(
    input: &[u8],
    cut_at: usize,
    mut wanted: F,
) -> Exposition {
    let mut out = Exposition::default();
    let head = input.get(..MAX_INPUT_BYTES).unwrap_or(input);
    let body = if input.len() >= cut_at.clamp(1, MAX_INPUT_BYTES) {
        out.stats.truncated = Some(Truncation::InputBytes);
        // Drop the partial last line so a cut value ("0.12" of "0.125") is never read.
        match head.iter().rposition(|&b| b == b'\n') {
            Some(nl) => head.get(..nl).unwrap_or_default(),
            None => &[],
        }
    } else {
        input
    };
    // The last sample line's name (kept or filtered): its family is the one a cut went through.
    let mut last_sample: Option<&str> = None;
    for raw in Lines::new(body) {
        if out.stats.lines >= MAX_LINES {
            out.stats.truncated = Some(Truncation::Lines);
            break;
        }
        out.stats.lines += 1;
        let line = raw.strip_suffix(b"\r").unwrap_or(raw);
        match parse_line(line, &mut wanted) {
            Ok(Line::Skip) => {}
            Ok(Line::Filtered(name)) => {
                out.stats.filtered_out += 1;
                last_sample = Some(name);
            }
            Ok(Line::Type(name, ty)) => {
                if out.types.len() < MAX_TYPES {
                    out.types.push((name, ty));
                }
            }
            Ok(Line::Sample(s, name)) => {
                last_sample = Some(name);
                if out.samples.len() >= MAX_SERIES {
                    out.stats.truncated = Some(Truncation::Series);
                    break;
                }
                out.samples.push(s);
            }
            Err(e) => {
                out.stats.malformed += 1;
                if out.stats.first_error.is_none() {
                    out.stats.first_error = Some((out.stats.lines, e));
                }
            }
        }
    }
    out.stats.samples = out.samples.len();
    if out.stats.truncated.is_some() {
        out.open_family = last_sample.map(|n| family(n).to_owned());
    }
    out
}

/// The family a series name belongs to: the name without the suffix a counter, histogram or
/// summary adds (`x_total`, `x_created`, `x_bucket`, … → `x`). Only used to compare names, so
/// stripping a suffix a gauge happens to end with merely groups more names together.
pub fn family(name: &str) -> &str {
    const SUFFIXES: [&str; 7] = [
        "_total", "_created", "_bucket", "_count", "_sum", "_gcount", "_gsum",
    ];
    SUFFIXES
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name)
}

enum Line<'a> {
    Skip,
    Filtered(&'a str),
    Type(String, MetricType),
    /// The sample and its name as it appears in the line.
    Sample(Sample, &'a str),
}

fn parse_line<'a, F: FnMut(&str) -> bool>(
    line: &'a [u8],
    wanted: &mut F,
) -> Result<Line<'a>, LineError> {
    let mut c = Cursor { s: line, i: 0 };
    c.skip_ws();
    match c.peek() {
        None => Ok(Line::Skip),
        Some(b'#') => Ok(parse_comment(&mut c, wanted)),
        Some(_) => parse_sample(&mut c, wanted),
    }
}

/// `# TYPE name type` is kept; `# HELP` and any other comment is skipped. A malformed TYPE line
/// is only a comment, never an error: the samples carry the data.
fn parse_comment<'a, F: FnMut(&str) -> bool>(c: &mut Cursor<'a>, wanted: &mut F) -> Line<'a> {
    c.i += 1;
    c.skip_ws();
    if !c.eat_word(b"TYPE") {
        return Line::Skip;
    }
    c.skip_ws();
    let Ok(name) = c.metric_name() else {
        return Line::Skip;
    };
    if !wanted(name) {
        return Line::Skip;
    }
    c.skip_ws();
    let ty = match c.rest_trimmed() {
        b"counter" => MetricType::Counter,
        b"gauge" => MetricType::Gauge,
        b"histogram" => MetricType::Histogram,
        b"summary" => MetricType::Summary,
        b"untyped" => MetricType::Untyped,
        _ => MetricType::Other,
    };
    Line::Type(name.to_owned(), ty)
}

fn parse_sample<'a, F: FnMut(&str) -> bool>(
    c: &mut Cursor<'a>,
    wanted: &mut F,
) -> Result<Line<'a>, LineError> {
    let name = c.metric_name()?;
    if !wanted(name) {
        return Ok(Line::Filtered(name));
    }
    let mut had_ws = c.skip_ws();
    let mut labels = Vec::new();
    let braces = c.peek() == Some(b'{');
    if braces {
        c.i += 1;
        parse_labels(c, &mut labels)?;
        had_ws = c.skip_ws();
    }
    // `name{…}0.5` is accepted like the Python client does; `name.5` is not a name plus a value.
    let value_tok = c.token();
    if value_tok.is_empty() || !(had_ws || braces) {
        return Err(LineError::MissingValue);
    }
    let value = parse_f64(value_tok).ok_or(LineError::BadValue)?;
    c.skip_ws();
    let ts_tok = c.token();
    let timestamp_ms = if ts_tok.is_empty() {
        None
    } else {
        Some(parse_timestamp(ts_tok).ok_or(LineError::BadTimestamp)?)
    };
    c.skip_ws();
    if c.peek().is_some() {
        return Err(LineError::TrailingGarbage);
    }
    Ok(Line::Sample(
        Sample {
            name: name.to_owned(),
            labels,
            value,
            timestamp_ms,
        },
        name,
    ))
}

/// Parses `name="value",…}` after the `{`. Accepts a trailing comma and spaces around tokens.
fn parse_labels(c: &mut Cursor<'_>, out: &mut Vec<(String, String)>) -> Result<(), LineError> {
    loop {
        c.skip_ws();
        match c.peek() {
            None => return Err(LineError::UnterminatedLabels),
            Some(b'}') => {
                c.i += 1;
                return Ok(());
            }
            Some(_) => {}
        }
        if out.len() >= MAX_LABELS {
            return Err(LineError::TooManyLabels);
        }
        let key = c.label_name()?;
        c.skip_ws();
        if !c.eat(b'=') {
            return Err(LineError::MissingEquals);
        }
        c.skip_ws();
        if !c.eat(b'"') {
            return Err(LineError::MissingQuote);
        }
        let value = c.label_value()?;
        out.push((key.to_owned(), value));
        c.skip_ws();
        match c.peek() {
            Some(b',') => c.i += 1,
            Some(b'}') => {}
            None => return Err(LineError::UnterminatedLabels),
            Some(_) => return Err(LineError::UnterminatedLabels),
        }
    }
}

/// Go-client spellings (`NaN`, `+Inf`, `-Inf`) plus anything Rust's float parser takes
/// (exponents, `inf`, `nan`).
fn parse_f64(tok: &[u8]) -> Option<f64> {
    std::str::from_utf8(tok).ok()?.parse::<f64>().ok()
}

/// Integer milliseconds; a float is accepted (some exporters emit `1.7e12`) if finite and in range.
fn parse_timestamp(tok: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(tok).ok()?;
    if let Ok(v) = s.parse::<i64>() {
        return Some(v);
    }
    let f = s.parse::<f64>().ok()?;
    // i64::MAX as f64 rounds up to 2^63, so use a strict bound.
    if f.is_finite() && f > -9.2e18 && f < 9.2e18 {
        Some(f as i64)
    } else {
        None
    }
}

#[cfg(test)]
mod tests;
