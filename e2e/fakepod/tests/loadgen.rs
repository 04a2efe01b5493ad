//! The load generator against in-process pods, and reproducibility of its plans.

mod common;

use ailb_fakepod::load::{self, *};
use ailb_fakepod::rng::Dist;
use common::*;
use std::time::Duration;

async fn pods(n: usize) -> Vec<ailb_fakepod::PodHandle> {
    let mut v = Vec::new();
    for i in 0..n {
        v.push(
            pod(&format!("lg-{i}"), |c| {
                c.max_running = 4;
                c.prefill_us_per_token = 20;
                c.decode_us_per_token = 1_000;
            })
            .await,
        );
    }
    v
}

fn sessions(seed: u64, targets: Vec<String>) -> LoadConfig {
    let mut cfg = LoadConfig::new(
        targets,
        Workload::Sessions(SessionsSpec {
            sessions: 12,
            rounds: 3,
            new_tokens: 50,
            concurrency: 6,
            system_prompts: 2,
            system_tokens: 400,
            max_tokens: 4,
        }),
    );
    cfg.seed = seed;
    cfg
}

#[tokio::test]
async fn sessions_against_three_pods_report_sane_numbers() {
    let ps = pods(3).await;
    let urls: Vec<String> = ps.iter().map(|p| p.url()).collect();
    let mut cfg = sessions(7, urls.clone());
    cfg.admin_urls = urls.clone();
    let s = load::run(&cfg).await.unwrap();
    assert_eq!((s.count, s.ok), (36, 36), "{}", s.line());
    assert!(s.errors.is_empty());
    assert_eq!(s.per_pod.values().sum::<usize>(), 36);
    assert_eq!(
        s.per_pod.len(),
        3,
        "round-robin over targets reaches every pod"
    );
    assert_eq!(s.ttft_ms.n, 36);
    assert!(s.ttft_ms.p50 > 0.0 && s.ttft_ms.p50 <= s.latency_ms.p50);
    assert!(s.ttft_ms.p50 <= s.ttft_ms.p90 && s.ttft_ms.p90 <= s.ttft_ms.p99);
    assert!(s.wall_s > 0.0);
    let report = s.pods.as_ref().unwrap();
    assert_eq!(
        report.pods.iter().map(|p| p.requests_total).sum::<u64>(),
        36
    );
    // Sessions stick to one target, so later rounds and the shared system prompt hit.
    assert!(
        report.prefix_hit_rate > 0.5,
        "hit rate {}",
        report.prefix_hit_rate
    );
    assert!(s.line().contains("n=36 ok=36"));
    // JSON round-trips into the same struct (the CLI prints exactly this).
    let back: Summary = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
    assert_eq!(back, s);

    // The same seed replays the same sequence; a run starts cold again thanks to the reset.
    let again = load::run(&cfg).await.unwrap();
    assert_eq!(again.sequence, s.sequence);
    assert_eq!(again.per_pod, s.per_pod);
    let hit2 = again.pods.as_ref().unwrap().prefix_hit_rate;
    assert!(
        (hit2 - report.prefix_hit_rate).abs() < 0.05,
        "{hit2} vs {}",
        report.prefix_hit_rate
    );
    for p in ps {
        p.shutdown().await;
    }
}

#[test]
fn same_seed_same_plan_different_seed_different_plan() {
    let t = vec!["http://a".to_string(), "http://b".to_string()];
    let a = load::plan(&sessions(1, t.clone()));
    let b = load::plan(&sessions(1, t.clone()));
    let c = load::plan(&sessions(2, t.clone()));
    assert_eq!(a, b);
    assert_eq!(a.fingerprint(), b.fingerprint());
    assert_ne!(a.fingerprint(), c.fingerprint());
    // Round r of a session extends round r-1 (multi-turn history) and sessions alternate targets.
    let r0: serde_json::Value = serde_json::from_str(&a.requests[0].body).unwrap();
    let r1: serde_json::Value = serde_json::from_str(&a.requests[1].body).unwrap();
    assert_eq!(r1["messages"].as_array().unwrap().len(), 4);
    assert_eq!(r0["messages"][1], r1["messages"][1]);
    assert_eq!(a.requests[3].target, 1);
    // ~200-token user turns are ~800 bytes for the pods' 4-bytes-per-token tokenizer.
    let mut big = sessions(1, t.clone());
    if let Workload::Sessions(s) = &mut big.workload {
        s.new_tokens = 200;
    }
    let p = load::plan(&big);
    let v: serde_json::Value = serde_json::from_str(&p.requests[0].body).unwrap();
    let user = v["messages"][1]["content"].as_str().unwrap().len();
    assert!((780..840).contains(&user), "{user}");

    // Skewed: arrivals, sizes, headers and aborts are all seed-determined.
    let mut k = LoadConfig::new(t, Workload::Skewed(SkewedSpec::default()));
    k.headers.push(HeaderRule {
        name: "x-fake-fault".into(),
        value: "reset".into(),
        probability: 0.3,
    });
    k.abort = Some(AbortRule {
        probability: 0.2,
        after: Duration::from_millis(5),
        phase: AbortPhase::AfterFirstByte,
    });
    let (p1, p2) = (load::plan(&k), load::plan(&k));
    assert_eq!(p1, p2);
    assert_eq!(p1.requests.len(), 200);
    let faulted = p1.requests.iter().filter(|r| !r.headers.is_empty()).count();
    assert!((30..90).contains(&faulted), "{faulted}");
    assert!(p1.requests.windows(2).all(|w| w[0].at <= w[1].at));
    k.seed = 99;
    assert_ne!(load::plan(&k).fingerprint(), p1.fingerprint());
}

