//! Plugin CPU in real Envoy 1.40 with V8 (the wasm runtime Higress runs the plugin in too): the
//! Envoy process's CPU time per request with a cluster policy, minus that of the same Envoy
//! config without the wasm filter. Beside them, the filter running a module whose callbacks do
//! nothing (`empty_plugin`): what Envoy's wasm filter costs any plugin (stream context, one V8
//! entry per callback), so the plugin's own share is the difference from it; and a module that
//! makes only cluster_hash's host calls (`envoy_cluster_hash_host_calls_over_floor`). The five
//! proxies get the same requests, interleaved, so the machine's noise falls on all alike.

use crate::cluster::{NAMES, THIRDS};
use crate::common::{chat10, from_clients};
use ailb_bench::empty_plugin::{empty_wasm, host_calls_wasm};
use ailb_e2e::bed::Bed;
use ailb_e2e::cluster::{hash_plugin, TARGET_HEADER};
use ailb_e2e::envoy::Envoy;
use ailb_e2e::gateway::http;
use serde_json::json;

/// Requests per proxy before measuring (connections, first calls into each module) and measured.
const WARM: usize = 300;
const MEASURED: usize = 3000;

pub fn envoy_cluster_plugin_cpu() -> anyhow::Result<()> {
    let bed = Bed::new(3, |c| {
        c.decode_us_per_token = 0;
        c.prefill_us_per_token = 0;
        c.max_running = 64;
    });
    let services: Vec<(&str, String)> = NAMES.iter().copied().zip(bed.pod_addrs()).collect();
    let adaptive = Envoy::start_clusters(
        &services,
        &json!({"lb_type": "cluster", "lb_policy": "cluster_metrics",
                "lb_config": {"mode": "AdaptiveScore", "service_list": NAMES}}),
    );
    let hash = Envoy::start_clusters(&services, &hash_plugin("x-user", &THIRDS));
    let bare = Envoy::start_clusters_plain(&services);
    let empty = Envoy::start_clusters_module(&services, &empty_wasm()?, &json!({}));
    let calls = Envoy::start_clusters_module(&services, &host_calls_wasm()?, &json!({}));
    let proxies = [&adaptive, &hash, &bare, &empty, &calls];
    let body = chat10();
    // Every request names a service (the plugin-less proxy routes by it; the plugins replace
    // it) and a user (cluster_hash's key), so all five parse the same headers.
    let send_round = |i: usize| -> anyhow::Result<()> {
        let user = format!("user-{i}");
        let headers = [
            ("content-type", "application/json"),
            (TARGET_HEADER, NAMES[i % NAMES.len()]),
            ("x-user", user.as_str()),
        ];
        for e in proxies {
            let (status, _, _) = http(&e.url, "POST", "/v1/chat/completions", &headers, &body)?;
            anyhow::ensure!(status == 200, "{}: status {status}", e.url);
        }
        Ok(())
    };
    (0..WARM).try_for_each(send_round)?;
    // Rounds `from..from + MEASURED` sent by `clients` threads: CPU µs per request per proxy.
    let measure = |from: usize, clients: usize| -> anyhow::Result<Vec<f64>> {
        let threads =
            || -> anyhow::Result<Vec<_>> { proxies.iter().map(|e| e.cpu_ns_by_thread()).collect() };
        let before = threads()?;
        from_clients(clients, |c| {
            (from + c..from + MEASURED)
                .step_by(clients)
                .try_for_each(send_round)
        })?;
        let after = threads()?;
        for (i, name) in ["adaptive", "hash", "none", "empty", "host-calls"]
            .iter()
            .enumerate()
        {
            let line: Vec<String> = after[i]
                .iter()
                .map(|(t, ns)| {
                    let was = before[i].get(t).copied().unwrap_or(0);
                    format!(
                        "{t}={:.1}",
                        ns.saturating_sub(was) as f64 / MEASURED as f64 / 1e3
                    )
                })
                .collect();
            eprintln!(
                "envoy-cpu {name}, {clients} clients: us per request by thread: {}",
                line.join(" ")
            );
        }
        Ok(before
            .iter()
            .zip(&after)
            .map(|(b, a)| {
                let ns = a.values().sum::<u64>().saturating_sub(b.values().sum());
                ns as f64 / MEASURED as f64 / 1e3
            })
            .collect())
    };
    let one = measure(WARM, 1)?;
    let loaded = measure(WARM + MEASURED, 8)?;
    let all = (WARM + 2 * MEASURED) as i64;
    anyhow::ensure!(
        adaptive.stat("ai_lb.cluster_metrics.routed") == all
            && hash.stat("ai_lb.cluster_hash.routed") == all,
        "the plugins routed {} and {} of {all}",
        adaptive.stat("ai_lb.cluster_metrics.routed"),
        hash.stat("ai_lb.cluster_hash.routed")
    );
    // One request at a time, then 8 clients at once (a busy proxy, caches warm).
    for (suffix, us) in [("", &one), ("_loaded_8_clients", &loaded)] {
        let (without, floor) = (us[2], us[3]);
        println!("BENCH envoy_cpu_us_per_request_without_plugin{suffix} {without:.1} us");
        println!(
            "BENCH envoy_wasm_filter_floor_us_per_request{suffix} {:.1} us",
            floor - without
        );
        println!(
            "BENCH envoy_cluster_hash_host_calls_over_floor{suffix} {:.1} us",
            us[4] - floor
        );
        for (name, total) in [("adaptive", us[0]), ("hash", us[1])] {
            println!(
                "BENCH envoy_plugin_cpu_us_per_request_cluster_{name}{suffix} {:.1} us",
                total - without
            );
            println!(
                "BENCH envoy_plugin_cpu_us_per_request_cluster_{name}_over_floor{suffix} {:.1} us",
                total - floor
            );
        }
    }
    Ok(())
}
