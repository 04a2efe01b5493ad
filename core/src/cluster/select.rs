//! `cluster_metrics` selection, mode by mode as Higress decides (docs/higress-cluster-policies.md
//! §3.4, §3.5). Pure: the caller passes the table (any [`Table`] store), the time and an rng
//! (uniform `u64`s), and then applies the pick with [`Table::on_request_start`].
//!
//! Higress never refuses a request here: when every service is over `rate_limit` or cooling
//! down, the filter falls back to the unfiltered set, so the only non-pick is an empty
//! service list (which the config parser already refuses).

use super::stats::{Counters, Latency, Table};
use super::{MetricsParams, Mode};

/// What to do with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Route to `table.names()[index]`.
    Pick(usize),
    /// The table has no services.
    NoServices,
}

/// Go's map iteration visits at most this many entries in slot order before a map grows into
/// hashed tables (Go 1.24 Swiss-table "small map": one group of 8 slots).
const GO_SMALL_MAP_SLOTS: usize = 8;

/// Chooses a service for `mode` (AdaptiveScore's local path; the Redis path uses
/// [`adaptive_candidates`] and [`adaptive_score`] to build its script call).
pub fn select(
    mode: Mode,
    params: &MetricsParams,
    table: &(impl Table + ?Sized),
    now_ms: i64,
    rng: &mut impl FnMut() -> u64,
) -> Decision {
    let list = table.list();
    if list.is_empty() || table.names().is_empty() {
        return Decision::NoServices;
    }
    let pick = match mode {
        Mode::AdaptiveScore => match list {
            [only] => Some(*only),
            _ => lowest_score(
                params,
                table,
                &adaptive_candidates(params, table, now_ms, rng),
                now_ms,
            ),
        },
        Mode::Random => random_entry(list, rng),
        Mode::LeastBusy => random_entry(list, rng).map(|start| {
            let order = go_map_order(table.names().len(), rng);
            sweep(params, table, start, order, |i| {
                table.counters(i).map_or(0.0, |c| c.ongoing as f64)
            })
        }),
        Mode::LeastTotalLatency => random_entry(list, rng).map(|start| {
            sweep(params, table, start, list.iter().copied(), |i| {
                table.mean(i, Latency::Total)
            })
        }),
        Mode::LeastFirstTokenLatency => random_entry(list, rng).map(|start| {
            sweep(params, table, start, list.iter().copied(), |i| {
                table.mean(i, Latency::Ttft)
            })
        }),
    };
    pick.map_or(Decision::NoServices, Decision::Pick)
}

/// A uniformly random `service_list` entry (so a repeated name is proportionally likelier).
fn random_entry(list: &[usize], rng: &mut impl FnMut() -> u64) -> Option<usize> {
    let n = u64::try_from(list.len()).ok().filter(|n| *n > 0)?;
    let i = usize::try_from(rng() % n).ok()?;
    list.get(i).copied()
}

/// The Least* sweep from a random start: leave a candidate whose share reached `rate_limit`
/// for whatever comes next; otherwise move to a strictly better service that is under the
/// limit. Comparisons are IEEE (a NaN `rate_limit` never counts as reached nor as under).
fn sweep(
    params: &MetricsParams,
    table: &(impl Table + ?Sized),
    start: usize,
    order: impl IntoIterator<Item = usize>,
    metric: impl Fn(usize) -> f64,
) -> usize {
    let limit = params.rate_limit;
    let selections = table.selections();
    let mut cand = start;
    let mut cand_metric = metric(cand);
    for svc in order {
        if svc == cand {
            continue;
        }
        if table.request_rate(cand, selections) >= limit {
            cand = svc;
            cand_metric = metric(svc);
        } else {
            let m = metric(svc);
            if m < cand_metric && table.request_rate(svc, selections) < limit {
                cand = svc;
                cand_metric = m;
            }
        }
    }
    cand
}

