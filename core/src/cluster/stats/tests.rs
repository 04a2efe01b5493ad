use super::*;
use table::ServiceTable;

fn table(list: &[&str]) -> ServiceTable {
    ServiceTable::new(list, MetricsParams::default().ring_capacity())
}

#[test]
fn only_exact_200_is_success() {
    assert!(is_success(Some("200")));
    for s in [
        None,
        Some(""),
        Some("201"),
        Some("204"),
        Some("302"),
        Some("500"),
        Some("200 "),
    ] {
        assert!(!is_success(s), "{s:?}");
    }
}

#[test]
fn duplicate_names_share_one_record() {
    let t = table(&["a", "b", "a", "c"]);
    assert_eq!(t.names(), ["a", "b", "c"]);
    assert_eq!(t.list(), [0, 1, 0, 2]);
    assert_eq!(t.stats().len(), 3);
    assert_eq!(t.index_of("c"), Some(2));
    assert_eq!(t.index_of("d"), None);
}

#[test]
fn ring_keeps_the_newest_samples_and_averages_them() {
    let mut r = Ring::default();
    assert_eq!(r.mean(), 0.0);
    for v in [10.0, 20.0, 30.0, 40.0] {
        r.push(v, 3);
    }
    assert_eq!(r.iter().collect::<Vec<_>>(), [20.0, 30.0, 40.0]);
    assert_eq!(r.mean(), 30.0);
    assert_eq!(r.len(), 3);
}

#[test]
fn ewma_matches_higress_test_values() {
    // Go TestAdaptiveScoreEWMAAndFailureState: 100 then 300 at beta 0.5 → 200.
    let e = ewma(None, 100.0, 0.5);
    assert_eq!(e, 100.0);
    assert_eq!(ewma(Some(e), 300.0, 0.5), 200.0);
    assert_eq!(ewma(Some(800.0), 400.0, 0.5), 600.0);
    assert_eq!(ewma(Some(10.0), 20.0, 0.0), 20.0);
    assert_eq!(ewma(Some(10.0), 20.0, 1.0), 10.0);
}

#[test]
fn request_rate_is_the_share_of_selections() {
    let mut t = table(&["a", "b"]);
    assert_eq!(t.selections(), 0);
    assert_eq!(t.request_rate(0, t.selections()), 0.0);
    for _ in 0..7 {
        t.on_request_start(0);
    }
    for _ in 0..3 {
        t.on_request_start(1);
    }
    assert_eq!(t.selections(), 10);
    assert_eq!(t.request_rate(0, t.selections()), 0.7);
    assert_eq!(t.request_rate(1, t.selections()), 0.3);
    assert_eq!(t.request_rate(9, t.selections()), 0.0);
    assert_eq!(t.get(0).unwrap().ongoing, 7);
    assert_eq!(t.get(0).unwrap().count, 7);
}

#[test]
fn first_byte_records_ttft_and_penalises_failures() {
    let p = MetricsParams::default();
    let mut t = table(&["a", "b"]);
    t.on_first_byte(0, 100, true, p.ewma_beta);
    t.on_first_byte(0, 300, true, p.ewma_beta);
    assert_eq!(t.get(0).unwrap().ttft.mean(), 200.0);
    assert_eq!(t.get(0).unwrap().ewma_ttft, Some(200.0));
    // A failure after 50 ms: max(50, slowest mean TTFT = 200) × 2.
    t.on_first_byte(1, 50, false, p.ewma_beta);
    assert_eq!(t.get(1).unwrap().ttft.iter().collect::<Vec<_>>(), [400.0]);
    assert_eq!(t.get(1).unwrap().ewma_ttft, Some(400.0));
    // A slow failure keeps its own time, doubled.
    t.on_first_byte(1, 1000, false, p.ewma_beta);
    assert_eq!(
        t.get(1).unwrap().ttft.iter().collect::<Vec<_>>(),
        [400.0, 2000.0]
    );
    // Nothing about success or cooldown changes at first byte.
    assert_eq!(t.get(1).unwrap().errors, 0);
    assert_eq!(t.get(1).unwrap().cooldown_until_ms, 0);
}

