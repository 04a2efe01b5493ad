//! Mapping one parsed page to an [`EndpointMetrics`] snapshot: which family each field reads,
//! how the series of one family aggregate, and when a value is unknown.
//!
//! Aggregation across series of one family (data-parallel and multi-model pods, details in
//! [`crate::model_metrics::read`]): queue and running counts are **summed** over data-parallel
//! groups (a DP pod behind one API server takes the whole pod's load; GIE instead reads the first
//! series only, docs/model-server-metrics.md §1.4); KV usage is the **mean** over groups: the API
//! server's own DP balancer spreads requests over ranks, so the pod's headroom is the aggregate
//! free cache; max would shed a whole pod for one hot rank.
//!
//! A value that cannot be trusted (page cut before it, NaN/±Inf, out of range) is unknown, never
//! 0: an unknown load signal (waiting, running, KV use, vLLM sleep state) makes the pod unknown
//! ([`MapError::LoadUnknown`]), an unknown optional one is `None`.
//! [`super::snapshot::Scrape::unknown`] says which and why, for the caller's log.

use super::detect::detect_engine;
use super::snapshot::{EndpointMetrics, ExtraMetric, LoraInfo, MapError};
use crate::model_metrics::names::{ModelServer, Sel, SPECS, TRITON_KV, VLLM_LORA, VLLM_SLEEP};
use crate::model_metrics::prom::{Exposition, Sample};
use crate::model_metrics::read::{
    breakdown_label, check, Agg, Aggregation, Range, Read, Reader, Unknown, UnknownValue,
};

/// Maps a parsed page to a snapshot. Optional families (KV on engines without it, LoRA, prefix,
/// cache config, `target_metric`) only ever become `None`.
pub fn map_exposition(
    expo: &Exposition,
    extra: Option<&ExtraMetric>,
) -> Result<EndpointMetrics, MapError> {
    map_noting(expo, extra).0
}

fn sels(
    list: &'static [Sel],
) -> impl Iterator<Item = (&'static str, Option<(&'static str, &'static str)>)> {
    list.iter().map(|x| (x.name, x.label))
}

/// [`map_exposition`], plus why values were unknown.
pub(super) fn map_noting(
    expo: &Exposition,
    extra: Option<&ExtraMetric>,
) -> (Result<EndpointMetrics, MapError>, Vec<UnknownValue>) {
    let mut r = Reader::new(expo);
    let res = map_with(&mut r, extra);
    (res, r.notes)
}

