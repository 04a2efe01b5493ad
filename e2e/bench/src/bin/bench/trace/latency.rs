//! The gateway time the plugin adds under the trace's concurrency (issue 47; `ailb-bench
//! latency`): the trace replayed through one gateway running prefix_cache as a user configures
//! it and through the same gateway without the plugin (the emulator's round robin), alternately,
//! on the same pods and arrivals.
//!
//! A request's gateway time is its client-side time to the first body bytes minus the pod's own
//! time to first token (`fake_ttft_us`, from the pod having the whole request): the request's
//! way through the gateway (buffering, the plugin's decision, the Redis round trip) and the
//! first chunk's way back, with the pod's queueing and prefill taken out, so the two routers'
//! different placements do not count. Both runs go through the emulator, so its own proxying
//! cancels; routing the baseline straight to the pods (the trace bench's in-process round
//! robin) would charge the plugin with the emulator's HTTP hops, which a real gateway has
//! whether the plugin runs or not.

use super::fleet::LLMD_H100;
use super::run::{bench, penalty_ms, plugin_config};
use super::{default_trace, opts, scale, trace_name, TRACE_PODS};
use crate::common::percentile;
use ailb_bench::trace::mooncake;
use ailb_bench::trace::replay::{replay, Target};
use ailb_bench::trace::workload::Workload;
use ailb_e2e::bed::Bed;
use ailb_e2e::gateway::Gateway;
use serde_json::{json, Value};

/// Alternate runs of each (plugin, none, plugin, none, …); `AILB_LATENCY_ROUNDS` overrides.
const ROUNDS: usize = 2;

pub fn gateway_added_under_load() -> anyhow::Result<()> {
    let s = scale();
    let path = default_trace();
    let rows = mooncake::read(&path)?;
    let w = mooncake::workload(&trace_name(&path), &rows, s.tokens, 0);
    let bed = LLMD_H100.bed(TRACE_PODS, s);
    let lb = json!({ "maxTTFTPenaltyMs": penalty_ms(s) });
    let plugin = plugin_config(bed.redis.port, &lb);
    let (mut px, mut none) = (Vec::new(), Vec::new());
    let rounds = std::env::var("AILB_LATENCY_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ROUNDS);
    for _ in 0..rounds {
        px.extend(added_ms(
            &bed,
            &w,
            "lat_prefix_cache",
            Some(plugin.clone()),
        )?);
        none.extend(added_ms(&bed, &w, "lat_no_plugin", None)?);
    }
    px.sort_by(f64::total_cmp);
    none.sort_by(f64::total_cmp);
    eprintln!(
        "trace latency: gateway time p50 / p90 / p99: prefix_cache {:.2} / {:.2} / {:.2} ms, no plugin {:.2} / {:.2} / {:.2} ms ({} and {} requests)",
        percentile(&px, 0.5), percentile(&px, 0.9), percentile(&px, 0.99),
        percentile(&none, 0.5), percentile(&none, 0.9), percentile(&none, 0.99),
        px.len(), none.len()
    );
    bench(
        "trace_gateway_added_ms_p50",
        percentile(&px, 0.5) - percentile(&none, 0.5),
        "ms",
    );
    Ok(())
}

/// One replay of `w` through a gateway with `plugin` (None: without the plugin); every
/// answered request's gateway time in wall ms.
fn added_ms(
    bed: &Bed,
    w: &Workload,
    name: &str,
    plugin: Option<Value>,
) -> anyhow::Result<Vec<f64>> {
    let s = scale();
    bed.reset_pods();
    bed.redis.cmd(&["FLUSHALL"]);
    bed.redis.cmd(&["CONFIG", "RESETSTAT"]);
    let mut spec = bed.spec(name, plugin);
    spec.upstream_timeout_ms = 600_000;
    let gw = Gateway::start(&spec)?;
    let t = std::time::Instant::now();
    let records = bed.rt.block_on(replay(
        w,
        &bed.pods,
        Target::Urls(vec![gw.url.clone()]),
        opts(s),
    ));
    let wall = t.elapsed().as_secs_f64();
    let (vm_ns, vm_calls) = (gw.stat("gateway.vm_call_ns"), gw.stat("gateway.vm_calls"));
    if std::env::var_os("AILB_PROF").is_some() {
        crate::cluster::prof_breakdown(&gw, name);
        let info = bed.redis.cmd(&["INFO", "commandstats"]);
        eprintln!("REDIS {name} {}", info.as_str().unwrap_or_default());
        for (k, v) in gw
            .stats()
            .iter()
            .filter(|(k, v)| k.starts_with("ai_lb") && **v != 0)
        {
            eprintln!("STAT {name} {k} {v}");
        }
    }
    drop(gw);
    let ms: Vec<f64> = records
        .iter()
        .filter(|r| r.error.is_none())
        .filter_map(|r| r.ttft_client?.checked_sub(r.ttft_pod?))
        .map(|d| d.as_secs_f64() * 1e3 / s.time)
        .collect();
    let errors = records.iter().filter(|r| r.error.is_some()).count();
    eprintln!(
        "trace latency {name}: {} answered, {errors} errors in {wall:.1} s; VM {:.2} s in {vm_calls} calls ({:.1} us each)",
        ms.len(),
        vm_ns as f64 / 1e9,
        vm_ns as f64 / vm_calls.max(1) as f64 / 1e3
    );
    anyhow::ensure!(
        ms.len() * 10 >= records.len() * 9,
        "{name}: too many failures"
    );
    Ok(ms)
}