/// The order Go's `range` over the per-service in-flight map visits `n` distinct services.
/// Up to 8 entries the map is one group filled in insertion (first-seen) order, and iteration
/// starts at a random slot of the 8 and wraps, skipping empty slots. Larger maps are ordered by
/// a per-map random hash seed we cannot reproduce; a uniformly random rotation stands in.
pub fn go_map_order(n: usize, rng: &mut impl FnMut() -> u64) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    let slots = if n <= GO_SMALL_MAP_SLOTS {
        GO_SMALL_MAP_SLOTS
    } else {
        n
    };
    let offset = usize::try_from(rng() % slots as u64).unwrap_or(0);
    (0..slots)
        .map(|i| (i + offset) % slots)
        .filter(|&slot| slot < n)
        .collect()
}

/// AdaptiveScore's candidates: the `service_list` entries under `rate_limit` (all if none),
/// of those the ones not cooling down (the previous set if none), then `p2c_choices` distinct
/// services drawn uniformly with rejection — or the whole set when it has at most one entry
/// or `p2c_choices` covers it. Entries may repeat when the whole set is returned, as in Go.
///
/// Deviation: when fewer distinct services remain than `p2c_choices` (a `service_list` with
/// repeated names) Go's rejection loop never ends; this returns each distinct service once,
/// in list order. Draws are also capped so that a degenerate rng cannot loop forever either.
pub fn adaptive_candidates(
    params: &MetricsParams,
    table: &(impl Table + ?Sized),
    now_ms: i64,
    rng: &mut impl FnMut() -> u64,
) -> Vec<usize> {
    let list = table.list();
    let selections = table.selections();
    let mut cands: Vec<usize> = Vec::with_capacity(list.len());
    for &i in list {
        if table.request_rate(i, selections) < params.rate_limit {
            cands.push(i);
        }
    }
    if cands.is_empty() {
        cands.extend_from_slice(list);
    }
    // Those not cooling down, in order; all of them when every one is.
    let mut kept = 0;
    for at in 0..cands.len() {
        let Some(&i) = cands.get(at) else { break };
        if table.counters(i).is_some_and(|c| !c.in_cooldown(now_ms)) {
            if let Some(slot) = cands.get_mut(kept) {
                *slot = i;
            }
            kept += 1;
        }
    }
    if kept > 0 {
        cands.truncate(kept);
    }

    let choices = params.p2c();
    if cands.len() <= 1 || choices >= cands.len() {
        return cands;
    }
    let mut distinct: Vec<usize> = Vec::with_capacity(cands.len());
    for &c in &cands {
        if !distinct.contains(&c) {
            distinct.push(c);
        }
    }
    if distinct.len() < choices {
        return distinct;
    }
    let mut picked: Vec<usize> = Vec::with_capacity(choices);
    let max_draws = cands.len().saturating_mul(64).saturating_add(64);
    let mut draws = 0;
    while picked.len() < choices && draws < max_draws {
        draws += 1;
        if let Some(c) = random_entry(&cands, rng) {
            if !picked.contains(&c) {
                picked.push(c);
            }
        }
    }
    for c in distinct {
        if picked.len() >= choices {
            break;
        }
        if !picked.contains(&c) {
            picked.push(c);
        }
    }
    picked
}

/// AdaptiveScore's score (lower is better):
/// `inflight = ongoing + 1`, plus `consecutive_errors + 1` while cooling down; with no latency
/// sample at all the score is `inflight` (`metrics_missing_policy: least_busy`); otherwise
/// `(ttft_weight·√(ttft+1) + total_latency_weight·√(total+1)) · inflight · (1 + error_penalty ·
/// errors/(success+errors))`, each EWMA standing in for the other when missing.
///
/// With `inflight_capacity` (ours) the score is capacity-aware, see [`adaptive_scores`].
pub fn adaptive_score(
    params: &MetricsParams,
    table: &(impl Table + ?Sized),
    index: usize,
    now_ms: i64,
) -> f64 {
    score_with(params, table, index, now_ms, None)
}

