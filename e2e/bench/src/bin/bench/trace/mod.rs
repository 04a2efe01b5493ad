//! `ailb-bench trace [FILE]`: prefix routing on a real trace against the physical limit
//! (docs/trace-bench.md). One run, the same arrivals for every router:
//!
//! 1. the trace (default: e2e/data/traces/mooncake-synthetic.jsonl) on 8 pods of llm-d's H100
//!    cost model through the plugin (1 and 4 emulator gateways sharing Redis; one real Envoy),
//!    O2 the capacity-bounded oracle, O3 full-knowledge least load, round robin and the
//!    llm-d-style peer; O1 computed from the trace;
//! 2. the preamble variant (one common 2,000-token system message) through the plugin and
//!    round robin;
//! 3. a pod's cache flushed mid-trace (how long it keeps getting requests it cannot serve);
//!    then the trace with the engine-verified index on and off (verify.rs);
//! 4. the trace again with prefill four times cheaper;
//! 5. b2b-saas and code-generation load sweeps on 4 pods: the knee of each router.
//!
//! `ailb-bench slo` (slo.rs) is issue 50's benchmark on the same machinery: llm-d's
//! predicted-latency ladder on a fleet of two GPU speeds; `ailb-bench dp` (dp.rs) issue 49's
//! data-parallel ranks.
//!
//! Scaling (time and tokens, one factor each) is in fleet.rs; `AILB_TRACE_TIME_SCALE` and
//! `AILB_TRACE_TOKEN_SCALE` override it, `AILB_TRACE_LB_CONFIG` adds plugin keys, and
//! `AILB_TRACE_PARTS` (a comma list of `trace`, `preamble`, `flush`, `verify`, `cheap`, `sweeps`) runs
//! some parts only, for working on one.

pub mod dp;
mod fleet;
mod knee;
pub mod latency;
mod llmd_predictor;
mod peer;
mod plot;
mod plugin_keys;
mod recovery;
mod routers;
mod run;
pub mod slo;
mod slo_figures;
mod slo_rates;
mod sweeps;
mod verify;
mod window_fit;

use ailb_bench::trace::replay::Options;
use ailb_bench::trace::workload::Workload;
use ailb_bench::trace::{infinite, mooncake};
use ailb_e2e::bed::Bed;
use fleet::{Cost, Scale, CHEAP_PREFILL, LLMD_H100};
use run::{bench, plugin, run, Run, Via};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Pods of the trace runs (the fleet of the first replay and of llm-d's setup).
pub const TRACE_PODS: usize = 8;

fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|v: &f64| v.is_finite() && *v > 0.0)
        .unwrap_or(default)
}

/// The scale of every run: trace time 50× faster, token counts × 1/4 (docs/trace-bench.md
/// "Scaling").
pub fn scale() -> Scale {
    Scale {
        time: env_f64("AILB_TRACE_TIME_SCALE", 50.0),
        tokens: env_f64("AILB_TRACE_TOKEN_SCALE", 0.25),
    }
}

fn default_trace() -> PathBuf {
    ailb_e2e::repo_root().join("e2e/data/traces/mooncake-synthetic.jsonl")
}

