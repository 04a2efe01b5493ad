use super::*;
use crate::cluster::stats::table::ServiceTable;
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

fn set(t: &mut ServiceTable, i: usize, f: impl FnOnce(&mut crate::cluster::stats::ServiceStats)) {
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
