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
mod tests {
    use super::*;
    use crate::model_metrics::engines::ModelServer;
    use crate::model_metrics::SplitMix64;

    fn m(waiting: f64, running: f64, kv: Option<f64>) -> EndpointMetrics {
        EndpointMetrics {
            engine: ModelServer::Vllm,
            waiting,
            running,
            kv_usage: kv,
            lora: None,
            prefix_hit_rate: None,
            prefix_cache_counters: None,
            block_size: None,
            num_gpu_blocks: None,
            dp_groups: 1,
            extra: None,
            extra_counts_requests: false,
        }
    }

    fn cand(i: usize, metrics: Option<EndpointMetrics>) -> Candidate {
        Candidate {
            addr: format!("10.0.0.{i}:8000"),
            metrics,
            in_flight_since_scrape: 0,
        }
    }

    fn pods(ms: Vec<EndpointMetrics>) -> Vec<Candidate> {
        ms.into_iter()
            .enumerate()
            .map(|(i, x)| cand(i, Some(x)))
            .collect()
    }

    fn lora(running: &[&str], max_lora: u32) -> Option<LoraInfo> {
        Some(LoraInfo {
            running: running.iter().map(|s| s.to_string()).collect(),
            waiting: vec![],
            max_lora,
        })
    }

    const CRITICAL: RequestInfo<'static> = RequestInfo {
        model: "m",
        lora_adapter: None,
        sheddable: false,
    };
    const SHEDDABLE: RequestInfo<'static> = RequestInfo {
        model: "m",
        lora_adapter: None,
        sheddable: true,
    };

    /// Indices picked over many seeds.
    fn picks(c: &[Candidate], req: &RequestInfo<'_>, cfg: &SchedulerConfig) -> Vec<usize> {
        let mut out: Vec<usize> = (0..200u64)
            .filter_map(|seed| {
                let mut r = SplitMix64(seed);
                match select(c, req, cfg, None, &mut || r.next_u64()) {
                    Decision::Pick { index, .. } => Some(index),
                    _ => None,
                }
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    fn decide(c: &[Candidate], req: &RequestInfo<'_>, cfg: &SchedulerConfig) -> Decision {
        let mut r = SplitMix64(7);
        select(c, req, cfg, None, &mut || r.next_u64())
    }

    #[test]
    fn empty_unknown_and_partial_metrics() {
        let cfg = SchedulerConfig::default();
        assert_eq!(decide(&[], &CRITICAL, &cfg), Decision::NoCandidates);
        assert_eq!(
            decide(&[cand(0, None), cand(1, None)], &CRITICAL, &cfg),
            Decision::NoMetrics
        );
        let c = vec![cand(0, None), cand(1, Some(m(50.0, 1.0, Some(0.9))))];
        assert_eq!(
            picks(&c, &CRITICAL, &cfg),
            vec![1],
            "unknown excluded while others known"
        );
    }

    #[test]
    fn default_tree_least_queue_then_least_kv() {
        let cfg = SchedulerConfig::default();
        // Queue band over 4 pods: [0, 0 + 10/4]; pods 0,1,2 pass; KV band over 3: [0.1, 0.1+0.8/3].
        let c = pods(vec![
            m(0.0, 0.0, Some(0.9)),
            m(2.0, 0.0, Some(0.1)),
            m(1.0, 0.0, Some(0.3)),
            m(10.0, 0.0, Some(0.0)),
        ]);
        assert_eq!(picks(&c, &CRITICAL, &cfg), vec![1, 2]);
    }

    #[test]
    fn default_tree_all_over_queueing_threshold_still_serves_critical() {
        let cfg = SchedulerConfig::default();
        let c = pods(vec![m(300.0, 0.0, Some(0.99)), m(200.0, 0.0, Some(0.99))]);
        assert_eq!(picks(&c, &CRITICAL, &cfg), vec![1]);
    }

    #[test]
    fn lora_affinity_then_free_slot_then_anything() {
        let cfg = SchedulerConfig::default();
        let req = RequestInfo {
            model: "sql-lora",
            lora_adapter: Some("sql-lora"),
            sheddable: false,
        };
        let mut a = m(3.0, 0.0, Some(0.5));
        a.lora = lora(&["sql-lora"], 2);
        let mut b = m(0.0, 0.0, Some(0.1));
        b.lora = lora(&["other"], 2);
        let mut full = m(0.0, 0.0, Some(0.1));
        full.lora = lora(&["x", "y"], 2);
        let no_info = m(0.0, 0.0, Some(0.1));
        // Affinity wins (p = 0.999) over a less loaded pod with a free slot.
        let c = pods(vec![a.clone(), b.clone(), full.clone(), no_info.clone()]);
        let got = picks(&c, &req, &cfg);
        assert_eq!(got, vec![0], "200 seeds never hit the 0.1% exploration");
        // No pod runs it: pods with a free slot.
        let c = pods(vec![b.clone(), full.clone(), no_info.clone()]);
        assert_eq!(picks(&c, &req, &cfg), vec![0]);
        // Nobody can take it: the filter fails open to the whole set.
        let c = pods(vec![full.clone(), no_info.clone()]);
        assert_eq!(picks(&c, &req, &cfg), vec![0, 1]);
        // Exploration: threshold 0 always prefers the free-slot group.
        let cfg0 = SchedulerConfig {
            lora_affinity_threshold: 0.0,
            ..cfg
        };
        let c = pods(vec![a, b]);
        assert_eq!(picks(&c, &req, &cfg0), vec![1]);
    }

    #[test]
    fn sheddable_requests_avoid_saturated_pods_and_shed() {
        let cfg = SchedulerConfig::default();
        let c = pods(vec![
            m(6.0, 0.0, Some(0.1)),
            m(1.0, 0.0, Some(0.85)),
            m(5.0, 0.0, Some(0.8)),
        ]);
        assert_eq!(
            picks(&c, &SHEDDABLE, &cfg),
            vec![2],
            "<= 5 waiting and <= 0.8 KV pass"
        );
        let c = pods(vec![m(6.0, 0.0, Some(0.1)), m(1.0, 0.0, Some(0.85))]);
        assert_eq!(decide(&c, &SHEDDABLE, &cfg), Decision::Shed);
        assert!(
            matches!(decide(&c, &CRITICAL, &cfg), Decision::Pick { .. }),
            "critical never shed"
        );
        for policy in [
            MetricPolicy::Weighted,
            MetricPolicy::Least,
            MetricPolicy::Most,
        ] {
            let cfg = SchedulerConfig { policy, ..cfg };
            assert_eq!(decide(&c, &SHEDDABLE, &cfg), Decision::Shed, "{policy:?}");
        }
    }

    #[test]
    fn in_flight_correction_spreads_a_burst() {
        let idle = m(0.0, 10.0, Some(0.2));
        assert_eq!(effective_load(&idle, 4, None), (4.0, 10.0));
        assert_eq!(effective_load(&idle, 4, Some(12)), (2.0, 12.0));
        assert_eq!(effective_load(&idle, 4, Some(100)), (0.0, 14.0));
        assert_eq!(
            effective_load(&m(3.0, 10.0, None), 4, Some(100)),
            (7.0, 10.0),
            "queueing pod has no slot"
        );

        // Simulate a burst between two scrapes: the caller bumps in-flight after every pick.
        let cfg = SchedulerConfig::default();
        let mut c = pods(vec![
            m(0.0, 0.0, Some(0.3)),
            m(2.0, 0.0, Some(0.3)),
            m(2.0, 0.0, Some(0.3)),
        ]);
        let mut r = SplitMix64(1);
        let mut counts = [0u32; 3];
        for _ in 0..30 {
            let Decision::Pick { index, .. } =
                select(&c, &CRITICAL, &cfg, None, &mut || r.next_u64())
            else {
                panic!("no pick");
            };
            counts[index] += 1;
            c[index].in_flight_since_scrape += 1;
        }
        assert!(counts.iter().all(|&n| n >= 8), "{counts:?}");
        assert!(
            counts[0] >= counts[1] && counts[0] >= counts[2],
            "{counts:?}"
        );
    }

    #[test]
    fn least_and_most_bands_on_target_metric() {
        let with = |v: Option<f64>| {
            let mut x = m(0.0, 0.0, None);
            x.extra = v;
            x
        };
        // Values 0, 1, 4, 8 → width 2: least keeps [0, 2], most keeps [6, 8].
        let c = pods(vec![
            with(Some(0.0)),
            with(Some(1.0)),
            with(Some(4.0)),
            with(Some(8.0)),
            with(None),
        ]);
        let least = SchedulerConfig {
            policy: MetricPolicy::Least,
            ..Default::default()
        };
        let most = SchedulerConfig {
            policy: MetricPolicy::Most,
            ..Default::default()
        };
        assert_eq!(picks(&c, &CRITICAL, &least), vec![0, 1]);
        assert_eq!(picks(&c, &CRITICAL, &most), vec![3]);
        assert_eq!(
            decide(&pods(vec![with(None)]), &CRITICAL, &least),
            Decision::NoMetrics
        );
        // A request-count target gets the in-flight correction.
        let mut c = pods(vec![with(Some(0.0)), with(Some(1.0))]);
        c[0].metrics.as_mut().unwrap().extra_counts_requests = true;
        c[0].in_flight_since_scrape = 5;
        assert_eq!(picks(&c, &CRITICAL, &least), vec![1]);
    }

    #[test]
    fn weighted_scores() {
        let cfg = SchedulerConfig {
            policy: MetricPolicy::Weighted,
            ..Default::default()
        };
        // queue norm: 0, 1, 0.5; kv: 0.9, 0.0, 0.2 → scores 1.8, 2.0, 1.4.
        let c = pods(vec![
            m(0.0, 0.0, Some(0.9)),
            m(10.0, 0.0, Some(0.0)),
            m(5.0, 0.0, Some(0.2)),
        ]);
        assert_eq!(picks(&c, &CRITICAL, &cfg), vec![2]);
        // Ties are random.
        let c = pods(vec![m(1.0, 0.0, Some(0.5)), m(1.0, 0.0, Some(0.5))]);
        assert_eq!(picks(&c, &CRITICAL, &cfg), vec![0, 1]);
        // Running and in-flight weights.
        let cfg = SchedulerConfig {
            policy: MetricPolicy::Weighted,
            weights: Weights {
                queue: 0.0,
                kv: 0.0,
                running: 1.0,
                in_flight: 0.0,
            },
            ..Default::default()
        };
        let c = pods(vec![m(0.0, 9.0, None), m(0.0, 3.0, None)]);
        assert_eq!(picks(&c, &CRITICAL, &cfg), vec![1]);
        let cfg = SchedulerConfig {
            policy: MetricPolicy::Weighted,
            weights: Weights {
                queue: 0.0,
                kv: 0.0,
                running: 0.0,
                in_flight: 1.0,
            },
            ..Default::default()
        };
        let mut c = pods(vec![m(0.0, 0.0, None), m(0.0, 0.0, None)]);
        c[1].in_flight_since_scrape = 3;
        assert_eq!(picks(&c, &CRITICAL, &cfg), vec![0]);
        // NaN weights never panic and still pick.
        let cfg = SchedulerConfig {
            policy: MetricPolicy::Weighted,
            weights: Weights {
                queue: f64::NAN,
                kv: 1.0,
                running: 0.0,
                in_flight: 0.0,
            },
            ..Default::default()
        };
        assert!(matches!(decide(&c, &CRITICAL, &cfg), Decision::Pick { .. }));
    }

    #[test]
    fn rate_limit_moves_picks_off_a_hot_pod() {
        let cfg = SchedulerConfig {
            rate_limit: 0.5,
            ..Default::default()
        };
        // Pod 0 always wins on metrics; without a limit it would take everything.
        let c = pods(vec![
            m(0.0, 0.0, Some(0.0)),
            m(50.0, 0.0, Some(0.9)),
            m(60.0, 0.0, Some(0.9)),
        ]);
        let mut w = RateLimitWindow::new();
        let mut r = SplitMix64(3);
        let mut to_zero = 0;
        let mut limited = 0;
        for _ in 0..200 {
            match select(&c, &CRITICAL, &cfg, Some(&mut w), &mut || r.next_u64()) {
                Decision::Pick {
                    index,
                    rate_limited,
                } => {
                    to_zero += usize::from(index == 0);
                    limited += usize::from(rate_limited);
                }
                d => panic!("{d:?}"),
            }
        }
        assert_eq!(w.len(), 100);
        let share = w.share("10.0.0.0:8000");
        assert!(share <= 0.52 && share > 0.4, "{share}");
        assert!(to_zero > 80 && limited > 80, "{to_zero} {limited}");
        // Off by default.
        let mut w = RateLimitWindow::new();
        let cfg = SchedulerConfig::default();
        for _ in 0..50 {
            assert_eq!(
                select(&c, &CRITICAL, &cfg, Some(&mut w), &mut || r.next_u64()),
                Decision::Pick {
                    index: 0,
                    rate_limited: false
                }
            );
        }
    }
}
