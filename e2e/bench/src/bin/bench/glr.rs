//! global_least_request benchmarks: plugin CPU and added latency, the leak check under faults,
//! and the p99 against each gateway's local least-request.

use crate::common::{chat10, lognormal_sizes, percentile};
use ailb_e2e::bed::Bed;
use ailb_e2e::gateway::{glr_config, http, Gateway};
use ailb_e2e::storm;
use ailb_fakepod::load::Workload;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Plugin CPU per request from the emulator's VM-time counters, and the latency the gateway
/// (emulator + plugin + Redis) adds over going straight to the pod, interleaved request by
/// request so both see the same machine state.
pub fn plugin_cpu_and_added_latency() -> anyhow::Result<()> {
    let bed = Bed::new(2, |c| {
        c.decode_us_per_token = 0;
        c.prefill_us_per_token = 0;
        c.max_running = 64;
    });
    let gw = Gateway::start(&bed.spec("bench", Some(glr_config(bed.redis.port, json!({})))))?;
    let body = chat10();
    assert!(body.len() > 7000, "chat10 body is {} bytes", body.len());
    let post = |base: &str| -> anyhow::Result<Duration> {
        let t = Instant::now();
        let (status, _, _) = http(
            base,
            "POST",
            "/v1/chat/completions",
            &[("content-type", "application/json")],
            &body,
        )?;
        anyhow::ensure!(status == 200, "status {status}");
        Ok(t.elapsed())
    };
    for _ in 0..200 {
        post(&gw.url)?; // warm-up: connections, JIT'd code paths, Redis script cache
    }
    let (ns0, n0) = (
        gw.stat("gateway.vm_call_ns"),
        gw.stat("gateway.streams_destroyed"),
    );
    let direct_url = bed.pods[0].url();
    let (mut via, mut direct) = (Vec::new(), Vec::new());
    for _ in 0..2000 {
        via.push(post(&gw.url)?.as_secs_f64() * 1e3);
        direct.push(post(&direct_url)?.as_secs_f64() * 1e3);
    }
    let (ns1, n1) = (
        gw.stat("gateway.vm_call_ns"),
        gw.stat("gateway.streams_destroyed"),
    );
    anyhow::ensure!(
        n1 > n0,
        "the emulator reports no VM time (gateway.vm_call_ns)"
    );
    println!(
        "BENCH plugin_us_per_request_chat10 {:.1} us",
        (ns1 - ns0) as f64 / (n1 - n0) as f64 / 1e3
    );
    if std::env::var_os("AILB_PROF").is_some() {
        crate::cluster::prof_breakdown(&gw, "chat10");
    }
    via.sort_by(f64::total_cmp);
    direct.sort_by(f64::total_cmp);
    println!(
        "BENCH gateway_added_ms_p50 {:.3} ms",
        percentile(&via, 0.5) - percentile(&direct, 0.5)
    );
    println!(
        "BENCH gateway_added_ms_p99 {:.3} ms",
        percentile(&via, 0.99) - percentile(&direct, 0.99)
    );
    Ok(())
}

/// The fault storm of the e2e suite at length (storm::long_run): 10,000 requests with
/// aborts, resets, 429/503/504, Redis stalls (DEBUG SLEEP, SIGSTOP) and a restart, and two
/// gateway SIGKILLs; every count must come back to 0 and the surviving gateway's memory must
/// not grow beyond noise.
pub fn leak_check() -> anyhow::Result<()> {
    let mut bed = storm::bed();
    let started = Instant::now();
    let run = storm::long_run(&mut bed, 10_000, Duration::from_secs(50), 15, 11)?;
    eprintln!(
        "leak check: {} | faults {:?} | 429s {} orphaned picks {} | RSS {} -> {} -> {} KiB | left {:?} | {:.0} s",
        run.summary.line(),
        storm::LONG_RUN_CHAOS,
        run.rejected_429,
        run.orphaned,
        run.rss_start_kb,
        run.rss_mid_kb,
        run.rss_end_kb,
        run.left,
        started.elapsed().as_secs_f64()
    );
    println!("BENCH leak_check_requests {} requests", run.summary.count);
    println!(
        "BENCH leaked_counts {} counts",
        run.left.total() as i64 + run.left.leases.max(0)
    );
    println!(
        "BENCH gateway_rss_growth_mb {:.1} MB",
        (run.rss_end_kb as f64 - run.rss_start_kb as f64) / 1024.0
    );
    // A leak grows about as much in the second half as in the first; a plateau (allocator and
    // wasm linear memory reaching their high-water marks) grows in the first only.
    println!(
        "BENCH gateway_rss_growth_second_half_mb {:.1} MB",
        (run.rss_end_kb as f64 - run.rss_mid_kb as f64) / 1024.0
    );
    Ok(())
}

/// Photoroom's "local view" setting: 4 gateway processes, 8 pods, ~1 s requests (scaled) with
/// skewed sizes; the same arrival sequence once with the plugin and once with each gateway
/// worker's own least-request.
pub fn p99_vs_local_least_request() -> anyhow::Result<()> {
    // Pods take 2 requests at a time and the pool runs at about 90% of its capacity, so the
    // tail is made of queueing, which is what a local view causes.
    let bed = Bed::new(8, |c| {
        c.max_running = 2;
        c.decode_us_per_token = 10_000;
        c.decode_batch_penalty = 0.0;
        c.prefill_us_per_token = 10;
    });
    // ~1 s median (100 tokens x 10 ms); 16 slots x 0.9 / ~1.05 s = ~13.7 rps.
    let workload = || lognormal_sizes(600, 44, 100.0, 0.3, 500);
    let least_request =
        |spec: &mut ailb_e2e::gateway::GatewaySpec| spec.cluster_lb = "least_request".into();
    let run_with = |plugin: Option<Value>, tag: &str| {
        bed.replay(
            tag,
            4,
            plugin,
            least_request,
            Workload::Skewed(workload()),
            3,
        )
    };
    let glr = run_with(Some(glr_config(bed.redis.port, json!({}))), "glr")?;
    let local = run_with(None, "local")?;
    anyhow::ensure!(
        glr.sequence == local.sequence,
        "both runs must replay the same arrivals"
    );
    println!(
        "BENCH p99_ratio_glr_vs_local_least_request {:.2} ratio",
        glr.latency_ms.p99 / local.latency_ms.p99
    );
    Ok(())
}
