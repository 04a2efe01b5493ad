//! prefix_cache in plain Envoy (no Redis): 2 real Envoy processes × 2 workers sharing nothing,
//! 4 fake pods, the prefix benchmark's sessions (60 × 5 rounds, 4 shared system prompts,
//! concurrency 20) with each session's rounds alternating between the two proxies. The same
//! plan runs through Envoy with the plugin, through Envoy alone (round robin) and through the
//! Higress build with Redis in the emulator (2 gateways). Then the latency Envoy+plugin adds
//! over Envoy alone.

use crate::common::{chat10, percentile};
use crate::prefix::prefix_config;
use ailb_e2e::bed::Bed;
use ailb_e2e::envoy::Envoy;
use ailb_e2e::gateway::{http, Gateway};
use ailb_fakepod::load::{self, LoadConfig, Summary, Workload};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn envoy_prefix_plugin(pods: &[String]) -> Value {
    json!({"lb_policy": "prefix_cache", "lb_config": {"endpoints": pods}})
}

/// Runs the sessions plan through `targets`, every session's round r through target
/// (session + r) % 2; returns the summary and the plan's fingerprint.
fn run(bed: &Bed, tag: &str, targets: Vec<String>) -> anyhow::Result<(Summary, String)> {
    let mut lc = LoadConfig::new(targets, Workload::Sessions(Default::default()));
    lc.seed = 5;
    lc.timeout = Duration::from_secs(120);
    lc.admin_urls = bed.pods.iter().map(|p| p.url()).collect();
    lc.reset_pods = true;
    let mut plan = load::plan(&lc);
    for r in &mut plan.requests {
        if let Some((session, round)) = r.session {
            r.target = (session + round) % 2;
        }
    }
    let fingerprint = plan.fingerprint();
    let s = bed.rt.block_on(load::run_plan(&lc, &plan))?;
    eprintln!("envoy-prefix {tag}: {}", s.line());
    anyhow::ensure!(
        s.ok == s.count,
        "{tag}: {} of {} failed",
        s.count - s.ok,
        s.count
    );
    Ok((s, fingerprint))
}

pub fn envoy_prefix_vs_round_robin_and_redis() -> anyhow::Result<()> {
    let bed = Bed::new(4, |c| {
        c.max_running = 8;
        c.prefill_us_per_token = 200;
        c.decode_us_per_token = 5_000;
        c.decode_batch_penalty = 0.0;
    });
    let pods = bed.pod_addrs();
    let hit = |s: &Summary| s.pods.as_ref().map_or(f64::NAN, |p| p.prefix_hit_rate);

    let envoys = [
        Envoy::start(&pods, &envoy_prefix_plugin(&pods)),
        Envoy::start(&pods, &envoy_prefix_plugin(&pods)),
    ];
    let (px, f0) = run(
        &bed,
        "plugin",
        envoys.iter().map(|e| e.url.clone()).collect(),
    )?;
    let routed: i64 = envoys.iter().map(|e| e.stat("ai_lb.prefix.routed")).sum();
    anyhow::ensure!(
        routed == px.count as i64,
        "the plugin routed {routed} of {} requests",
        px.count
    );
    drop(envoys);

    let plain = [Envoy::start_plain(&pods), Envoy::start_plain(&pods)];
    let (rr, f1) = run(
        &bed,
        "round-robin",
        plain.iter().map(|e| e.url.clone()).collect(),
    )?;
    drop(plain);

    let gws: Vec<Gateway> = (0..2)
        .map(|i| {
            Gateway::start(&bed.spec(
                &format!("envoy-px-redis-{i}"),
                Some(prefix_config(bed.redis.port)),
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    let (redis, f2) = run(
        &bed,
        "higress-redis",
        gws.iter().map(|g| g.url.clone()).collect(),
    )?;
    drop(gws);
    anyhow::ensure!(
        f0 == f1 && f1 == f2,
        "the three runs must replay the same plan"
    );

    println!("BENCH envoy_prefix_hit_rate {:.3} ratio", hit(&px));
    println!(
        "BENCH envoy_prefix_hit_rate_round_robin {:.3} ratio",
        hit(&rr)
    );
    println!(
        "BENCH envoy_prefix_hit_rate_higress_redis {:.3} ratio",
        hit(&redis)
    );
    println!(
        "BENCH envoy_prefix_ttft_p50_ratio_vs_round_robin {:.2} ratio",
        px.ttft_ms.p50 / rr.ttft_ms.p50
    );
    Ok(())
}

/// The latency the plugin adds inside Envoy: the 10-turn ~8 KB chat through Envoy with the
/// prefix_cache plugin (the body held, read, canonicalised and hashed, the index read and
/// written) and through the same Envoy config without it, interleaved request by request.
pub fn envoy_added_latency() -> anyhow::Result<()> {
    let bed = Bed::new(2, |c| {
        c.decode_us_per_token = 0;
        c.prefill_us_per_token = 0;
        c.max_running = 64;
    });
    let pods = bed.pod_addrs();
    let with = Envoy::start(&pods, &envoy_prefix_plugin(&pods));
    let alone = Envoy::start_plain(&pods);
    let body = chat10();
    let post = |base: &str| -> anyhow::Result<f64> {
        let t = Instant::now();
        let (status, _, _) = http(
            base,
            "POST",
            "/v1/chat/completions",
            &[("content-type", "application/json")],
            &body,
        )?;
        anyhow::ensure!(status == 200, "status {status}");
        Ok(t.elapsed().as_secs_f64() * 1e3)
    };
    for _ in 0..200 {
        post(&with.url)?;
        post(&alone.url)?;
    }
    let (mut via, mut bare) = (Vec::new(), Vec::new());
    for _ in 0..2000 {
        via.push(post(&with.url)?);
        bare.push(post(&alone.url)?);
    }
    anyhow::ensure!(
        with.stat("ai_lb.prefix.routed") == 2200,
        "the plugin routed {} of 2200",
        with.stat("ai_lb.prefix.routed")
    );
    via.sort_by(f64::total_cmp);
    bare.sort_by(f64::total_cmp);
    eprintln!(
        "envoy-prefix added latency: p50 {:.3} / {:.3} ms, p99 {:.3} / {:.3} ms (with / alone)",
        percentile(&via, 0.5),
        percentile(&bare, 0.5),
        percentile(&via, 0.99),
        percentile(&bare, 0.99)
    );
    println!(
        "BENCH envoy_added_ms_p99 {:.3} ms",
        percentile(&via, 0.99) - percentile(&bare, 0.99)
    );
    Ok(())
}
