//! Reading one signal off a parsed page ([`super::engines`] says which): the series of a name are
//! checked and aggregated, and a value that cannot be trusted is **unknown**, never 0 — a pod
//! whose queue reads 0 looks idle (docs/model-server-metrics.md §2).
//!
//! Aggregation across series of one name (data-parallel and multi-model pods):
//! * series are grouped by (`model_name`, `model`, `engine`|`dp_rank`); series inside one group
//!   that differ only by other labels (SGLang `tp_rank`/`pp_rank`, `priority`, extra labels) are
//!   replicas of one scheduler's state, so the group takes their **max**;
//! * counts are **summed** over groups, ratios **averaged** ([`Aggregation`]).
//!
//! A value is unknown when its family may lie past the cut of a cut page, or has a malformed
//! line ([`Exposition::gap`]), or when any of its series is NaN/±Inf or outside the signal's
//! [`Range`]: one bad data-parallel rank would otherwise be dropped from a sum, and the pod would
//! look less loaded than it is.

use super::prom::{Exposition, Gap, Sample};

/// How the series of a configured extra metric combine into one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Aggregation {
    /// Max within a DP group, summed over groups (right for counts).
    #[default]
    Sum,
    /// Max within a DP group, mean over groups (right for ratios).
    Mean,
    /// Max over all series.
    Max,
}

/// Why a value is unknown rather than a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unknown {
    /// The page was cut at a size limit before the value's family, or inside it.
    Cut,
    /// A series is NaN or ±Inf.
    NotFinite,
    /// A series lies outside the signal's range (a negative count, a KV use over 1, …).
    OutOfRange,
    /// A line of the family could not be parsed (a label value over the limit, a sidecar's or a
    /// proxy's damage), so the lines read are not all of it.
    Malformed,
}

impl From<Gap> for Unknown {
    fn from(g: Gap) -> Self {
        match g {
            Gap::Cut => Unknown::Cut,
            Gap::Malformed => Unknown::Malformed,
        }
    }
}

impl Unknown {
    pub fn as_str(self) -> &'static str {
        match self {
            Unknown::Cut => "page cut at the size limit",
            Unknown::NotFinite => "NaN or Inf",
            Unknown::OutOfRange => "out of range",
            Unknown::Malformed => "a malformed line",
        }
    }
}

/// A value read as unknown: its series name and why.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UnknownValue {
    pub metric: String,
    pub why: Unknown,
}

/// Notes kept per page; a page with more unknown values only repeats the same story.
pub const MAX_NOTES: usize = 16;

/// What values a signal may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Range {
    /// Requests (queued, running): 0..=[`MAX_COUNT`].
    Count,
    /// Counters and block counts: 0 or more.
    NonNegative,
    /// A share, 0..=1 (a rounding overshoot of [`RATIO_SLACK`] is clamped).
    Ratio,
    /// A hit rate: a [`Range::Ratio`], but negative means "no queries yet" (vLLM V0 emits -1,
    /// docs/model-server-metrics.md §1.1): no value rather than a bad one.
    HitRate,
    /// A configured `target_metric`: any finite value.
    Any,
}

/// No model server queues or runs a billion requests: such a count is garbage.
pub(super) const MAX_COUNT: f64 = 1e9;
/// Engines compute shares as `used / total` in floating point.
pub(super) const RATIO_SLACK: f64 = 1e-6;

/// `Ok(Some(v))` usable (ratios clamped to 1), `Ok(None)` no value, `Err` unknown.
pub(super) fn check(v: f64, range: Range) -> Result<Option<f64>, Unknown> {
    if !v.is_finite() {
        return Err(Unknown::NotFinite);
    }
    let ratio = (0.0..=1.0 + RATIO_SLACK).contains(&v);
    match range {
        Range::Any => Ok(Some(v)),
        Range::Count if (0.0..=MAX_COUNT).contains(&v) => Ok(Some(v)),
        Range::NonNegative if v >= 0.0 => Ok(Some(v)),
        Range::Ratio | Range::HitRate if ratio => Ok(Some(v.min(1.0))),
        Range::HitRate if v < 0.0 => Ok(None),
        _ => Err(Unknown::OutOfRange),
    }
}

/// An aggregated value and the number of groups it came from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Agg {
    pub(super) value: f64,
    pub(super) groups: u32,
}