fn map_with(r: &mut Reader<'_>, extra: Option<&ExtraMetric>) -> Result<EndpointMetrics, MapError> {
    let expo = r.expo;
    let engine = detect_engine(expo).ok_or(MapError::UnknownEngine)?;
    let spec = SPECS
        .iter()
        .find(|sp| sp.engine == engine)
        .ok_or(MapError::UnknownEngine)?;
    let asleep = match engine {
        ModelServer::Vllm => vllm_asleep(r),
        _ => Some(false),
    };
    if asleep == Some(true) {
        return Err(MapError::Asleep(engine));
    }
    let waiting = r.first(sels(spec.waiting), Aggregation::Sum, Range::Count);
    let queues: Vec<Read> = spec
        .queues
        .iter()
        .map(|q| r.first(sels(q), Aggregation::Sum, Range::Count))
        .collect();
    let waiting = queues.iter().fold(waiting, |acc, q| add(acc, *q));
    let running = r.first(sels(spec.running), Aggregation::Sum, Range::Count);
    let kv = match r.first(sels(spec.kv), Aggregation::Mean, Range::Ratio) {
        Read::Absent if engine == ModelServer::TritonTrtLlm => triton_kv_fallback(r),
        other => other,
    };
    if [waiting, running, kv].contains(&Read::Unknown) || asleep.is_none() {
        return Err(MapError::LoadUnknown(engine));
    }
    let (waiting, running) = match (waiting, running) {
        (Read::Absent, Read::Absent) => return Err(MapError::NoLoadMetrics(engine)),
        (w, r) => (agg_of(w), agg_of(r)),
    };
    let mut prefix_cache_counters = None;
    for (h, q) in spec.hit_counters {
        let hits = r.first_optional([(*h, None)], Aggregation::Sum, Range::NonNegative);
        let queries = r.first_optional([(*q, None)], Aggregation::Sum, Range::NonNegative);
        if let (Some(hits), Some(queries)) = (hits.value(), queries.value()) {
            prefix_cache_counters = Some((hits, queries));
            break;
        }
    }
    let prefix_hit_rate = r
        .first_optional(sels(spec.hit_rate), Aggregation::Mean, Range::HitRate)
        .value()
        .or_else(|| {
            let (h, q) = prefix_cache_counters?;
            let rate = (q > 0.0).then_some(h / q)?;
            check(rate, Range::Ratio).ok().flatten()
        });
    let (mut block_size, mut num_gpu_blocks) = match spec.cache_info {
        Some((family, bs, nb)) => cache_info(expo, family, bs, nb),
        None => (None, None),
    };
    block_size = block_size.or_else(|| {
        r.first_optional(sels(spec.block_size), Aggregation::Max, Range::NonNegative)
            .value()
            .and_then(to_u32)
    });
    num_gpu_blocks = num_gpu_blocks.or_else(|| {
        r.first_optional(sels(spec.num_blocks), Aggregation::Sum, Range::NonNegative)
            .value()
            .and_then(to_u64)
    });
    let extra_value = extra.and_then(|x| {
        let by = breakdown_label(&x.name);
        r.first_by([(x.name.as_str(), None)], x.aggregation, Range::Any, by)
            .value()
    });
    let extra_counts_requests = extra.is_some_and(|x| {
        spec.waiting
            .iter()
            .chain(spec.running)
            .any(|sel| sel.label.is_none() && sel.name == x.name)
    });
    let lora = if engine == ModelServer::Vllm {
        vllm_lora(r)
    } else {
        None
    };
    Ok(EndpointMetrics {
        engine,
        waiting: waiting.map_or(0.0, |a| a.value),
        running: running.map_or(0.0, |a| a.value),
        kv_usage: kv.value(),
        lora,
        prefix_hit_rate,
        prefix_cache_counters,
        block_size,
        num_gpu_blocks,
        dp_groups: waiting.or(running).map_or(0, |a| a.groups),
        extra: extra_value,
        extra_counts_requests,
    })
}

fn agg_of(r: Read) -> Option<Agg> {
    match r {
        Read::Value(a) => Some(a),
        _ => None,
    }
}

/// Waiting work from several queues: unknown if any is, absent only if all are.
fn add(a: Read, b: Read) -> Read {
    match (a, b) {
        (Read::Unknown, _) | (_, Read::Unknown) => Read::Unknown,
        (Read::Value(x), Read::Value(y)) => Read::Value(Agg {
            value: x.value + y.value,
            groups: x.groups.max(y.groups),
        }),
        (Read::Value(x), Read::Absent) | (Read::Absent, Read::Value(x)) => Read::Value(x),
        (Read::Absent, Read::Absent) => Read::Absent,
    }
}

/// `Some(true)` when any engine of the pod sleeps (`awake` 0, or `weights_offloaded` /
/// `discard_all` 1); `Some(false)` when all are awake or the page has no sleep family (vLLM
/// before the metric); `None` when unknown (cut page, NaN, a value outside 0..=1).
fn vllm_asleep(r: &mut Reader<'_>) -> Option<bool> {
    if let Some(gap) = r.expo.gap(VLLM_SLEEP) {
        r.note(VLLM_SLEEP, gap.into());
        return None;
    }
    let mut asleep = false;
    for smp in r.expo.series(VLLM_SLEEP) {
        let v = match check(smp.value, Range::Ratio) {
            Ok(v) => v.unwrap_or(0.0),
            Err(why) => {
                r.note(VLLM_SLEEP, why);
                return None;
            }
        };
        asleep |= match smp.label("sleep_state") {
            Some("awake") => v < 0.5,
            Some("weights_offloaded" | "discard_all") => v >= 0.5,
            _ => false,
        };
    }
    Some(asleep)
}

