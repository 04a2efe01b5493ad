//! Priority classes under overload (README "Priority classes"): 2 gateways x 2 workers in front
//! of 4 fake pods, 150% of the pool's capacity offered in 3 classes; the same arrival sequence's
//! critical requests alone give the idle baseline.

use crate::common::percentile;
use ailb_e2e::bed::{chat_body, wait_for_zero, Bed};
use ailb_e2e::gateway::{glr_config, http, Gateway};
use serde_json::json;
use std::time::{Duration, Instant};

const PODS: usize = 4;
/// Each pod runs this many requests at once (more wait in its queue).
const SLOTS: usize = 3;
/// 20 tokens x 10 ms: ~200 ms per request.
const TOKENS: u64 = 20;
const SERVICE_S: f64 = 0.2;
const SECONDS: f64 = 10.0;
const CLASSES: [&str; 3] = ["critical", "standard", "sheddable"];

/// One arrival: when (from the start), which class.
#[derive(Clone, Copy)]
struct Arrival {
    at: Duration,
    class: usize,
}

/// Poisson arrivals at `rate` per second for [`SECONDS`]; 20% critical, 40% standard, 40%
/// sheddable, from a fixed seed (SplitMix64), so every run replays the same sequence.
fn arrivals(rate: f64) -> Vec<Arrival> {
    let mut state: u64 = 0x5eed_1234;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut t = 0.0;
    let mut out = Vec::new();
    loop {
        t += -(1.0 - next()).ln() / rate;
        if t >= SECONDS {
            return out;
        }
        let u = next();
        let class = if u < 0.2 {
            0
        } else if u < 0.6 {
            1
        } else {
            2
        };
        out.push(Arrival {
            at: Duration::from_secs_f64(t),
            class,
        });
    }
}

/// Replays `seq` through the gateways (alternating); per request: class, status, latency ms.
fn replay(gws: &[&Gateway], seq: &[Arrival]) -> Vec<(usize, u16, f64)> {
    let start = Instant::now();
    let mut threads = Vec::new();
    for (i, a) in seq.iter().enumerate() {
        if let Some(wait) = a.at.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let url = gws[i % gws.len()].url.clone();
        let class = a.class;
        threads.push(std::thread::spawn(move || {
            let body = chat_body(&format!("request {i}"), TOKENS);
            let headers = [
                ("content-type", "application/json"),
                ("x-priority", CLASSES[class]),
            ];
            let t0 = Instant::now();
            let status = http(&url, "POST", "/v1/chat/completions", &headers, &body)
                .map(|(s, _, _)| s)
                .unwrap_or(0);
            (class, status, t0.elapsed().as_secs_f64() * 1000.0)
        }));
    }
    threads.into_iter().filter_map(|t| t.join().ok()).collect()
}

fn critical_p99(results: &[(usize, u16, f64)]) -> anyhow::Result<f64> {
    let mut ms: Vec<f64> = results
        .iter()
        .filter(|(c, _, _)| *c == 0)
        .map(|(_, status, ms)| {
            anyhow::ensure!(*status == 200, "a critical request got {status}");
            Ok(*ms)
        })
        .collect::<anyhow::Result<_>>()?;
    ms.sort_by(f64::total_cmp);
    Ok(percentile(&ms, 0.99))
}

pub fn priority_under_overload() -> anyhow::Result<()> {
    let bed = Bed::new(PODS, |c| {
        c.max_running = SLOTS;
        c.decode_us_per_token = 10_000;
        c.decode_batch_penalty = 0.0;
        c.prefill_us_per_token = 1;
    });
    // Per pod: sheddable up to 1 in flight, standard 2, critical 3 = the pod's slots, so a
    // critical request never waits in a pod's queue.
    let cfg = glr_config(
        bed.redis.port,
        json!({"maxRequestCount": 2, "priorityHeader": "x-priority", "criticalHeadroom": 1,
               "priorityReserve": 1}),
    );
    let a = bed.gateway(&bed.spec("prio-a", Some(cfg.clone())));
    let b = bed.gateway(&bed.spec("prio-b", Some(cfg)));
    let gws = [&a, &b];
    let capacity = (PODS * SLOTS) as f64 / SERVICE_S;
    let seq = arrivals(1.5 * capacity);
    let critical_only: Vec<Arrival> = seq.iter().copied().filter(|a| a.class == 0).collect();

    bed.reset_pods();
    let idle = replay(&gws, &critical_only);
    anyhow::ensure!(wait_for_zero(&bed, Duration::from_secs(10)).is_zero());
    bed.reset_pods();
    let overload = replay(&gws, &seq);
    let left = wait_for_zero(&bed, Duration::from_secs(10));
    anyhow::ensure!(left.is_zero(), "counts or leases left: {left:?}");

    let share = |class: usize| {
        let sent = overload.iter().filter(|r| r.0 == class).count();
        let shed = overload
            .iter()
            .filter(|r| r.0 == class && r.1 == 429)
            .count();
        shed as f64 / sent.max(1) as f64
    };
    let shed = a.stat("ai_lb.priority.shed") + b.stat("ai_lb.priority.shed");
    let answered_429 = overload.iter().filter(|r| r.1 == 429).count() as i64;
    anyhow::ensure!(
        shed == answered_429,
        "counted {shed} sheds, answered {answered_429}"
    );
    eprintln!(
        "priority: {} arrivals ({:.0} rps, capacity {capacity:.0} rps), shed share critical {:.3} standard {:.3} sheddable {:.3}",
        seq.len(),
        seq.len() as f64 / SECONDS,
        share(0),
        share(1),
        share(2)
    );
    println!(
        "BENCH priority_critical_p99_ratio_overload_vs_idle {:.2} ratio",
        critical_p99(&overload)? / critical_p99(&idle)?
    );
    println!("BENCH priority_sheddable_shed_share {:.3} ratio", share(2));
    Ok(())
}
