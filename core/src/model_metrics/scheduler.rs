//! Endpoint selection for `endpoint_metrics` over per-pod snapshots. Pure: candidates, request
//! info, config, an optional rate-limit window and a random source in; a [`Decision`] out.
//!
//! Behaviour common to all policies:
//! * **Unknown/stale metrics** (`Candidate::metrics == None`; the caller decides staleness) are
//!   excluded while any candidate has metrics; if none has, the answer is
//!   [`Decision::NoMetrics`] and the caller falls back to least-request.
//! * **In-flight correction**: requests sent since the last scrape are added to the scraped load
//!   (see [`effective_load`]) so a burst does not all land on the pod that looked idle.
//! * **Shedding**: a sheddable request only goes to non-saturated pods (effective waiting <=
//!   `queue_threshold_critical` and KV <= `kv_cache_threshold`); none left → [`Decision::Shed`].
//!   Critical requests are never shed.
//! * **Rate limit**: see [`super::rate_limit`]; applied after the policy's pick.

use super::engines::{EndpointMetrics, LoraInfo};
pub use super::inputs::{Candidate, Decision, MetricPolicy, RequestInfo, SchedulerConfig, Weights};
use super::rate_limit::RateLimitWindow;

/// Scraped load corrected for requests sent since the scrape:
/// `free = if waiting > 0 { 0 } else { max_running_hint - running }` (0 when the hint is unknown),
/// `waiting' = waiting + max(0, in_flight - free)`, `running' = running + min(in_flight, free)`.
/// A pod that already queues has no free batch slot, so everything new queues behind.
pub fn effective_load(
    m: &EndpointMetrics,
    in_flight: u32,
    max_running_hint: Option<u32>,
) -> (f64, f64) {
    let in_flight = f64::from(in_flight);
    let free = if m.waiting > 0.0 {
        0.0
    } else {
        max_running_hint.map_or(0.0, |cap| (f64::from(cap) - m.running).max(0.0))
    };
    let to_batch = in_flight.min(free);
    (m.waiting + (in_flight - to_batch), m.running + to_batch)
}

/// Per-candidate view with the corrections applied.
#[derive(Debug, Clone, Copy)]
struct View<'a> {
    index: usize,
    waiting: f64,
    running: f64,
    kv: Option<f64>,
    in_flight: f64,
    lora: Option<&'a LoraInfo>,
    target: Option<f64>,
}

/// Picks an endpoint. `rng` supplies uniform `u64`s; `window`, if given, is consulted when
/// `cfg.rate_limit < 1` and records the final pick.
pub fn select(
    candidates: &[Candidate],
    req: &RequestInfo<'_>,
    cfg: &SchedulerConfig,
    window: Option<&mut RateLimitWindow>,
    rng: &mut impl FnMut() -> u64,
) -> Decision {
    if candidates.is_empty() {
        return Decision::NoCandidates;
    }
    let mut views: Vec<View<'_>> = candidates
        .iter()
        .enumerate()
        .filter_map(|(index, c)| {
            let m = c.metrics.as_ref()?;
            let (waiting, running) =
                effective_load(m, c.in_flight_since_scrape, cfg.max_running_hint);
            let in_flight = f64::from(c.in_flight_since_scrape);
            Some(View {
                index,
                waiting,
                running,
                kv: m.kv_usage,
                in_flight,
                lora: m.lora.as_ref(),
                target: m.extra.map(|v| {
                    if m.extra_counts_requests {
                        v + in_flight
                    } else {
                        v
                    }
                }),
            })
        })
        .collect();
    if views.is_empty() {
        return Decision::NoMetrics;
    }
    if req.sheddable {
        views.retain(|v| !saturated(v, cfg));
        if views.is_empty() {
            return Decision::Shed;
        }
    }
    let survivors = match cfg.policy {
        MetricPolicy::Default => default_tree(&views, req, cfg, rng),
        MetricPolicy::Least | MetricPolicy::Most => {
            let known: Vec<View<'_>> = views
                .iter()
                .filter(|v| v.target.is_some())
                .copied()
                .collect();
            if known.is_empty() {
                return Decision::NoMetrics;
            }
            let lowest = cfg.policy == MetricPolicy::Least;
            band(&known, |v| v.target.unwrap_or(0.0), lowest)
        }
        MetricPolicy::Weighted => weighted(&views, &cfg.weights),
    };
    let Some(chosen) = pick(&survivors, rng).or_else(|| pick(&views, rng)) else {
        return Decision::NoMetrics;
    };
    finish(candidates, &views, chosen.index, cfg, window, rng)
}

