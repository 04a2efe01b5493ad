//! Priority classes under overload (docs/sessions-and-queues.md "Priority classes"): 2 gateways x 2 workers in front
//! of 4 fake pods, 150% of the pool's capacity offered in 3 classes; the same arrival sequence's
//! critical requests alone give the idle baseline. Priority ceilings ("Priority ceilings"): an
//! honest critical tenant beside a flood of forged `critical` requests from a tenant capped at
//! `sheddable`, against the honest tenant alone.

use crate::common::{percentile, poisson_arrivals};
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
const DEBUG: &str = "x-ai-lb-debug";
/// The tenant header of the ceilings bench (Higress's auth plugins set `X-Mse-Consumer`).
const TENANT: &str = "x-mse-consumer";

/// One arrival: when (from the start), which class, from which tenant (None: no tenant header).
#[derive(Clone, Copy)]
struct Arrival {
    at: Duration,
    class: usize,
    tenant: Option<&'static str>,
}

/// Poisson arrivals at `rate` per second for [`SECONDS`]; 20% critical, 40% standard, 40%
/// sheddable, from a fixed seed (SplitMix64), so every run replays the same sequence.
fn arrivals(rate: f64) -> Vec<Arrival> {
    poisson_arrivals(0x5eed_1234, rate, SECONDS)
        .into_iter()
        .map(|(at, u)| Arrival {
            at,
            class: if u < 0.2 {
                0
            } else if u < 0.6 {
                1
            } else {
                2
            },
            tenant: None,
        })
        .collect()
}

/// Replays `seq` through the gateways (alternating); per request: class, status, latency ms.
fn replay(gws: &[&Gateway], seq: &[Arrival]) -> Vec<(usize, u16, f64)> {
    replay_with(gws, seq)
        .into_iter()
        .map(|(c, s, ms, _)| (c, s, ms))
        .collect()
}

/// [`replay`], also returning each answer's debug header ([`DEBUG`], empty when absent).
fn replay_with(gws: &[&Gateway], seq: &[Arrival]) -> Vec<(usize, u16, f64, String)> {
    replay_all(gws, seq)
        .into_iter()
        .map(|(a, s, ms, d)| (a.class, s, ms, d))
        .collect()
}