/// Outcome of reading one signal.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Read {
    Value(Agg),
    /// Not on the page, and the page is whole: the engine does not export it.
    Absent,
    /// See [`Unknown`]; the reason is in [`Reader::notes`].
    Unknown,
}

impl Read {
    pub(super) fn value(self) -> Option<f64> {
        match self {
            Read::Value(a) => Some(a.value),
            _ => None,
        }
    }
}

/// Reads signals off one page, collecting why values were unknown.
pub(super) struct Reader<'a> {
    pub(super) expo: &'a Exposition,
    pub(super) notes: Vec<UnknownValue>,
}

impl<'a> Reader<'a> {
    pub(super) fn new(expo: &'a Exposition) -> Self {
        Reader {
            expo,
            notes: Vec::new(),
        }
    }

    pub(super) fn note(&mut self, metric: &str, why: Unknown) {
        if self.notes.len() < MAX_NOTES && !self.notes.iter().any(|n| n.metric == metric) {
            self.notes.push(UnknownValue {
                metric: metric.to_owned(),
                why,
            });
        }
    }

    /// The first of `names` (each with an optional `label = value` selector) that has a value;
    /// else unknown if any was, else absent. A preferred name whose series are bad (NaN, out of
    /// range) does not hide a readable fallback (vLLM 0.9.2-0.10 export KV use under both names,
    /// docs/model-server-metrics.md §1.1); one that may lie past the cut of a cut page does: the
    /// whole page would have read it, not the fallback.
    pub(super) fn first<'n>(
        &mut self,
        names: impl IntoIterator<Item = (&'n str, Option<(&'n str, &'n str)>)>,
        how: Aggregation,
        range: Range,
    ) -> Read {
        self.first_by(names, how, range, None)
    }

    /// [`Self::first`] for a family broken down by label `by` (`…_by_reason{reason}`): within
    /// a data-parallel group its parts add up ([`aggregate`]).
    pub(super) fn first_by<'n>(
        &mut self,
        names: impl IntoIterator<Item = (&'n str, Option<(&'n str, &'n str)>)>,
        how: Aggregation,
        range: Range,
        by: Option<&str>,
    ) -> Read {
        let mut pending: Vec<(&str, Unknown)> = Vec::new();
        for (name, label) in names {
            match aggregate(self.expo, name, label, how, range, by) {
                Ok(Some(a)) => return Read::Value(a),
                Ok(None) => {}
                Err(Unknown::Cut) => {
                    pending.push((name, Unknown::Cut));
                    break;
                }
                Err(why) => pending.push((name, why)),
            }
        }
        if pending.is_empty() {
            return Read::Absent;
        }
        for (name, why) in pending {
            self.note(name, why);
        }
        Read::Unknown
    }

    /// [`Self::first`] for an optional signal: its absence from a cut page (or one with a line
    /// whose name is damaged) is not worth a note (most pages lack most optional families, and
    /// every such page would say so); a family the cut went through, one with a malformed line,
    /// or a bad value, still is.
    pub(super) fn first_optional<'n>(
        &mut self,
        names: impl IntoIterator<Item = (&'n str, Option<(&'n str, &'n str)>)>,
        how: Aggregation,
        range: Range,
    ) -> Read {
        let before = self.notes.len();
        let read = self.first(names, how, range);
        let expo = self.expo;
        let added = self.notes.split_off(before);
        self.notes.extend(added.into_iter().filter(|n| {
            !matches!(n.why, Unknown::Cut | Unknown::Malformed)
                || expo.has(&n.metric)
                || expo.malformed_in(&n.metric)
        }));
        read
    }
}

/// The label a family is broken down by, from its name (`vllm:num_requests_waiting_by_reason`
/// → `reason`, Prometheus's `_by_<label>` naming): its series are parts of one count, not
/// replicas of it.
pub fn breakdown_label(name: &str) -> Option<&str> {
    let (_, label) = name.rsplit_once("_by_")?;
    let ok = label
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_');
    ok.then_some(label)
}