/// LoRA state, or `None` when the pod has none (LoRA off) or it is unknown: a family the cut
/// went through or with a malformed line may have lost its newest series, and an older one could
/// claim a free slot or an adapter long gone (the cut and malformed cases are noted).
fn vllm_lora(r: &mut Reader<'_>) -> Option<LoraInfo> {
    let expo = r.expo;
    if let Some(gap) = expo.gap(VLLM_LORA) {
        if expo.has(VLLM_LORA) || expo.malformed_in(VLLM_LORA) {
            r.note(VLLM_LORA, gap.into());
        }
        return None;
    }
    match latest_lora(expo) {
        Ok(l) => l,
        Err(why) => {
            r.note(VLLM_LORA, why);
            None
        }
    }
}

/// Picks the `vllm:lora_requests_info` series with the largest value: the value is the update
/// time and every label combination seen stays exported (docs/model-server-metrics.md §1.1; GIE
/// `getLatestMetric`). `None` without the family, or when its state is unknown.
pub fn lora_info(expo: &Exposition) -> Option<LoraInfo> {
    match expo.gap(VLLM_LORA) {
        None => latest_lora(expo).ok().flatten(),
        Some(_) => None,
    }
}

/// The newest series' state. Unknown when a series' time is not finite (which is newest cannot
/// be told) or a list is longer than [`MAX_ADAPTERS`] (cutting it would drop adapters that run).
fn latest_lora(expo: &Exposition) -> Result<Option<LoraInfo>, Unknown> {
    let mut latest: Option<&Sample> = None;
    for x in expo.series(VLLM_LORA) {
        if !x.value.is_finite() {
            return Err(Unknown::NotFinite);
        }
        if latest.is_none_or(|best| x.value > best.value) {
            latest = Some(x);
        }
    }
    let Some(latest) = latest else {
        return Ok(None);
    };
    Ok(Some(LoraInfo {
        running: split_list(latest.label("running_lora_adapters"))?,
        waiting: split_list(latest.label("waiting_lora_adapters"))?,
        max_lora: latest
            .label("max_lora")
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0),
    }))
}

/// Adapters one list may name (1,000 adapters fit, as the family's label limit does,
/// `prom::LIST_LABEL_FAMILIES`); a longer list makes the state unknown rather than cut.
const MAX_ADAPTERS: usize = 4096;

fn split_list(v: Option<&str>) -> Result<Vec<String>, Unknown> {
    let list: Vec<String> = v
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .take(MAX_ADAPTERS + 1)
        .map(str::to_owned)
        .collect();
    if list.len() > MAX_ADAPTERS {
        return Err(Unknown::OutOfRange);
    }
    Ok(list)
}

/// `used / max` blocks for Triton builds without the `fraction` series.
fn triton_kv_fallback(r: &mut Reader<'_>) -> Read {
    let sel = |t| [(TRITON_KV, Some(("kv_cache_block_type", t)))];
    let used = r.first(sel("used"), Aggregation::Sum, Range::NonNegative);
    let max = r.first(sel("max"), Aggregation::Sum, Range::NonNegative);
    match (used, max) {
        (Read::Unknown, _) | (_, Read::Unknown) => Read::Unknown,
        (Read::Value(u), Read::Value(m)) if m.value > 0.0 => {
            match check(u.value / m.value, Range::Ratio) {
                Ok(Some(value)) => Read::Value(Agg {
                    value,
                    groups: m.groups,
                }),
                Ok(None) => Read::Absent,
                Err(why) => {
                    r.note(TRITON_KV, why);
                    Read::Unknown
                }
            }
        }
        _ => Read::Absent,
    }
}

/// Block size and count from the labels of an info gauge (vLLM: one series per DP engine, same
/// config; the first series wins).
fn cache_info(expo: &Exposition, family: &str, bs: &str, nb: &str) -> (Option<u32>, Option<u64>) {
    let first = match expo.gap(family) {
        None => expo.series(family).next(),
        Some(_) => None,
    };
    let Some(first) = first else {
        return (None, None);
    };
    let num = |k: &str| first.label(k).and_then(|v| v.trim().parse::<u64>().ok());
    (num(bs).and_then(|v| u32::try_from(v).ok()), num(nb))
}

fn to_u32(v: f64) -> Option<u32> {
    (0.0..=f64::from(u32::MAX)).contains(&v).then_some(v as u32)
}

fn to_u64(v: f64) -> Option<u64> {
    (0.0..1.8e19).contains(&v).then_some(v as u64)
}