/// Applies the rate limit and records the decision.
fn finish(
    candidates: &[Candidate],
    eligible: &[View<'_>],
    index: usize,
    cfg: &SchedulerConfig,
    window: Option<&mut RateLimitWindow>,
    rng: &mut impl FnMut() -> u64,
) -> Decision {
    let Some(window) = window else {
        return Decision::Pick {
            index,
            rate_limited: false,
        };
    };
    let addr = |i: usize| candidates.get(i).map_or("", |c| c.addr.as_str());
    let mut out = Decision::Pick {
        index,
        rate_limited: false,
    };
    if window.would_exceed(addr(index), cfg.rate_limit) {
        // Higress picks a random other host; we stay within the eligible (non-saturated) set and
        // skip pods that are over the limit themselves.
        let others: Vec<View<'_>> = eligible
            .iter()
            .filter(|v| v.index != index && !window.would_exceed(addr(v.index), cfg.rate_limit))
            .copied()
            .collect();
        if let Some(o) = pick(&others, rng) {
            out = Decision::Pick {
                index: o.index,
                rate_limited: true,
            };
        }
    }
    if let Decision::Pick { index, .. } = out {
        window.record(addr(index));
    }
    out
}

fn saturated(v: &View<'_>, cfg: &SchedulerConfig) -> bool {
    over_thresholds(v.waiting, v.kv, cfg)
}

/// Whether a candidate is saturated by the shedding rule (effective waiting over
/// `queue_threshold_critical`, or KV use over `kv_cache_threshold`); None when its metrics are
/// unknown. The plain-Envoy prefix_cache's load guard leaves such a pod.
pub fn is_saturated(c: &Candidate, cfg: &SchedulerConfig) -> Option<bool> {
    let m = c.metrics.as_ref()?;
    let (waiting, _) = effective_load(m, c.in_flight_since_scrape, cfg.max_running_hint);
    Some(over_thresholds(waiting, m.kv_usage, cfg))
}

fn over_thresholds(waiting: f64, kv: Option<f64>, cfg: &SchedulerConfig) -> bool {
    waiting > cfg.queue_threshold_critical || kv.is_some_and(|k| k > cfg.kv_cache_threshold)
}

/// GIE v0 decision tree (docs/model-server-metrics.md §3.1): a filter that empties the set hands
/// the *original* set on.
fn default_tree<'a>(
    views: &[View<'a>],
    req: &RequestInfo<'_>,
    cfg: &SchedulerConfig,
    rng: &mut impl FnMut() -> u64,
) -> Vec<View<'a>> {
    if req.sheddable {
        // Saturated pods were already removed by `select` (GIE: waiting <= 5 && kv <= 0.8).
        let s = least_queue(views);
        let s = low_cost_lora(&s, req);
        return least_kv(&s);
    }
    let low: Vec<View<'a>> = views
        .iter()
        .filter(|v| v.waiting < cfg.queueing_threshold_lora)
        .copied()
        .collect();
    if low.is_empty() {
        let s = least_queue(views);
        let s = low_cost_lora(&s, req);
        return least_kv(&s);
    }
    let s = lora_soft_affinity(&low, req, cfg, rng);
    let s = least_queue(&s);
    least_kv(&s)
}