/// Aggregates the series of `name` whose label matches `label` (see the module doc): `Ok(None)`
/// when none has a value, `Err` when the value is unknown. With a breakdown label `by`, the
/// series of a group are first maxed per value of `by` (replicas of one part), then the parts
/// summed: `waiting_by_reason` of one engine is the sum over its reasons.
pub(super) fn aggregate(
    expo: &Exposition,
    name: &str,
    label: Option<(&str, &str)>,
    how: Aggregation,
    range: Range,
    by: Option<&str>,
) -> Result<Option<Agg>, Unknown> {
    if let Some(gap) = expo.gap(name) {
        return Err(gap.into());
    }
    // (group key, part, max value of the part); pods have a handful of groups, so a Vec beats
    // a map.
    type Part<'s> = ([Option<&'s str>; 3], Option<&'s str>, f64);
    let mut parts: Vec<Part<'_>> = Vec::new();
    for smp in expo.series(name) {
        if let Some((k, v)) = label {
            if smp.label(k) != Some(v) {
                continue;
            }
        }
        let Some(value) = check(smp.value, range)? else {
            continue;
        };
        let key = group_key(smp);
        let part = by.and_then(|b| smp.label(b));
        match parts.iter_mut().find(|(k, p, _)| *k == key && *p == part) {
            Some((_, _, best)) => *best = best.max(value),
            None => parts.push((key, part, value)),
        }
    }
    let mut groups: Vec<([Option<&str>; 3], f64)> = Vec::new();
    for (key, _, value) in parts {
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, total)) => *total += value,
            None => groups.push((key, value)),
        }
    }
    let n = groups.len();
    if n == 0 {
        return Ok(None);
    }
    let sum: f64 = groups.iter().map(|(_, v)| v).sum();
    let value = match how {
        Aggregation::Sum => sum,
        Aggregation::Mean => sum / n as f64,
        Aggregation::Max => groups
            .iter()
            .map(|(_, v)| *v)
            .fold(f64::NEG_INFINITY, f64::max),
    };
    // A sum of finite values can still overflow (1e308 + 1e308).
    if !value.is_finite() {
        return Err(Unknown::NotFinite);
    }
    Ok(Some(Agg {
        value,
        groups: u32::try_from(n).unwrap_or(u32::MAX),
    }))
}

fn group_key(smp: &Sample) -> [Option<&str>; 3] {
    [
        smp.label("model_name"),
        smp.label("model"),
        smp.label("engine").or_else(|| smp.label("dp_rank")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model_metrics::prom;

    #[test]
    fn ranges() {
        assert_eq!(check(3.0, Range::Count), Ok(Some(3.0)));
        assert_eq!(check(-1.0, Range::Count), Err(Unknown::OutOfRange));
        assert_eq!(check(2e9, Range::Count), Err(Unknown::OutOfRange));
        assert_eq!(check(2e12, Range::NonNegative), Ok(Some(2e12)));
        assert_eq!(check(f64::NAN, Range::Any), Err(Unknown::NotFinite));
        assert_eq!(check(f64::INFINITY, Range::Count), Err(Unknown::NotFinite));
        assert_eq!(
            check(f64::NEG_INFINITY, Range::HitRate),
            Err(Unknown::NotFinite)
        );
        assert_eq!(check(1.0 + 1e-9, Range::Ratio), Ok(Some(1.0)));
        assert_eq!(check(1.7, Range::Ratio), Err(Unknown::OutOfRange));
        assert_eq!(check(-0.1, Range::Ratio), Err(Unknown::OutOfRange));
        assert_eq!(check(-1.0, Range::HitRate), Ok(None));
        assert_eq!(check(-5.0, Range::Any), Ok(Some(-5.0)));
    }

    #[test]
    fn one_bad_rank_makes_the_sum_unknown() {
        let e = prom::parse(b"w{engine=\"0\"} 4\nw{engine=\"1\"} NaN\nr{engine=\"0\"} 1e308\nr{engine=\"1\"} 1e308\n");
        let sum = |n| aggregate(&e, n, None, Aggregation::Sum, Range::Any, None);
        assert_eq!(sum("w"), Err(Unknown::NotFinite), "not 4");
        assert_eq!(sum("r"), Err(Unknown::NotFinite), "overflowing sum");
        assert_eq!(sum("absent"), Ok(None));
        let mut r = Reader::new(&e);
        assert_eq!(
            r.first([("w", None)], Aggregation::Sum, Range::Count),
            Read::Unknown
        );
        assert_eq!(
            r.notes,
            vec![UnknownValue {
                metric: "w".into(),
                why: Unknown::NotFinite
            }]
        );
    }
}