/// `mooncake-synthetic.jsonl` → `mooncake_synthetic`.
fn trace_name(path: &std::path::Path) -> String {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("trace");
    stem.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// The in-process references for a bed.
fn references(bed: &ailb_e2e::bed::Bed, cost: &Cost, s: Scale) -> Vec<(&'static str, Via)> {
    let n = bed.pods.len();
    let engines = bed.pods.iter().map(|p| p.engine().clone()).collect();
    let blocks = cost.kv(s) as usize / Cost::block_tokens(s);
    vec![
        (
            "O2_oracle",
            Via::Router(Arc::new(routers::Oracle::new(engines))),
        ),
        (
            "O3_least_load",
            Via::Router(Arc::new(routers::LeastLoad::new(n))),
        ),
        (
            "round_robin",
            Via::Router(Arc::new(routers::RoundRobin::new(n))),
        ),
        (
            "llmd_style",
            Via::Router(Arc::new(peer::LlmdStyle::new(n, cost.mean_rate(s), blocks))),
        ),
    ]
}

fn part(name: &str) -> bool {
    std::env::var("AILB_TRACE_PARTS").map_or(true, |v| v.split(',').any(|p| p.trim() == name))
}

pub fn trace(file: Option<PathBuf>) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let s = scale();
    let path = file.unwrap_or_else(default_trace);
    let name = trace_name(&path);
    let rows = mooncake::read(&path)?;
    let w = mooncake::workload(&name, &rows, s.tokens, 0);
    let pre = mooncake::workload("preamble", &rows, s.tokens, 2000);
    let bt = Cost::block_tokens(s);
    let o1 = infinite::infinite_hit(&w, bt);
    eprintln!(
        "trace {name}: {} requests over {:.0} s; O1 {o1:.3} in the pods' blocks, {:.3} in the trace's",
        w.requests(),
        w.span().as_secs_f64(),
        infinite::trace_reusable_share(&rows)
    );

    // 1. The trace, every router.
    let bed = LLMD_H100.bed(TRACE_PODS, s);
    let mut shown: Vec<Run> = Vec::new();
    if part("trace") {
        shown = trace_routers(&bed, &w, s, o1)?;
    }
    if part("preamble") {
        preamble(&bed, &pre, s)?;
    }
    if part("flush") {
        flush(&bed, &w, s)?;
    }
    if part("verify") {
        verify::verify_on_over_off(&bed, &w, s)?;
    }
    drop(bed);
    if part("cheap") {
        cheap(&w, s)?;
    }
    if part("sweeps") {
        sweeps::b2b_and_codegen(s)?;
    }
    if !shown.is_empty() {
        let svg = ailb_e2e::repo_root().join(format!("e2e/target/ailb-bench/trace-{name}.svg"));
        let runs: Vec<&Run> = shown.iter().collect();
        plot::write(
            &svg,
            &format!(
                "{name}: {} requests, {TRACE_PODS} pods, same arrivals",
                w.requests()
            ),
            &runs,
            o1,
        )?;
        eprintln!("trace: picture in {}", svg.display());
    }
    bench("trace_section_wall_s", t0.elapsed().as_secs_f64(), "s");
    Ok(())
}

fn opts(s: Scale) -> Options {
    Options::new(s.time)
}

/// Every router on the trace; the runs, for the picture.
fn trace_routers(bed: &Bed, w: &Workload, s: Scale, o1: f64) -> anyhow::Result<Vec<Run>> {
    let name = &w.name;
    let px = run(bed, "prefix_cache", w, plugin(1, s), opts(s))?;
    let mut refs = Vec::new();
    for (label, via) in references(bed, &LLMD_H100, s) {
        refs.push(run(bed, label, w, via, opts(s))?);
    }
    let px4 = run(bed, "prefix_cache_4gw", w, plugin(4, s), opts(s))?;
    let envoy = run(
        bed,
        "envoy_prefix",
        w,
        Via::Envoy { lb: json!({}) },
        opts(s),
    )?;
    let o2 = &refs[0];
    let p = format!("trace_{name}");
    bench(
        &format!("{p}_hit_over_oracle_bounded"),
        px.hit() / o2.hit(),
        "ratio",
    );
    bench(&format!("{p}_hit_over_infinite"), px.hit() / o1, "ratio");
    bench(
        &format!("{p}_ttft_p90_over_oracle_bounded"),
        px.ttft(0.9) / o2.ttft(0.9),
        "ratio",
    );
    bench(
        &format!("{p}_envoy_hit_over_oracle_bounded"),
        envoy.hit() / o2.hit(),
        "ratio",
    );
    bench(
        "trace_hit_spread_1_vs_4_gateways",
        (px4.hit() - px.hit()).abs() / px.hit(),
        "ratio",
    );
    bench(
        "trace_shed_share",
        px.shed_share().max(px4.shed_share()),
        "ratio",
    );
    for r in std::iter::once(&px).chain(&refs).chain([&px4, &envoy]) {
        eprintln!("  {}", r.line());
    }
    let mut shown = vec![px, px4, envoy];
    shown.extend(refs);
    Ok(shown)
}