/// GIE v0.2 `loRASoftAffinityFilter`: pods running the adapter, with probability
/// `lora_affinity_threshold`, else pods with a free slot. Requests for a base model and pods
/// without LoRA info skip this (pods without info stay eligible through the failure path).
fn lora_soft_affinity<'a>(
    views: &[View<'a>],
    req: &RequestInfo<'_>,
    cfg: &SchedulerConfig,
    rng: &mut impl FnMut() -> u64,
) -> Vec<View<'a>> {
    let Some(adapter) = req.lora_adapter else {
        return views.to_vec();
    };
    let affine: Vec<View<'a>> = views
        .iter()
        .filter(|v| v.lora.is_some_and(|l| l.is_running(adapter)))
        .copied()
        .collect();
    let available: Vec<View<'a>> = views
        .iter()
        .filter(|v| {
            v.lora
                .is_some_and(|l| !l.is_running(adapter) && l.has_free_slot())
        })
        .copied()
        .collect();
    match (affine.is_empty(), available.is_empty()) {
        (false, true) => affine,
        (true, false) => available,
        (false, false) if unit(rng()) < cfg.lora_affinity_threshold => affine,
        (false, false) => available,
        (true, true) => views.to_vec(),
    }
}

/// GIE `lowLoRACostPredicate`: adapter already running, or a free slot to load it.
fn low_cost_lora<'a>(views: &[View<'a>], req: &RequestInfo<'_>) -> Vec<View<'a>> {
    let Some(adapter) = req.lora_adapter else {
        return views.to_vec();
    };
    let ok: Vec<View<'a>> = views
        .iter()
        .filter(|v| {
            v.lora
                .is_some_and(|l| l.is_running(adapter) || l.has_free_slot())
        })
        .copied()
        .collect();
    if ok.is_empty() {
        views.to_vec()
    } else {
        ok
    }
}

fn least_queue<'a>(views: &[View<'a>]) -> Vec<View<'a>> {
    band(views, |v| v.waiting, true)
}

/// Unknown KV counts as the worst known KV (pessimistic but still eligible).
fn least_kv<'a>(views: &[View<'a>]) -> Vec<View<'a>> {
    let worst = views.iter().filter_map(|v| v.kv).fold(f64::NAN, f64::max);
    if worst.is_nan() {
        return views.to_vec();
    }
    band(views, |v| v.kv.unwrap_or(worst), true)
}

/// GIE range filter: keep values within `(max - min) / N` of the min (or of the max when
/// `lowest` is false), N = number of pods — "gives more choices for the next filter".
fn band<'a>(views: &[View<'a>], key: impl Fn(&View<'a>) -> f64, lowest: bool) -> Vec<View<'a>> {
    let (min, max) = views
        .iter()
        .map(&key)
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
    if !(min.is_finite() && max.is_finite()) {
        return views.to_vec();
    }
    let width = (max - min) / views.len().max(1) as f64;
    views
        .iter()
        .filter(|v| {
            let x = key(v);
            if lowest {
                x <= min + width
            } else {
                x >= max - width
            }
        })
        .copied()
        .collect()
}

/// Lowest weighted score (see [`Weights`]); ties (within 1e-9) all survive for the random pick.
fn weighted<'a>(views: &[View<'a>], w: &Weights) -> Vec<View<'a>> {
    let norm = |f: fn(&View<'_>) -> f64| {
        let (lo, hi) = views
            .iter()
            .map(f)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
                (lo.min(x), hi.max(x))
            });
        move |v: &View<'_>| {
            if hi > lo {
                (f(v) - lo) / (hi - lo)
            } else {
                0.0
            }
        }
    };
    let nq = norm(|v| v.waiting);
    let nr = norm(|v| v.running);
    let ni = norm(|v| v.in_flight);
    let worst_kv = views.iter().filter_map(|v| v.kv).fold(0.0, f64::max);
    let scores: Vec<f64> = views
        .iter()
        .map(|v| {
            w.queue * nq(v)
                + w.kv * v.kv.unwrap_or(worst_kv)
                + w.running * nr(v)
                + w.in_flight * ni(v)
        })
        .collect();
    let best = scores.iter().copied().fold(f64::INFINITY, f64::min);
    views
        .iter()
        .zip(&scores)
        .filter(|(_, s)| **s <= best + 1e-9)
        .map(|(v, _)| *v)
        .collect()
}

fn pick<'a>(views: &[View<'a>], rng: &mut impl FnMut() -> u64) -> Option<View<'a>> {
    let n = u64::try_from(views.len()).ok().filter(|n| *n > 0)?;
    let i = usize::try_from(rng() % n).ok()?;
    views.get(i).copied()
}

/// Uniform in [0, 1) from the top 53 bits.
fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests;