/// The scores of `candidates`, in order. Go's formula, unless `inflight_capacity` is set: an
/// LLM service runs up to its capacity of requests at once in one batch, so `ongoing + 1`
/// (a service slows down with every request it holds) overstates its load and sends
/// requests to slower services while a fast one has idle slots. Then:
/// - the in-flight factor is `1 + ongoing / capacity` (Go's `ongoing + 1` at capacity 1);
/// - a service with no latency sample yet is scored at the mean latency of the sampled
///   candidates rather than by its request count alone (a count is not comparable with a
///   latency, and Go's rule sends every request to an unmeasured service until its first
///   sample returns).
pub fn adaptive_scores(
    params: &MetricsParams,
    table: &(impl Table + ?Sized),
    candidates: &[usize],
    now_ms: i64,
) -> Vec<f64> {
    let prior = prior(params, table, candidates);
    let mut scores = Vec::with_capacity(candidates.len());
    for &c in candidates {
        scores.push(score_with(params, table, c, now_ms, prior));
    }
    scores
}

/// With `inflight_capacity`: the mean latency of the sampled `candidates`, which an unsampled
/// one is scored at ([`adaptive_scores`]).
fn prior(
    params: &MetricsParams,
    table: &(impl Table + ?Sized),
    candidates: &[usize],
) -> Option<f64> {
    params.inflight_capacity?;
    let (mut sum, mut known) = (0.0, 0usize);
    for &c in candidates {
        if let Some(l) = table.counters(c).and_then(|s| latency(params, s)) {
            sum += l;
            known += 1;
        }
    }
    (known > 0).then(|| sum / known as f64)
}

fn score_with(
    params: &MetricsParams,
    table: &(impl Table + ?Sized),
    index: usize,
    now_ms: i64,
    prior: Option<f64>,
) -> f64 {
    let Some(s) = table.counters(index) else {
        // Go scores a service it has no record of as MaxFloat64.
        return f64::MAX;
    };
    let mut inflight = match params.inflight_capacity {
        None => s.ongoing.saturating_add(1) as f64,
        Some(cap) => 1.0 + s.ongoing as f64 / cap.max(1) as f64,
    };
    if s.in_cooldown(now_ms) {
        inflight += s.consecutive_errors.saturating_add(1) as f64;
    }
    let Some(latency) = latency(params, s).or(prior) else {
        return inflight;
    };
    let requests = s.success.saturating_add(s.errors);
    let error_rate = if requests > 0 {
        s.errors as f64 / requests as f64
    } else {
        0.0
    };
    latency * inflight * (1.0 + params.error_penalty * error_rate)
}

/// The latency term, None without any sample.
fn latency(params: &MetricsParams, s: &Counters) -> Option<f64> {
    let (ttft, total) = match (s.ewma_ttft, s.ewma_total) {
        (None, None) => return None,
        (Some(t), None) => (t, t),
        (None, Some(r)) => (r, r),
        (Some(t), Some(r)) => (t, r),
    };
    Some(
        params.ttft_weight * (ttft + 1.0).sqrt()
            + params.total_latency_weight * (total + 1.0).sqrt(),
    )
}

/// The first candidate with the strictly lowest score (ties keep the earlier one).
fn lowest_score(
    params: &MetricsParams,
    table: &(impl Table + ?Sized),
    candidates: &[usize],
    now_ms: i64,
) -> Option<usize> {
    // `lowest` over `adaptive_scores`, without collecting the scores.
    let prior = prior(params, table, candidates);
    let mut best: Option<(usize, f64)> = None;
    for &c in candidates {
        let score = score_with(params, table, c, now_ms, prior);
        if beats(best, score) {
            best = Some((c, score));
        }
    }
    best.map(|(c, _)| c)
}

/// Position of the lowest of `scores`, the first one on a tie (Go's strict `<`, CM 391–402);
/// also the global in-flight path's local choice.
pub fn lowest(scores: &[f64]) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, &score) in scores.iter().enumerate() {
        if beats(best, score) {
            best = Some((i, score));
        }
    }
    best.map(|(i, _)| i)
}

/// Whether `score` replaces the best so far: strictly lower, so a tie keeps the earlier one.
fn beats(best: Option<(usize, f64)>, score: f64) -> bool {
    best.is_none_or(|(_, b)| score < b)
}

#[cfg(test)]
mod tests;