#[test]
fn stream_end_tracks_latency_errors_and_cooldown() {
    let p = MetricsParams::default();
    let mut t = table(&["a", "b"]);
    t.on_request_start(0);
    t.on_request_start(0);
    // Go TestAdaptiveScoreEWMAAndFailureState: failure of 800 ms at t=1000.
    t.on_stream_end(0, Some(400), false, 1000, &p);
    let s = t.get(0).unwrap().clone();
    assert_eq!(s.ongoing, 1);
    assert_eq!(s.total.iter().collect::<Vec<_>>(), [800.0]);
    assert_eq!(s.ewma_total, Some(800.0));
    assert_eq!((s.success, s.errors, s.consecutive_errors), (0, 1, 1));
    assert_eq!(s.cooldown_until_ms, 1000 + 30_000);
    assert!(s.in_cooldown(30_999) && !s.in_cooldown(31_000));
    // A success at t=2000 resets the run but not the cooldown.
    t.on_stream_end(0, Some(400), true, 2000, &p);
    let s = t.get(0).unwrap();
    assert_eq!(s.ongoing, 0);
    assert_eq!((s.success, s.errors, s.consecutive_errors), (1, 1, 0));
    assert_eq!(s.ewma_total, Some(600.0));
    assert_eq!(s.cooldown_until_ms, 31_000);
    assert_eq!(s.count, 2);
}

#[test]
fn stream_end_penalty_uses_the_slowest_mean_total_latency() {
    let p = MetricsParams::default();
    let mut t = table(&["a", "b", "c"]);
    t.on_stream_end(0, Some(100), true, 0, &p);
    t.on_stream_end(1, Some(500), true, 0, &p);
    t.on_stream_end(1, Some(700), true, 0, &p);
    // max(30, mean(b) = 600) × 2, recorded on c.
    t.on_stream_end(2, Some(30), false, 0, &p);
    assert_eq!(t.get(2).unwrap().total.iter().collect::<Vec<_>>(), [1200.0]);
    assert_eq!(t.get(2).unwrap().consecutive_errors, 1);
    t.on_stream_end(2, Some(30), false, 5, &p);
    assert_eq!(t.get(2).unwrap().consecutive_errors, 2);
    assert_eq!(t.get(2).unwrap().cooldown_until_ms, 30_005);
}

#[test]
fn stream_end_without_start_time_only_releases() {
    let p = MetricsParams::default();
    let mut t = table(&["a"]);
    t.on_request_start(0);
    t.on_stream_end(0, None, false, 0, &p);
    let s = t.get(0).unwrap();
    assert_eq!(s.ongoing, 0);
    assert!(s.total.is_empty());
    assert_eq!(s.errors, 0);
    // A release with nothing in flight stops at zero.
    t.on_stream_end(0, None, true, 0, &p);
    assert_eq!(t.get(0).unwrap().ongoing, 0);
    // Unknown indices are ignored.
    t.on_stream_end(7, Some(1), true, 0, &p);
    t.on_request_start(7);
    t.on_first_byte(7, 1, true, 0.5);
}

#[test]
fn cooldown_deadline_wraps_like_go_int64() {
    let p = MetricsParams {
        failure_cooldown_ms: i64::MAX,
        ..MetricsParams::default()
    };
    let mut t = table(&["a"]);
    t.on_stream_end(0, Some(1), false, 10, &p);
    assert_eq!(t.get(0).unwrap().cooldown_until_ms, i64::MIN + 9);
    assert!(!t.get(0).unwrap().in_cooldown(10));
}

#[test]
fn ring_mean_is_the_oldest_first_sum_not_a_running_one() {
    let mut r = Ring::default();
    let mut kept: Vec<f64> = Vec::new();
    let mut running = 0.0;
    let mut running_differs = false;
    for i in 1..8 {
        let v = 0.1 * f64::from(i) + 0.7;
        r.push(v, 3);
        kept.push(v);
        running += v;
        if kept.len() > 3 {
            running -= kept.remove(0);
        }
        let go_sum = kept.iter().fold(0.0, |acc, s| acc + s);
        assert_eq!(
            r.mean().to_bits(),
            (go_sum / 3f64.min(f64::from(i))).to_bits()
        );
        running_differs |= running != go_sum;
    }
    // Adding the new sample and taking away the oldest rounds differently (3.3 vs
    // 3.3000000000000003 once 1.2 is in): the sum must be recomputed, as it is.
    assert!(running_differs);
}
