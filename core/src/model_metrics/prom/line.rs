//! One line of the text format: a sample, a `# TYPE` / `# HELP` comment, or nothing. Names are
//! plain (`name{labels} value`) or, as Prometheus 3 writes them for UTF-8 names, quoted inside
//! the braces (`{"name",labels} value`, label names quoted too; the Prometheus text format
//! 1.0 with UTF-8 names). A line that fails says which name it carried, when that name was read
//! whole, so the caller can tell whose family the damage hides a line of.

use super::exposition::{label_value_limit, MetricType, Sample, MAX_LABELS};
use crate::model_metrics::scan::{Cursor, LineError, MAX_LIST_LABEL_VALUE_LEN, MAX_NAME_LEN};
use std::borrow::Cow;

pub(super) enum Line<'a> {
    Skip,
    /// `# HELP name …`, or `# TYPE name …` of an unwanted name: family `name` begins here.
    Comment(Cow<'a, str>),
    /// `# TYPE name type` of a wanted name.
    Type(Cow<'a, str>, MetricType),
    /// A sample line whose name the filter rejected (its rest is not validated).
    Filtered(Cow<'a, str>),
    /// The sample and its name as the line gave it.
    Sample(Sample, Cow<'a, str>),
}

/// A line that could not be read: why, and its name when that was read whole (`None`: the
/// name itself is damaged, so the line may belong to any family).
pub(super) struct Bad<'a> {
    pub(super) name: Option<Cow<'a, str>>,
    pub(super) error: LineError,
}

impl From<LineError> for Bad<'_> {
    fn from(error: LineError) -> Self {
        Bad { name: None, error }
    }
}

pub(super) fn parse_line<'a, F: FnMut(&str) -> bool>(
    line: &'a [u8],
    wanted: &mut F,
) -> Result<Line<'a>, Bad<'a>> {
    let mut c = Cursor { s: line, i: 0 };
    c.skip_ws();
    match c.peek() {
        None => Ok(Line::Skip),
        Some(b'#') => Ok(parse_comment(&mut c, wanted)),
        Some(_) => parse_sample(&mut c, wanted),
    }
}

/// A plain metric name, or a quoted one (Prometheus 3) when the cursor is on a `"`.
fn name<'a>(c: &mut Cursor<'a>) -> Result<Cow<'a, str>, LineError> {
    if c.eat(b'"') {
        let n = c.label_value(MAX_NAME_LEN).map_err(|e| match e {
            LineError::LabelValueTooLong => LineError::NameTooLong,
            other => other,
        })?;
        if n.is_empty() {
            return Err(LineError::BadMetricName);
        }
        return Ok(Cow::Owned(n));
    }
    c.metric_name().map(Cow::Borrowed)
}

/// `# TYPE name type` of a wanted name is kept; `# HELP` and other `# TYPE` lines only say
/// where a family begins; any other comment is skipped. A malformed comment is only a comment,
/// never an error: the samples carry the data.
fn parse_comment<'a, F: FnMut(&str) -> bool>(c: &mut Cursor<'a>, wanted: &mut F) -> Line<'a> {
    c.i += 1;
    c.skip_ws();
    let is_type = c.eat_word(b"TYPE");
    if !is_type && !c.eat_word(b"HELP") {
        return Line::Skip;
    }
    c.skip_ws();
    let Ok(n) = name(c) else {
        return Line::Skip;
    };
    if !is_type || !wanted(&n) {
        return Line::Comment(n);
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
    Line::Type(n, ty)
}

fn parse_sample<'a, F: FnMut(&str) -> bool>(
    c: &mut Cursor<'a>,
    wanted: &mut F,
) -> Result<Line<'a>, Bad<'a>> {
    if c.eat(b'{') {
        return quoted_sample(c, wanted);
    }
    let n = c.metric_name()?;
    // A plain name runs to a space or a brace; anything else glued to it means the name itself
    // is damaged (`vllm:num_req?ests_waiting 40`), whoever's it was.
    if !matches!(c.peek(), Some(b' ' | b'\t' | b'{')) {
        return Err(if wanted(n) {
            Bad {
                name: Some(Cow::Borrowed(n)),
                error: LineError::MissingValue,
            }
        } else {
            LineError::BadMetricName.into()
        });
    }
    if !wanted(n) {
        return Ok(Line::Filtered(Cow::Borrowed(n)));
    }
    let mut labels = Vec::new();
    let rest = (|| {
        let mut had_ws = c.skip_ws();
        let braces = c.eat(b'{');
        if braces {
            parse_labels(c, label_value_limit(n), &mut labels, None)?;
            had_ws = c.skip_ws();
        }
        value_and_timestamp(c, had_ws, braces)
    })();
    sample_line(Cow::Borrowed(n), labels, rest)
}