#[test]
fn plans_are_pinned() {
    // Recorded before fakepod switched to ailb_core's SplitMix64 and FNV-1a: the same seed must
    // keep planning the same requests (bodies include the pods' deterministic answers).
    let t = vec!["http://a".to_string(), "http://b".to_string()];
    assert_eq!(
        load::plan(&sessions(1, t.clone())).fingerprint(),
        "b4d18759a821eaee"
    );
    let skewed = LoadConfig::new(t, Workload::Skewed(SkewedSpec::default()));
    assert_eq!(load::plan(&skewed).fingerprint(), "f9ab4bbb37e3a140");
}

#[tokio::test]
async fn skewed_with_faults_and_aborts_counts_them() {
    let ps = pods(2).await;
    let urls: Vec<String> = ps.iter().map(|p| p.url()).collect();
    let mut cfg = LoadConfig::new(
        urls.clone(),
        Workload::Skewed(SkewedSpec {
            arrivals: Arrivals::Count {
                count: 60,
                duration: Duration::from_millis(600),
            },
            prompt_tokens: Sizes {
                dist: Dist::LogNormal {
                    median: 100.0,
                    sigma: 1.0,
                },
                min: 4,
                max: 2000,
            },
            max_tokens: Sizes {
                dist: Dist::Pareto {
                    scale: 4.0,
                    alpha: 1.5,
                },
                min: 1,
                max: 100,
            },
            stream: true,
        }),
    );
    cfg.headers.push(HeaderRule {
        name: "x-fake-fault".into(),
        value: "status:503".into(),
        probability: 0.2,
    });
    // Every answer takes >= 30 ms, so the 5 ms aborts always win the race.
    cfg.headers.push(HeaderRule {
        name: "x-fake-delay-ms".into(),
        value: "30".into(),
        probability: 1.0,
    });
    cfg.abort = Some(AbortRule {
        probability: 0.2,
        after: Duration::from_millis(5),
        phase: AbortPhase::BeforeFirstByte,
    });
    cfg.admin_urls = urls;
    let planned = load::plan(&cfg);
    let s = load::run(&cfg).await.unwrap();
    assert_eq!(s.count, 60);
    assert_eq!(s.ok + s.errors.values().sum::<usize>(), 60);
    let aborts = planned
        .requests
        .iter()
        .filter(|r| r.abort.is_some())
        .count();
    assert_eq!(s.aborted, aborts, "{}", s.line());
    let faults_not_aborted = planned
        .requests
        .iter()
        .filter(|r| r.abort.is_none() && r.headers.iter().any(|(k, _)| k == "x-fake-fault"))
        .count();
    assert_eq!(
        s.errors.get("status:503").copied().unwrap_or(0),
        faults_not_aborted
    );
    assert!(s.latency_ms.max >= s.latency_ms.p50);
    for p in ps {
        p.shutdown().await;
    }
}

#[tokio::test]
async fn hold_spreads_evenly_over_round_robin_targets() {
    let ps = pods(3).await;
    let urls: Vec<String> = ps.iter().map(|p| p.url()).collect();
    let mut cfg = LoadConfig::new(
        urls.clone(),
        Workload::Hold(HoldSpec {
            concurrency: 9,
            max_tokens: 50,
            prompt_tokens: 16,
            stream: true,
        }),
    );
    cfg.admin_urls = urls;
    let s = load::run(&cfg).await.unwrap();
    assert_eq!(s.ok, 9);
    assert!(s.per_pod.values().all(|&n| n == 3), "{:?}", s.per_pod);
    let r = s.pods.unwrap();
    assert!(r.pods.iter().all(|p| p.peak_running == 3));
    assert!((r.imbalance - 1.0).abs() < 1e-9);
    for p in ps {
        p.shutdown().await;
    }
}