/// The preamble variant through the plugin and round robin.
fn preamble(bed: &Bed, pre: &Workload, s: Scale) -> anyhow::Result<()> {
    let pre_px = run(bed, "preamble_prefix_cache", pre, plugin(1, s), opts(s))?;
    let pre_rr = run(
        bed,
        "preamble_round_robin",
        pre,
        Via::Router(Arc::new(routers::RoundRobin::new(TRACE_PODS))),
        opts(s),
    )?;
    bench(
        "trace_preamble_ttft_p50_over_round_robin",
        pre_px.ttft(0.5) / pre_rr.ttft(0.5),
        "ratio",
    );
    bench(
        "trace_preamble_ttft_p99_over_round_robin",
        pre_px.ttft(0.99) / pre_rr.ttft(0.99),
        "ratio",
    );
    bench(
        "trace_preamble_pod_load_max_over_mean",
        pre_px.load_max_over_mean(TRACE_PODS),
        "ratio",
    );

    Ok(())
}

/// One pod's cache flushed a third of the way in.
fn flush(bed: &Bed, w: &Workload, s: Scale) -> anyhow::Result<()> {
    let flush_at = w.span() / 3;
    let engine = bed.pods[0].engine().clone();
    let mut o = opts(s);
    o.events
        .push((flush_at, Box::new(move || engine.restart())));
    let fl = run(bed, "prefix_cache_flush", w, plugin(1, s), o)?;
    let (back, normal, after, after_rate) = recovery::recovery(&fl, 0, flush_at);
    eprintln!("  flush of pod-0 at {:.0} s: wrong-pod share {normal:.3} before, {after_rate:.3} over the {after} requests it got after; back to normal after {back:?} of them", flush_at.as_secs_f64());
    // Without recovery within the run the count is only a lower bound: then the wrong-pod
    // shares before and after stand for it.
    match back {
        Some(k) => bench("trace_verified_recovery_requests", k as f64, "requests"),
        None => {
            bench("trace_flush_wrong_pod_share_before", normal, "ratio");
            bench("trace_flush_wrong_pod_share_after", after_rate, "ratio");
        }
    }
    Ok(())
}

/// The trace again with prefill four times cheaper: the plugin, O2 and round robin.
fn cheap(w: &Workload, s: Scale) -> anyhow::Result<()> {
    let cheap = CHEAP_PREFILL.bed(TRACE_PODS, s);
    let c_px = run(&cheap, "cheap_prefix_cache", w, plugin(1, s), opts(s))?;
    let mut c_refs = references(&cheap, &CHEAP_PREFILL, s);
    let (_, c_o2_via) = c_refs.remove(0);
    let c_o2 = run(&cheap, "cheap_O2_oracle", w, c_o2_via, opts(s))?;
    let (_, c_rr_via) = c_refs.remove(1);
    let c_rr = run(&cheap, "cheap_round_robin", w, c_rr_via, opts(s))?;
    let cp = format!("trace_{}_cheap_prefill", w.name);
    bench(
        &format!("{cp}_hit_over_oracle_bounded"),
        c_px.hit() / c_o2.hit(),
        "ratio",
    );
    bench(
        &format!("{cp}_ttft_p90_over_oracle_bounded"),
        c_px.ttft(0.9) / c_o2.ttft(0.9),
        "ratio",
    );
    bench(
        &format!("{cp}_ttft_p50_over_round_robin"),
        c_px.ttft(0.5) / c_rr.ttft(0.5),
        "ratio",
    );
    Ok(())
}
