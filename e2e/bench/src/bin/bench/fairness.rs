//! Tenant fairness (docs/sessions-and-queues.md "Tenant fairness"): 2 gateways x 2 workers in front of 4 fake pods,
//! the pool capped at its pods' slots (`maxPoolRequests`). A quiet tenant and a tenant sending
//! 10x as much (more than the whole pool can serve) share it; the same arrival sequence's quiet
//! requests alone give the baseline. Also the peak pool load seen in Redis against the cap, and
//! for contrast the same flood through plain least request (no pool cap, no shares).

use crate::common::{percentile, poisson_arrivals};
use ailb_e2e::bed::{chat_body, wait_for_zero, Bed};
use ailb_e2e::gateway::{glr_config, http, Gateway, CLUSTER, ROUTE};
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PODS: usize = 4;
/// Each pod runs this many requests at once (more wait in its queue).
const SLOTS: usize = 3;
/// 20 tokens x 10 ms: ~200 ms per request.
const TOKENS: u64 = 20;
const SERVICE_S: f64 = 0.2;
const SECONDS: f64 = 10.0;
const TENANTS: [&str; 2] = ["quiet", "flood"];
const HEADER: &str = "x-gateway-inference-fairness-id";

/// One arrival: when (from the start), which tenant (0 quiet, 1 flood).
#[derive(Clone, Copy)]
struct Arrival {
    at: Duration,
    tenant: usize,
}

/// Poisson arrivals at `rate` per second for [`SECONDS`], 1 in 11 the quiet tenant's, from a
/// fixed seed (SplitMix64), so every run replays the same sequence.
fn arrivals(rate: f64) -> Vec<Arrival> {
    poisson_arrivals(0xfa12_5eed, rate, SECONDS)
        .into_iter()
        .map(|(at, u)| Arrival {
            at,
            tenant: usize::from(u >= 1.0 / 11.0),
        })
        .collect()
}

/// Replays `seq` through the gateways (alternating); per request: tenant, status, latency ms.
fn replay(gws: &[&Gateway], seq: &[Arrival]) -> Vec<(usize, u16, f64)> {
    let start = Instant::now();
    let mut threads = Vec::new();
    for (i, a) in seq.iter().enumerate() {
        if let Some(wait) = a.at.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let url = gws[i % gws.len()].url.clone();
        let tenant = a.tenant;
        threads.push(std::thread::spawn(move || {
            let body = chat_body(&format!("request {i}"), TOKENS);
            let headers = [
                ("content-type", "application/json"),
                (HEADER, TENANTS[tenant]),
            ];
            let t0 = Instant::now();
            let status = http(&url, "POST", "/v1/chat/completions", &headers, &body)
                .map(|(s, _, _)| s)
                .unwrap_or(0);
            (tenant, status, t0.elapsed().as_secs_f64() * 1000.0)
        }));
    }
    threads.into_iter().filter_map(|t| t.join().ok()).collect()
}

fn quiet_p99(results: &[(usize, u16, f64)]) -> anyhow::Result<f64> {
    let mut ms: Vec<f64> = results
        .iter()
        .filter(|(t, _, _)| *t == 0)
        .map(|(_, status, ms)| {
            anyhow::ensure!(*status == 200, "a quiet tenant's request got {status}");
            Ok(*ms)
        })
        .collect::<anyhow::Result<_>>()?;
    ms.sort_by(f64::total_cmp);
    Ok(percentile(&ms, 0.99))
}

pub fn fairness_under_a_flood() -> anyhow::Result<()> {
    let bed = Bed::new(PODS, |c| {
        c.max_running = SLOTS;
        c.decode_us_per_token = 10_000;
        c.decode_batch_penalty = 0.0;
        c.prefill_us_per_token = 1;
    });
    let cap = (PODS * SLOTS) as u64;
    let cfg = glr_config(
        bed.redis.port,
        json!({"maxPoolRequests": cap, "tenantHeader": HEADER, "defaultTenantShare": 0.5}),
    );
    let a = bed.gateway(&bed.spec("fair-a", Some(cfg.clone())));
    let b = bed.gateway(&bed.spec("fair-b", Some(cfg)));
    let gws = [&a, &b];
    // The flood alone offers 1.25x what the pool can serve; the quiet tenant a tenth of it.
    let capacity = cap as f64 / SERVICE_S;
    let seq = arrivals(1.25 * capacity * 1.1);
    let quiet_only: Vec<Arrival> = seq.iter().copied().filter(|a| a.tenant == 0).collect();

    bed.reset_pods();
    let alone = replay(&gws, &quiet_only);
    anyhow::ensure!(wait_for_zero(&bed, Duration::from_secs(10)).is_zero());
    bed.reset_pods();
    // The pool load in Redis, sampled while the flood runs.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (stop, port) = (stop.clone(), bed.redis.port);
        std::thread::spawn(move || {
            let mut peak = 0.0f64;
            while !stop.load(Ordering::Relaxed) {
                if let Some(c) = ailb_e2e::redis::try_counts(port, ROUTE, CLUSTER) {
                    peak = peak.max(c.total());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            peak
        })
    };
    let mixed = replay(&gws, &seq);
    stop.store(true, Ordering::Relaxed);
    let peak = sampler.join().unwrap_or(f64::NAN);
    let left = wait_for_zero(&bed, Duration::from_secs(10));
    anyhow::ensure!(
        left.is_zero(),
        "counts, leases or tenant counts left: {left:?}"
    );

    let shed = a.stat("ai_lb.tenant.shed") + b.stat("ai_lb.tenant.shed");
    let flood_429 = mixed.iter().filter(|r| r.0 == 1 && r.1 == 429).count();
    let flood_sent = mixed.iter().filter(|r| r.0 == 1).count();
    eprintln!(
        "fairness: {} arrivals ({:.0} rps, capacity {capacity:.0} rps), quiet {} requests, flood refused {flood_429}/{flood_sent} (shed_tenant {shed}, pool.full {})",
        seq.len(),
        seq.len() as f64 / SECONDS,
        quiet_only.len(),
        a.stat("ai_lb.pool.full") + b.stat("ai_lb.pool.full"),
    );
    println!(
        "BENCH fairness_quiet_tenant_p99_ratio {:.2} ratio",
        quiet_p99(&mixed)? / quiet_p99(&alone)?
    );
    println!(
        "BENCH fairness_pool_peak_over_cap {:.2} ratio",
        peak / cap as f64
    );

    // Contrast: the same sequence without the pool cap or shares queues in the pods.
    let plain = glr_config(bed.redis.port, json!({}));
    let c = bed.gateway(&bed.spec("plain-a", Some(plain.clone())));
    let d = bed.gateway(&bed.spec("plain-b", Some(plain)));
    bed.reset_pods();
    let unfair = replay(&[&c, &d], &seq);
    anyhow::ensure!(wait_for_zero(&bed, Duration::from_secs(30)).is_zero());
    println!(
        "BENCH fairness_quiet_tenant_p99_ratio_without_shares {:.2} ratio",
        quiet_p99(&unfair)? / quiet_p99(&alone)?
    );
    Ok(())
}
