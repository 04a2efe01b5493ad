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
        let Decision::Pick { index, .. } = select(&c, &CRITICAL, &cfg, None, &mut || r.next_u64())
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
