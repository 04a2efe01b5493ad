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
    // Plain loops, not iterator chains: each chain compiled to functions of its own that a
    // request runs cold (docs/architecture.md "Plugin CPU").
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
mod tests {
    use super::*;
    use crate::cluster::stats::ServiceTable;
    use crate::hash::SplitMix64;

    /// An rng that replays `values` in a loop.
    fn replay(values: &[u64]) -> impl FnMut() -> u64 + '_ {
        let mut i = 0;
        move || {
            let v = values[i % values.len()];
            i += 1;
            v
        }
    }

    fn table(list: &[&str]) -> ServiceTable {
        ServiceTable::new(list, 100)
    }

    fn params() -> MetricsParams {
        MetricsParams::default()
    }

    fn set(
        t: &mut ServiceTable,
        i: usize,
        f: impl FnOnce(&mut crate::cluster::stats::ServiceStats),
    ) {
        f(t.get_mut(i).unwrap());
    }

    fn pick(mode: Mode, p: &MetricsParams, t: &ServiceTable, now: i64, rng: &[u64]) -> Decision {
        select(mode, p, t, now, &mut replay(rng))
    }

    /// A [`ServiceTable`] that counts its block reads ([`Table::counters`]).
    struct Counting {
        inner: ServiceTable,
        reads: std::cell::Cell<usize>,
    }

    impl Table for Counting {
        fn names(&self) -> &[String] {
            self.inner.names()
        }
        fn list(&self) -> &[usize] {
            self.inner.list()
        }
        fn counters(&self, index: usize) -> Option<&Counters> {
            self.reads.set(self.reads.get() + 1);
            self.inner.counters(index)
        }
        fn counters_mut(&mut self, index: usize) -> Option<&mut Counters> {
            self.inner.counters_mut(index)
        }
        fn mean(&self, index: usize, which: Latency) -> f64 {
            self.inner.mean(index, which)
        }
        fn push(&mut self, index: usize, which: Latency, sample: f64) {
            self.inner.push(index, which, sample)
        }
    }

    #[test]
    fn a_decision_reads_each_service_a_few_times_not_once_per_other_service() {
        let n = 64;
        let names: Vec<String> = (0..n).map(|i| format!("s{i}")).collect();
        let list: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut inner = table(&list);
        for i in 0..n {
            set(&mut inner, i, |s| {
                s.count = i as u64 + 1;
                s.ongoing = (i % 5) as i64;
            });
        }
        let t = Counting {
            inner,
            reads: std::cell::Cell::new(0),
        };
        // A rate limit some services are over, so every service's share is asked.
        let p = MetricsParams {
            rate_limit: 0.02,
            ..params()
        };
        for mode in [
            Mode::LeastBusy,
            Mode::LeastTotalLatency,
            Mode::LeastFirstTokenLatency,
            Mode::AdaptiveScore,
        ] {
            t.reads.set(0);
            let d = select(mode, &p, &t, 0, &mut replay(&[3, 5, 7, 11]));
            assert!(matches!(d, Decision::Pick(_)), "{mode:?}");
            let reads = t.reads.get();
            assert!(
                reads <= 5 * n,
                "{mode:?}: {reads} block reads for {n} services"
            );
        }
    }

    #[test]
    fn empty_table_has_no_services() {
        let t = table(&[]);
        for mode in [
            Mode::Random,
            Mode::LeastBusy,
            Mode::AdaptiveScore,
            Mode::LeastTotalLatency,
        ] {
            assert_eq!(pick(mode, &params(), &t, 0, &[0]), Decision::NoServices);
        }
    }

    #[test]
    fn random_mode_draws_list_entries_uniformly() {
        let t = table(&["a", "b", "a"]);
        let mut rng = SplitMix64(1);
        let mut hits = [0u32; 2];
        for _ in 0..30_000 {
            match select(Mode::Random, &params(), &t, 0, &mut || rng.next_u64()) {
                Decision::Pick(i) => hits[i] += 1,
                Decision::NoServices => unreachable!(),
            }
        }
        // "a" is two entries of three.
        assert!((19_400..20_600).contains(&hits[0]), "{hits:?}");
        assert_eq!(
            pick(Mode::Random, &params(), &t, 0, &[4]),
            Decision::Pick(1)
        );
    }

    #[test]
    fn go_small_map_order_is_a_rotation_from_one_of_eight_slots() {
        let order = |n, r| go_map_order(n, &mut replay(&[r]));
        assert_eq!(order(3, 0), [0, 1, 2]);
        assert_eq!(order(3, 1), [1, 2, 0]);
        assert_eq!(order(3, 2), [2, 0, 1]);
        for r in 3..8 {
            assert_eq!(order(3, r), [0, 1, 2], "offset {r}");
        }
        assert_eq!(order(8, 13), [5, 6, 7, 0, 1, 2, 3, 4]);
        assert_eq!(order(10, 13), [3, 4, 5, 6, 7, 8, 9, 0, 1, 2]);
        assert!(order(0, 1).is_empty());
    }

    #[test]
    fn least_busy_takes_the_fewest_in_flight() {
        let mut t = table(&["a", "b", "c"]);
        set(&mut t, 0, |s| s.ongoing = 5);
        set(&mut t, 1, |s| s.ongoing = 2);
        set(&mut t, 2, |s| s.ongoing = 3);
        for start in 0..3 {
            for offset in 0..8 {
                assert_eq!(
                    pick(Mode::LeastBusy, &params(), &t, 0, &[start, offset]),
                    Decision::Pick(1)
                );
            }
        }
    }

    #[test]
    fn least_busy_ties_go_to_the_start_or_the_first_visited() {
        let mut t = table(&["a", "b", "c"]);
        set(&mut t, 0, |s| s.ongoing = 4);
        // b and c tie at 0: the start wins if it is one of them, else the first visited.
        assert_eq!(
            pick(Mode::LeastBusy, &params(), &t, 0, &[2, 0]),
            Decision::Pick(2)
        );
        assert_eq!(
            pick(Mode::LeastBusy, &params(), &t, 0, &[0, 0]),
            Decision::Pick(1)
        );
        assert_eq!(
            pick(Mode::LeastBusy, &params(), &t, 0, &[0, 2]),
            Decision::Pick(2)
        );
    }

    #[test]
    fn rate_limit_moves_off_a_service_that_reached_its_share() {
        let p = MetricsParams {
            rate_limit: 0.6,
            ..params()
        };
        let mut t = table(&["a", "b", "c"]);
        // a has 7 of 10 selections and the fewest in flight; b and c are over a.
        set(&mut t, 0, |s| s.count = 7);
        set(&mut t, 1, |s| (s.count, s.ongoing) = (2, 3));
        set(&mut t, 2, |s| (s.count, s.ongoing) = (1, 9));
        // Start at a: over the limit, so the next visited service replaces it unconditionally,
        // then the sweep continues from there (b beats c on in-flight).
        assert_eq!(pick(Mode::LeastBusy, &p, &t, 0, &[0, 0]), Decision::Pick(1));
        // Start at c: a is lower but over the limit, b is lower than c and under it.
        assert_eq!(pick(Mode::LeastBusy, &p, &t, 0, &[2, 0]), Decision::Pick(1));
    }

    #[test]
    fn default_rate_limit_skips_a_service_that_got_every_request_so_far() {
        let mut t = table(&["a", "b"]);
        set(&mut t, 0, |s| s.count = 1);
        set(&mut t, 1, |s| s.ongoing = 50);
        for mode in [
            Mode::LeastBusy,
            Mode::LeastTotalLatency,
            Mode::LeastFirstTokenLatency,
        ] {
            assert_eq!(
                pick(mode, &params(), &t, 0, &[0, 0]),
                Decision::Pick(1),
                "{mode:?}"
            );
        }
    }

    #[test]
    fn least_latency_modes_compare_ring_means_in_list_order() {
        let mut t = table(&["a", "b", "c"]);
        for (i, (ttft, total)) in [(50.0, 900.0), (80.0, 300.0), (60.0, 700.0)]
            .into_iter()
            .enumerate()
        {
            set(&mut t, i, |s| {
                s.ttft.push(ttft, 100);
                s.total.push(total, 100);
            });
        }
        for start in 0..3 {
            assert_eq!(
                pick(Mode::LeastTotalLatency, &params(), &t, 0, &[start]),
                Decision::Pick(1)
            );
            assert_eq!(
                pick(Mode::LeastFirstTokenLatency, &params(), &t, 0, &[start]),
                Decision::Pick(0)
            );
        }
        // A service without samples has mean 0 and looks fastest.
        let mut t2 = t.clone();
        set(&mut t2, 2, |s| s.total = Default::default());
        assert_eq!(
            pick(Mode::LeastTotalLatency, &params(), &t2, 0, &[0]),
            Decision::Pick(2)
        );
    }

    #[test]
    fn adaptive_score_formula() {
        let p = params();
        let mut t = table(&["a", "b", "c"]);
        assert_eq!(adaptive_score(&p, &t, 0, 0), 1.0);
        set(&mut t, 0, |s| {
            s.ongoing = 2;
            s.ewma_ttft = Some(99.0);
            s.ewma_total = Some(399.0);
            s.success = 3;
            s.errors = 1;
        });
        // (0.7·10 + 0.3·20) · 3 · (1 + 3·0.25)
        assert_eq!(adaptive_score(&p, &t, 0, 0), 13.0 * 3.0 * 1.75);
        // Cooling down after 2 consecutive errors: inflight 3 + 3.
        set(&mut t, 0, |s| {
            (s.cooldown_until_ms, s.consecutive_errors) = (100, 2)
        });
        assert_eq!(adaptive_score(&p, &t, 0, 99), 13.0 * 6.0 * 1.75);
        assert_eq!(adaptive_score(&p, &t, 0, 100), 13.0 * 3.0 * 1.75);
        // Only TTFT known: it stands in for the total latency too.
        set(&mut t, 1, |s| s.ewma_ttft = Some(24.0));
        assert_eq!(adaptive_score(&p, &t, 1, 0), 0.7 * 5.0 + 0.3 * 5.0);
        set(&mut t, 2, |s| (s.ewma_total, s.ongoing) = (Some(8.0), 1));
        assert_eq!(adaptive_score(&p, &t, 2, 0), (0.7 * 3.0 + 0.3 * 3.0) * 2.0);
        // Missing metrics: the in-flight count, cooldown included.
        let mut t = table(&["a"]);
        set(&mut t, 0, |s| {
            (s.ongoing, s.cooldown_until_ms, s.consecutive_errors) = (4, 10, 1)
        });
        assert_eq!(adaptive_score(&p, &t, 0, 0), 7.0);
        assert_eq!(adaptive_score(&p, &t, 5, 0), f64::MAX);
    }

    #[test]
    fn capacity_aware_scores_keep_a_fast_service_with_idle_slots() {
        // a: 48 ms to the first token, b: 143 ms; a holds 4 requests, b none.
        let mut t = table(&["a", "b", "c"]);
        latency(&mut t, 0, 48.0, 48.0, 10);
        latency(&mut t, 1, 143.0, 143.0, 10);
        set(&mut t, 0, |s| s.ongoing = 4);
        let go = params();
        let cap = MetricsParams {
            inflight_capacity: Some(8),
            ..params()
        };
        // Go's formula: 7 × 5 = 35 against 12 × 1: the slow service.
        close(&adaptive_scores(&go, &t, &[0, 1], 0), &[35.0, 12.0]);
        // Capacity 8: 7 × 1.5 = 10.5 against 12: the fast one.
        close(&adaptive_scores(&cap, &t, &[0, 1], 0), &[10.5, 12.0]);
        assert_eq!(
            pick(Mode::AdaptiveScore, &cap, &t, 0, &[0, 1]),
            Decision::Pick(0)
        );
        // Capacity 1 is Go's in-flight factor.
        let one = MetricsParams {
            inflight_capacity: Some(1),
            ..params()
        };
        assert_eq!(
            adaptive_scores(&one, &t, &[0, 1], 0),
            adaptive_scores(&go, &t, &[0, 1], 0)
        );
        // An unmeasured service (c) is scored at the measured candidates' mean latency
        // (9.5), not by its request count (Go: 1).
        assert_eq!(adaptive_scores(&go, &t, &[2], 0), [1.0]);
        close(&adaptive_scores(&cap, &t, &[0, 1, 2], 0)[2..], &[9.5]);
        // With nothing measured at all, the count decides, as in Go.
        let fresh = table(&["x", "y"]);
        assert_eq!(adaptive_scores(&cap, &fresh, &[0, 1], 0), [1.0, 1.0]);
        // Cooldown still adds `consecutive_errors + 1`.
        set(&mut t, 1, |s| {
            (s.cooldown_until_ms, s.consecutive_errors) = (10, 1)
        });
        close(&adaptive_scores(&cap, &t, &[1], 0), &[12.0 * 3.0]);
    }

    fn close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-9, "{got:?} vs {want:?}");
        }
    }

    fn latency(t: &mut ServiceTable, i: usize, ttft: f64, total: f64, success: u64) {
        set(t, i, |s| {
            s.ewma_ttft = Some(ttft);
            s.ewma_total = Some(total);
            s.success = success;
        });
    }

    #[test]
    fn adaptive_prefers_lower_latency_then_lower_in_flight() {
        // Go TestAdaptiveScorePrefersLowerLatencyAndInflight.
        let mut t = table(&["svc-a", "svc-b"]);
        latency(&mut t, 0, 100.0, 500.0, 10);
        latency(&mut t, 1, 20.0, 80.0, 10);
        assert_eq!(
            pick(Mode::AdaptiveScore, &params(), &t, 1000, &[0]),
            Decision::Pick(1)
        );
        set(&mut t, 1, |s| s.ongoing = 100);
        assert_eq!(
            pick(Mode::AdaptiveScore, &params(), &t, 1000, &[0]),
            Decision::Pick(0)
        );
    }

    #[test]
    fn adaptive_avoids_a_cooling_service_while_another_exists() {
        // Go TestAdaptiveScoreAvoidsCooldownWhenAlternativeExists.
        let mut t = table(&["svc-a", "svc-b"]);
        latency(&mut t, 0, 10.0, 20.0, 0);
        set(&mut t, 0, |s| {
            (s.errors, s.consecutive_errors, s.cooldown_until_ms) = (1, 1, 2000)
        });
        latency(&mut t, 1, 300.0, 600.0, 1);
        assert_eq!(
            pick(Mode::AdaptiveScore, &params(), &t, 1000, &[0]),
            Decision::Pick(1)
        );
        assert_eq!(
            pick(Mode::AdaptiveScore, &params(), &t, 3000, &[0]),
            Decision::Pick(0)
        );
        // Every service cooling: the cooldown filter falls back and the scores decide.
        set(&mut t, 1, |s| s.cooldown_until_ms = 2000);
        assert_eq!(
            adaptive_candidates(&params(), &t, 1000, &mut replay(&[0])),
            [0, 1]
        );
    }

    #[test]
    fn adaptive_uses_in_flight_when_metrics_are_missing() {
        // Go TestAdaptiveScoreUsesLeastBusyForMissingMetrics.
        let mut t = table(&["svc-a", "svc-b"]);
        set(&mut t, 0, |s| s.ongoing = 3);
        set(&mut t, 1, |s| s.ongoing = 1);
        assert_eq!(
            pick(Mode::AdaptiveScore, &params(), &t, 1000, &[0]),
            Decision::Pick(1)
        );
        // Equal scores keep the earlier candidate.
        set(&mut t, 0, |s| s.ongoing = 1);
        assert_eq!(
            pick(Mode::AdaptiveScore, &params(), &t, 1000, &[0]),
            Decision::Pick(0)
        );
    }

    #[test]
    fn adaptive_respects_rate_limit_while_an_alternative_exists() {
        // Go TestAdaptiveScoreRespectsRateLimitWhenAlternativeExists.
        let p = MetricsParams {
            rate_limit: 0.6,
            ..params()
        };
        let mut t = table(&["svc-a", "svc-b"]);
        latency(&mut t, 0, 1.0, 1.0, 10);
        latency(&mut t, 1, 100.0, 100.0, 10);
        set(&mut t, 0, |s| s.count = 7);
        set(&mut t, 1, |s| s.count = 3);
        assert_eq!(
            pick(Mode::AdaptiveScore, &p, &t, 1000, &[0]),
            Decision::Pick(1)
        );
        // Both over the limit (rate_limit 0): every service is a candidate again.
        let p0 = MetricsParams {
            rate_limit: 0.0,
            ..params()
        };
        assert_eq!(
            pick(Mode::AdaptiveScore, &p0, &t, 1000, &[0]),
            Decision::Pick(0)
        );
    }

    #[test]
    fn adaptive_single_entry_list_is_returned_at_once() {
        let mut t = table(&["only"]);
        set(&mut t, 0, |s| s.cooldown_until_ms = i64::MAX);
        assert_eq!(
            pick(Mode::AdaptiveScore, &params(), &t, 0, &[]),
            Decision::Pick(0)
        );
    }

    #[test]
    fn p2c_samples_distinct_services_uniformly() {
        let t = table(&["a", "b", "c", "d"]);
        let p = params();
        // Draws 1, 1 (rejected), 3.
        assert_eq!(
            adaptive_candidates(&p, &t, 0, &mut replay(&[1, 5, 3])),
            [1, 3]
        );
        let mut rng = SplitMix64(3);
        let mut first = [0u32; 4];
        for _ in 0..8000 {
            let c = adaptive_candidates(&p, &t, 0, &mut || rng.next_u64());
            assert_eq!(c.len(), 2);
            assert_ne!(c[0], c[1]);
            first[c[0]] += 1;
        }
        assert!(
            first.iter().all(|&n| (1_800..2_200).contains(&n)),
            "{first:?}"
        );
        // p2c covering the set returns it whole, in list order.
        let all = MetricsParams {
            p2c_choices: 4,
            ..params()
        };
        assert_eq!(
            adaptive_candidates(&all, &t, 0, &mut replay(&[2])),
            [0, 1, 2, 3]
        );
    }

    #[test]
    fn p2c_filters_before_sampling() {
        let p = MetricsParams {
            rate_limit: 0.5,
            ..params()
        };
        let mut t = table(&["a", "b", "c", "d"]);
        set(&mut t, 0, |s| s.count = 5);
        set(&mut t, 1, |s| s.cooldown_until_ms = 10);
        set(&mut t, 2, |s| s.count = 1);
        // a is over its share, b is cooling: c and d remain, both taken (p2c = 2).
        assert_eq!(adaptive_candidates(&p, &t, 0, &mut replay(&[0])), [2, 3]);
        assert_eq!(
            adaptive_candidates(&p, &t, 10, &mut replay(&[0, 1])),
            [1, 2]
        );
    }

    #[test]
    fn p2c_with_repeated_names_terminates() {
        let p = params();
        // Go spins forever here: one distinct name, three entries, two choices.
        let t = table(&["a", "a", "a"]);
        assert_eq!(adaptive_candidates(&p, &t, 0, &mut replay(&[0])), [0]);
        assert_eq!(
            pick(Mode::AdaptiveScore, &p, &t, 0, &[0]),
            Decision::Pick(0)
        );
        // Enough distinct names: rejection sampling as in Go, weighted by entries.
        let t = table(&["a", "a", "b"]);
        assert_eq!(
            adaptive_candidates(&p, &t, 0, &mut replay(&[0, 1, 2])),
            [0, 1]
        );
        // A stuck rng cannot hang it either.
        assert_eq!(adaptive_candidates(&p, &t, 0, &mut replay(&[0])), [0, 1]);
    }
}
