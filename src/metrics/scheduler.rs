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
use super::rate_limit::RateLimitWindow;

/// One upstream endpoint as the plugin sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// `ip:port`.
    pub addr: String,
    /// Latest snapshot; `None` when never scraped, scrape failed, stale or unknown engine.
    pub metrics: Option<EndpointMetrics>,
    /// Requests this proxy sent to the endpoint since the snapshot was taken.
    pub in_flight_since_scrape: u32,
}

/// What the scheduler needs from the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestInfo<'a> {
    pub model: &'a str,
    /// LoRA adapter named by `model`, if it names one.
    pub lora_adapter: Option<&'a str>,
    /// May be rejected with 429 under saturation (GIE "sheddable" criticality).
    pub sheddable: bool,
}

/// `metric_policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetricPolicy {
    /// GIE v0 filter tree (spec §3.1).
    #[default]
    Default,
    /// Lowest `(max-min)/N` band of the extra (`target_metric`) value, then random (Higress).
    Least,
    /// Highest band of the extra value, then random (Higress).
    Most,
    /// Lowest weighted score, ties random.
    Weighted,
}

/// Weights of [`MetricPolicy::Weighted`]. Score = queue·norm(waiting) + kv·kv_usage +
/// running·norm(running) + in_flight·norm(in-flight), where norm(x) = (x - min)/(max - min)
/// over the eligible pods (0 when all equal) and kv_usage is already 0..1. Lower is better.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weights {
    pub queue: f64,
    pub kv: f64,
    pub running: f64,
    pub in_flight: f64,
}

impl Default for Weights {
    /// queue 2 and KV 2 as GIE's default `queue-scorer`/`kv-cache-utilization-scorer` weights
    /// (spec §3.2). Running and in-flight are 0: in-flight is already folded into the effective
    /// waiting count, and running is not a GIE default signal.
    fn default() -> Self {
        Self {
            queue: 2.0,
            kv: 2.0,
            running: 0.0,
            in_flight: 0.0,
        }
    }
}

/// Thresholds and knobs; defaults are GIE v0.2+ constants (spec §3.1) unless noted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SchedulerConfig {
    pub policy: MetricPolicy,
    /// Critical requests first keep pods with waiting < this (GIE `queueingThresholdLoRA` = 128
    /// since v0.2.0; v0.1.0 and Higress's fork used 50).
    pub queueing_threshold_lora: f64,
    /// Saturation queue bound: sheddable requests need waiting <= this (GIE
    /// `queueThresholdCritical` = 5; also the GIE saturation detector's queue default).
    pub queue_threshold_critical: f64,
    /// Saturation KV bound: sheddable requests need KV <= this (GIE `kvCacheThreshold` = 0.8).
    pub kv_cache_threshold: f64,
    /// Probability of preferring pods that already run the adapter over pods with a free LoRA
    /// slot (GIE `loraAffinityThreshold` = 0.999).
    pub lora_affinity_threshold: f64,
    pub weights: Weights,
    /// Higress `rate_limit`: max share of the last 100 decisions per pod; 1.0 = off.
    pub rate_limit: f64,
    /// Per-pod batch capacity (e.g. vLLM `max_num_seqs`) for the in-flight correction; `None`
    /// (default) = unknown, every in-flight request counts as queued.
    pub max_running_hint: Option<u32>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            policy: MetricPolicy::Default,
            queueing_threshold_lora: 128.0,
            queue_threshold_critical: 5.0,
            kv_cache_threshold: 0.8,
            lora_affinity_threshold: 0.999,
            weights: Weights::default(),
            rate_limit: 1.0,
            max_running_hint: None,
        }
    }
}

/// Outcome of one selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Route to `candidates[index]`; `rate_limited` when the rate limit moved the pick.
    Pick { index: usize, rate_limited: bool },
    /// Sheddable request and every pod is saturated: answer 429.
    Shed,
    /// No candidate has usable metrics (or none has the target metric): fall back.
    NoMetrics,
    /// Empty candidate list.
    NoCandidates,
}

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
    v.waiting > cfg.queue_threshold_critical || v.kv.is_some_and(|k| k > cfg.kv_cache_threshold)
}

/// GIE v0 decision tree (spec §3.1): a filter that empties the set hands the *original* set on.
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