/// Replays `seq` through the gateways (alternating); per request: its arrival, status,
/// latency ms and debug header.
fn replay_all(gws: &[&Gateway], seq: &[Arrival]) -> Vec<(Arrival, u16, f64, String)> {
    let start = Instant::now();
    let mut threads = Vec::new();
    for (i, a) in seq.iter().enumerate() {
        if let Some(wait) = a.at.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let url = gws[i % gws.len()].url.clone();
        let a = *a;
        threads.push(std::thread::spawn(move || {
            let body = chat_body(&format!("request {i}"), TOKENS);
            let mut headers = vec![
                ("content-type", "application/json"),
                ("x-priority", CLASSES[a.class]),
            ];
            headers.extend(a.tenant.map(|t| (TENANT, t)));
            let t0 = Instant::now();
            let (status, debug) = http(&url, "POST", "/v1/chat/completions", &headers, &body)
                .map(|(s, h, _)| {
                    let d = h
                        .into_iter()
                        .find(|(k, _)| k == DEBUG)
                        .map(|(_, v)| v)
                        .unwrap_or_default();
                    (s, d)
                })
                .unwrap_or((0, String::new()));
            (a, status, t0.elapsed().as_secs_f64() * 1000.0, debug)
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

/// Priority ceilings (docs/sessions-and-queues.md "Priority ceilings"): the same bed and caps as
/// [`priority_under_overload`]; an honest tenant sends `critical` at a quarter of the pool's
/// capacity, and a flooder capped at `sheddable` sends forged `critical` at 150% of it. The
/// honest tenant's p99 with the flood over its p99 alone (the same arrivals, in one run);
/// for contrast, the same flood on a route without ceilings (printed, not a BENCH line).
pub fn forged_flood() -> anyhow::Result<()> {
    const HONEST: &str = "honest";
    const FLOODER: &str = "flooder";
    let bed = Bed::new(PODS, |c| {
        c.max_running = SLOTS;
        c.decode_us_per_token = 10_000;
        c.decode_batch_penalty = 0.0;
        c.prefill_us_per_token = 1;
    });
    // Caps as priority_under_overload's. `tenantHeader` turns tenant fairness on too: a share
    // of 1 of a pool whose capacity is its pods' slots (the critical cap, headroom included)
    // keeps it from refusing anyone, so what is measured is the ceiling alone.
    let lb = json!({"maxRequestCount": 2, "priorityHeader": "x-priority", "criticalHeadroom": 1,
                    "priorityReserve": 1, "maxPoolRequests": PODS * SLOTS,
                    "tenantHeader": TENANT, "defaultTenantShare": 1.0});
    let mut ceilings = lb.clone();
    ceilings["priorityCeilings"] = json!({HONEST: "critical", FLOODER: "sheddable"});
    let capacity = (PODS * SLOTS) as f64 / SERVICE_S;
    let tagged = |seed: u64, rate: f64, tenant: &'static str| {
        poisson_arrivals(seed, rate, SECONDS)
            .into_iter()
            .map(move |(at, _)| Arrival {
                at,
                class: 0,
                tenant: Some(tenant),
            })
    };
    let honest: Vec<Arrival> = tagged(0x0c1a_4d01, 0.25 * capacity, HONEST).collect();
    let mut flooded: Vec<Arrival> = honest
        .iter()
        .copied()
        .chain(tagged(0x0c1a_4d02, 1.5 * capacity, FLOODER))
        .collect();
    flooded.sort_by_key(|a| a.at);
    let floods = (flooded.len() - honest.len()) as i64;

    let p99 = |results: &[(Arrival, u16, f64, String)]| {
        let mut ms: Vec<f64> = results
            .iter()
            .filter(|r| r.0.tenant == Some(HONEST) && r.1 == 200)
            .map(|r| r.2)
            .collect();
        ms.sort_by(f64::total_cmp);
        let sent = results
            .iter()
            .filter(|r| r.0.tenant == Some(HONEST))
            .count();
        (
            percentile(&ms, 0.99),
            1.0 - ms.len() as f64 / sent.max(1) as f64,
        )
    };
    // Replays each sequence in turn through 2 fresh gateways on `lb`: the honest tenant's p99
    // and refused share in each, and the clamps counted.
    let run = |lb: &serde_json::Value, tag: &str, seqs: &[&[Arrival]]| -> anyhow::Result<_> {
        let cfg = glr_config(bed.redis.port, lb.clone());
        let a = bed.gateway(&bed.spec(&format!("{tag}-a"), Some(cfg.clone())));
        let b = bed.gateway(&bed.spec(&format!("{tag}-b"), Some(cfg)));
        let mut out = Vec::new();
        for seq in seqs {
            bed.reset_pods();
            out.push(p99(&replay_all(&[&a, &b], seq)));
            let left = wait_for_zero(&bed, Duration::from_secs(10));
            anyhow::ensure!(left.is_zero(), "counts or leases left: {left:?}");
        }
        let clamped = a.stat("ai_lb.priority.clamped") + b.stat("ai_lb.priority.clamped");
        Ok((out, clamped))
    };

    let (measured, clamped) = run(&ceilings, "ceil", &[&honest, &flooded])?;
    let [(alone, alone_shed), (flood, flood_shed)] = measured[..] else {
        anyhow::bail!("two replays, {} results", measured.len());
    };
    anyhow::ensure!(
        alone_shed == 0.0 && flood_shed == 0.0,
        "honest critical requests refused: alone {alone_shed:.3}, with the flood {flood_shed:.3}"
    );
    anyhow::ensure!(
        clamped == floods,
        "{clamped} clamps counted for {floods} forged requests"
    );
    let (open, _) = run(&lb, "open", &[&flooded])?;
    let [(open_flood, open_shed)] = open[..] else {
        anyhow::bail!("one replay, {} results", open.len());
    };
    eprintln!(
        "priority ceilings: {} honest critical + {floods} forged (flooder capped at sheddable); \
         honest p99 {alone:.0} ms alone, {flood:.0} ms with the flood; the same flood without \
         ceilings: honest p99 {open_flood:.0} ms, {open_shed:.3} of the honest requests refused",
        honest.len()
    );
    println!(
        "BENCH priority_forged_flood_p99_ratio {:.2} ratio",
        flood / alone
    );
    Ok(())
}

/// The waiting queue (docs/sessions-and-queues.md "Waiting queue") under the same 150% overload and the same
/// arrival sequence as [`priority_under_overload`]: requests over the pool wait up to
/// `QUEUE_TIMEOUT_MS` instead of a 429, highest class first across both gateways. Measured, not
/// asserted: the critical p99 (and its ratio to the idle run of the critical requests alone),
/// the share of waiting requests that reached the deadline, and each class's 429 share.
pub fn queue_under_overload() -> anyhow::Result<()> {
    const QUEUE_TIMEOUT_MS: u64 = 2000;
    let bed = Bed::new(PODS, |c| {
        c.max_running = SLOTS;
        c.decode_us_per_token = 10_000;
        c.decode_batch_penalty = 0.0;
        c.prefill_us_per_token = 1;
    });
    let cfg = glr_config(
        bed.redis.port,
        json!({"maxRequestCount": 2, "priorityHeader": "x-priority", "criticalHeadroom": 1,
               "priorityReserve": 1, "debugHeader": DEBUG, "queueTimeoutMs": QUEUE_TIMEOUT_MS}),
    );
    let a = bed.gateway(&bed.spec("queue-a", Some(cfg.clone())));
    let b = bed.gateway(&bed.spec("queue-b", Some(cfg)));
    let gws = [&a, &b];
    let capacity = (PODS * SLOTS) as f64 / SERVICE_S;
    let seq = arrivals(1.5 * capacity);
    let critical_only: Vec<Arrival> = seq.iter().copied().filter(|a| a.class == 0).collect();

    bed.reset_pods();
    let idle = replay(&gws, &critical_only);
    anyhow::ensure!(wait_for_zero(&bed, Duration::from_secs(10)).is_zero());
    bed.reset_pods();
    let overload = replay_with(&gws, &seq);
    let left = wait_for_zero(&bed, Duration::from_secs(10));
    anyhow::ensure!(left.is_zero(), "counts or leases left: {left:?}");

    let stat = |name: &str| a.stat(name) + b.stat(name);
    let (queued, timeout) = (stat("ai_lb.queue.queued"), stat("ai_lb.queue.timeout"));
    let admitted = stat("ai_lb.queue.admitted");
    anyhow::ensure!(
        admitted + timeout == queued,
        "queued {queued} = admitted {admitted} + timed out {timeout} (+ abandoned)"
    );
    let queued_ms = |class: usize| {
        let mut ms: Vec<f64> = overload
            .iter()
            .filter(|r| r.0 == class && r.1 == 200)
            .filter_map(|r| {
                r.3.split("; ")
                    .find_map(|kv| kv.strip_prefix("queued_ms="))
                    .and_then(|v| v.parse::<f64>().ok())
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        (
            ms.len(),
            if ms.is_empty() {
                0.0
            } else {
                percentile(&ms, 0.5)
            },
        )
    };
    let share = |class: usize| {
        let sent = overload.iter().filter(|r| r.0 == class).count();
        let refused = overload
            .iter()
            .filter(|r| r.0 == class && r.1 == 429)
            .count();
        refused as f64 / sent.max(1) as f64
    };
    let plain: Vec<(usize, u16, f64)> = overload.iter().map(|r| (r.0, r.1, r.2)).collect();
    let p99 = critical_p99(&plain)?;
    eprintln!(
        "queue: {} arrivals, queued {queued}, admitted {admitted}, timed out {timeout}; \
         429 share critical {:.3} standard {:.3} sheddable {:.3}; waited (n, p50 ms) \
         critical {:?} standard {:?} sheddable {:?}",
        seq.len(),
        share(0),
        share(1),
        share(2),
        queued_ms(0),
        queued_ms(1),
        queued_ms(2)
    );
    println!("BENCH queue_critical_p99_ms {p99:.0} ms");
    println!(
        "BENCH queue_critical_p99_ratio_overload_vs_idle {:.2} ratio",
        p99 / critical_p99(&idle)?
    );
    println!(
        "BENCH queue_timeout_share {:.3} ratio",
        timeout as f64 / queued.max(1) as f64
    );
    println!("BENCH queue_sheddable_429_share {:.3} ratio", share(2));
    Ok(())
}