/// `{…} value` with the name a bare quoted string among the labels (first, as Prometheus 3
/// writes it, or anywhere, as its parser takes it). The whole label set is read to find the
/// name, so values get the longest limit first and the name's own limit after.
fn quoted_sample<'a, F: FnMut(&str) -> bool>(
    c: &mut Cursor<'a>,
    wanted: &mut F,
) -> Result<Line<'a>, Bad<'a>> {
    let mut labels = Vec::new();
    let mut name = None;
    let read = parse_labels(c, MAX_LIST_LABEL_VALUE_LEN, &mut labels, Some(&mut name));
    let Some(n) = name else {
        return Err(read.err().unwrap_or(LineError::BadMetricName).into());
    };
    if !wanted(&n) {
        return Ok(Line::Filtered(Cow::Owned(n)));
    }
    let limit = label_value_limit(&n);
    let rest = read.and_then(|()| {
        if labels.iter().any(|(_, v)| v.len() > limit) {
            return Err(LineError::LabelValueTooLong);
        }
        let had_ws = c.skip_ws();
        value_and_timestamp(c, had_ws, true)
    });
    sample_line(Cow::Owned(n), labels, rest)
}

/// The line of sample `name` once its labels are read: the sample, or the family it spoils.
fn sample_line<'a>(
    name: Cow<'a, str>,
    labels: Vec<(String, String)>,
    rest: Result<(f64, Option<i64>), LineError>,
) -> Result<Line<'a>, Bad<'a>> {
    match rest {
        Ok((value, timestamp_ms)) => Ok(Line::Sample(
            Sample {
                name: name.clone().into_owned(),
                labels,
                value,
                timestamp_ms,
            },
            name,
        )),
        Err(error) => Err(Bad {
            name: Some(name),
            error,
        }),
    }
}

/// The value and optional timestamp after the name and labels. `had_ws`: whitespace came
/// before; `braces`: a label set did.
fn value_and_timestamp(
    c: &mut Cursor<'_>,
    had_ws: bool,
    braces: bool,
) -> Result<(f64, Option<i64>), LineError> {
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
    Ok((value, timestamp_ms))
}

/// Parses `name="value",…}` after the `{`. Accepts a trailing comma, spaces around tokens and
/// quoted label names (Prometheus 3). With `metric` (a line that began with `{`), one entry may
/// be a bare quoted string: the metric's name.
fn parse_labels(
    c: &mut Cursor<'_>,
    limit: usize,
    out: &mut Vec<(String, String)>,
    mut metric: Option<&mut Option<String>>,
) -> Result<(), LineError> {
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
        let key = if c.eat(b'"') {
            let quoted = c
                .label_value(MAX_NAME_LEN)
                .map_err(|_| LineError::BadLabelName)?;
            c.skip_ws();
            if c.peek() != Some(b'=') {
                // A bare quoted string: the metric's name, once, on a line that began with `{`.
                match metric.as_deref_mut() {
                    Some(slot @ None) if !quoted.is_empty() => *slot = Some(quoted),
                    _ => return Err(LineError::BadMetricName),
                }
                if !entry_end(c)? {
                    return Ok(());
                }
                continue;
            }
            quoted
        } else {
            c.label_name()?.to_owned()
        };
        c.skip_ws();
        if !c.eat(b'=') {
            return Err(LineError::MissingEquals);
        }
        c.skip_ws();
        if !c.eat(b'"') {
            return Err(LineError::MissingQuote);
        }
        let value = c.label_value(limit)?;
        out.push((key, value));
        if !entry_end(c)? {
            return Ok(());
        }
    }
}

/// After a label entry: `,` (more may follow: true) or `}` (the set ends: false, eaten).
fn entry_end(c: &mut Cursor<'_>) -> Result<bool, LineError> {
    c.skip_ws();
    match c.peek() {
        Some(b',') => {
            c.i += 1;
            Ok(true)
        }
        Some(b'}') => {
            c.i += 1;
            Ok(false)
        }
        _ => Err(LineError::UnterminatedLabels),
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
