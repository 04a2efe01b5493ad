//! prefix_cache benchmarks: plugin CPU on a long chat, and TTFT against round-robin.

use crate::common::vm_us_per_request;
use ailb_e2e::bed::Bed;
use ailb_e2e::gateway::Gateway;
use ailb_fakepod::load::Workload;
use serde_json::{json, Value};

pub fn prefix_config(port: u16) -> Value {
    json!({"lb_policy": "prefix_cache", "lb_config": {"serviceFQDN": "redis.static", "servicePort": port, "timeout": 1000}})
}

/// Plugin CPU per request for prefix_cache on the 10-turn ~8 KB chat: canonicalisation, SHA-1
/// chain and key formatting happen in the plugin on every request.
pub fn prefix_cpu() -> anyhow::Result<()> {
    let bed = Bed::new(2, |c| {
        c.decode_us_per_token = 0;
        c.prefill_us_per_token = 0;
        c.max_running = 64;
    });
    let gw = Gateway::start(&bed.spec("bench-px", Some(prefix_config(bed.redis.port))))?;
    let us = vm_us_per_request(&gw, 200, 2000)?;
    anyhow::ensure!(
        gw.stat("ai_lb.prefix.hit") > 0,
        "prefix_cache did not route"
    );
    println!("BENCH plugin_us_per_request_prefix_chat10 {us:.1} us");
    Ok(())
}

/// The Higress blog's GenAI-Perf setting, timings scaled down: 60 sessions x 5 rounds, ~200 new
/// prompt tokens per round, concurrency 20, shared system prompts, 2 gateways, 4 pods. The same
/// plan once through prefix_cache and once through per-gateway round-robin.
pub fn prefix_vs_round_robin() -> anyhow::Result<()> {
    let bed = Bed::new(4, |c| {
        c.max_running = 8;
        c.prefill_us_per_token = 200;
        c.decode_us_per_token = 5_000;
        c.decode_batch_penalty = 0.0;
    });
    let run_with = |plugin: Option<Value>, tag: &str| {
        bed.replay(
            tag,
            2,
            plugin,
            |_| {},
            Workload::Sessions(Default::default()),
            5,
        )
    };
    let px = run_with(Some(prefix_config(bed.redis.port)), "prefix")?;
    let rr = run_with(None, "rr")?;
    anyhow::ensure!(
        px.sequence == rr.sequence,
        "both runs must replay the same plan"
    );
    let hit =
        |s: &ailb_fakepod::load::Summary| s.pods.as_ref().map_or(f64::NAN, |p| p.prefix_hit_rate);
    println!("BENCH prefix_hit_rate {:.3} ratio", hit(&px));
    println!("BENCH prefix_hit_rate_round_robin {:.3} ratio", hit(&rr));
    println!(
        "BENCH ttft_p50_ratio_vs_round_robin {:.2} ratio",
        px.ttft_ms.p50 / rr.ttft_ms.p50
    );
    println!(
        "BENCH ttft_p99_ratio_vs_round_robin {:.2} ratio",
        px.ttft_ms.p99 / rr.ttft_ms.p99
    );
    Ok(())
}
