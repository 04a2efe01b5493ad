//! End-to-end benchmarks (`make bench`): one `BENCH <name> <value> <unit>` line per figure.
//! Every ratio is measured side by side in the same run.

mod blackhole;
mod cluster;
mod cluster3;
mod cluster_streamed;
mod common;
mod envoy_cpu;
mod envoy_prefix;
mod fairness;
mod glr;
mod latency;
mod metrics;
mod prefix;
mod priority;
mod real_engine;
mod responses;
mod session;
mod thirdparty;
mod trace;

/// `ailb-bench [cpu] [leak] [p99] [prefix] [session] [metrics] [cluster|cluster-cpu|cluster-cold|cluster-hash|cluster-p99] [envoy-prefix] [envoy-cpu] [thirdparty] [cluster3] [priority] [queue] [fairness] [latency] [blackhole] [responses] [real_engine] [dp] [trace [FILE.jsonl]] [slo]`: the named sections only (all by default).
fn main() -> anyhow::Result<()> {
    // Every gateway of the bench runs with the profiling switches its environment sets
    // (ailb_bench::instruments); the plain emulator has none.
    ailb_e2e::gateway::use_emulator("ailb-bench-gateway");
    // `trace [FILE]`: a `.jsonl` argument is the trace to replay, not a section.
    let (files, only): (Vec<String>, Vec<String>) = std::env::args()
        .skip(1)
        .partition(|a| a.ends_with(".jsonl"));
    let run = |name: &str| only.is_empty() || only.iter().any(|a| a == name);
    if run("cpu") {
        glr::plugin_cpu_and_added_latency()?;
    }
    if run("leak") {
        glr::leak_check()?;
    }
    if run("p99") {
        glr::p99_vs_local_least_request()?;
    }
    if run("prefix") {
        prefix::prefix_cpu()?;
        prefix::prefix_vs_round_robin()?;
    }
    if run("session") {
        session::session_stickiness_and_ttft()?;
    }
    if run("metrics") {
        metrics::metrics_plugin_cpu()?;
        metrics::metrics_scrape_cpu()?;
        metrics::metrics_vs_round_robin()?;
    }
    // `cluster` runs all four parts; `cluster-cpu`, `cluster-cold`, `cluster-hash`,
    // `cluster-p99` one each.
    let part = |name: &str| run("cluster") || only.iter().any(|a| a == name);
    if part("cluster-cpu") {
        cluster::cluster_plugin_cpu()?;
    }
    if part("cluster-cold") {
        cluster::cluster_plugin_cpu_cold()?;
    }
    if part("cluster-hash") {
        cluster::cluster_hash_slot_agreement()?;
    }
    if part("cluster-p99") {
        cluster_streamed::cluster_adaptive_vs_round_robin_and_oracle()?;
    }
    if run("envoy-prefix") {
        envoy_prefix::envoy_prefix_vs_round_robin_and_redis()?;
        envoy_prefix::envoy_added_latency()?;
    }
    if run("envoy-cpu") {
        envoy_cpu::envoy_cluster_plugin_cpu()?;
    }
    if run("thirdparty") {
        thirdparty::thirdparty_vs_ours_vm_time()?;
    }
    if run("cluster3") {
        cluster3::cluster3()?;
    }
    if run("priority") {
        priority::priority_under_overload()?;
        priority::forged_flood()?;
    }
    if run("queue") {
        priority::queue_under_overload()?;
    }
    if run("fairness") {
        fairness::fairness_under_a_flood()?;
    }
    if run("latency") {
        latency::gateway_added()?;
    }
    if run("blackhole") {
        blackhole::blackhole()?;
    }
    if run("responses") {
        responses::continuations()?;
    }
    if run("real_engine") {
        real_engine::real_engine()?;
    }
    if run("dp") {
        trace::dp::dp()?;
    }
    if run("trace") {
        trace::trace(files.first().map(std::path::PathBuf::from))?;
    }
    if run("slo") {
        trace::slo::slo()?;
    }
    Ok(())
}
