//! Cluster-level balancing (`lb_type: cluster`): 3 services as 3 clusters behind one route that
//! follows `x-higress-target-cluster`, fake pods. What the sections share (the services, the
//! gateways and the wasm filter they run), cluster_hash's slots against an independent
//! implementation, and the plugin's VM time one request at a time (warm, then with every VM
//! entry cold). The streamed section is `cluster_streamed`.

use crate::common::{chat10, vm_us_per_request, vm_us_per_request_by, vm_us_per_request_loaded};
use ailb_bench::empty_plugin::{adaptive_host_calls_wasm, empty_wasm, host_calls_wasm};
use ailb_core::cluster::hash::SlotTable;
use ailb_e2e::bed::{chat_body, Bed};
use ailb_e2e::cluster::{
    cluster_config, hash_plugin, metrics_plugin, service_of, services, Service, TARGET_HEADER,
};
use ailb_e2e::gateway::{http, Gateway};
use serde_json::{json, Value};

pub const NAMES: [&str; 3] = ["llm-a", "llm-b", "llm-c"];

/// cluster_hash weights splitting the three services evenly (Higress's 100 slots).
pub const THIRDS: [(&str, i64); 3] = [(NAMES[0], 34), (NAMES[1], 33), (NAMES[2], 33)];

/// What the gateways' wasm filter runs.
pub enum Filter {
    /// No filter.
    None,
    /// The plugin with this config.
    Plugin(Value),
    /// A module whose callbacks do nothing (`empty_plugin`): the host's share of any plugin.
    Empty,
    /// A module making cluster_hash's request-header host calls and nothing else.
    HostCalls,
    /// A module making AdaptiveScore's host calls over the request and nothing else.
    AdaptiveHostCalls,
}

/// 2 gateways (2 workers each) over `svcs`, running `filter`.
pub fn gateways(
    bed: &Bed,
    svcs: &[Service],
    tag: &str,
    filter: &Filter,
) -> anyhow::Result<Vec<Gateway>> {
    (0..2)
        .map(|i| gateway(bed, svcs, &format!("{tag}-{i}"), filter, &[]))
        .collect()
}

/// One gateway over `svcs` running `filter`, its emulator given `env`.
fn gateway(
    bed: &Bed,
    svcs: &[Service],
    tag: &str,
    filter: &Filter,
    env: &[(&str, &str)],
) -> anyhow::Result<Gateway> {
    let config = match filter {
        Filter::Plugin(v) => Some(v.clone()),
        Filter::None | Filter::Empty | Filter::HostCalls | Filter::AdaptiveHostCalls => None,
    };
    let mut spec = bed.spec(tag, config);
    match filter {
        Filter::Empty => spec.plugin = Some((empty_wasm()?, json!({}))),
        Filter::HostCalls => spec.plugin = Some((host_calls_wasm()?, json!({}))),
        Filter::AdaptiveHostCalls => spec.plugin = Some((adaptive_host_calls_wasm()?, json!({}))),
        Filter::None | Filter::Plugin(_) => {}
    }
    Gateway::start_config_env(&cluster_config(bed, &spec, svcs), &spec.id, env)
}

/// The header the client adds to request `i`, if any: the service it names (round robin, the
/// oracle) or a key for the plugin to hash.
pub type Chooser = fn(usize) -> Option<(&'static str, String)>;

/// Names service `s` in the route's cluster header.
pub fn naming(s: &str) -> Option<(&'static str, String)> {
    Some((TARGET_HEADER, s.to_string()))
}

/// Higress's cluster_hash, written here from its description (docs/higress-cluster-policies.md
/// §2) and independent of the plugin's code: FNV-1a 32 over the header value, `mod 100`, into
/// 100 slots filled entry by entry, each `weight` times.
fn higress_cluster<'a>(entries: &[(&'a str, i64)], value: &[u8]) -> &'a str {
    let mut h: u32 = 0x811c_9dc5;
    for b in value {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    let slots: Vec<&str> = entries
        .iter()
        .flat_map(|(c, w)| std::iter::repeat_n(*c, *w as usize))
        .collect();
    slots[(h % 100) as usize]
}

/// 10k header values through 2 gateways running cluster_hash: the service each landed on vs
/// the independent implementation above (and `ailb_core::cluster::hash` vs it, as a check).
pub fn cluster_hash_slot_agreement() -> anyhow::Result<()> {
    let bed = Bed::new(3, |c| {
        c.decode_us_per_token = 100;
        c.prefill_us_per_token = 1;
    });
    let svcs = services(&NAMES, 1);
    let entries = [(NAMES[0], 17), (NAMES[1], 33), (NAMES[2], 50)];
    let gws = gateways(
        &bed,
        &svcs,
        "hash",
        &Filter::Plugin(hash_plugin("x-user", &entries)),
    )?;
    let urls: Vec<String> = gws.iter().map(|g| g.url.clone()).collect();
    let table = SlotTable::build(&entries).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let values: Vec<String> = (0..10_000u64)
        .map(|i| format!("consumer-{i}-{:x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
        .collect();
    let core_agrees = values
        .iter()
        .filter(|v| table.pick(v.as_bytes()) == Some(higress_cluster(&entries, v.as_bytes())))
        .count();
    let threads = 8;
    let agree: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (values, urls, svcs, entries) = (&values, &urls, &svcs, &entries);
                s.spawn(move || {
                    let mut agree = 0;
                    for (i, v) in values.iter().enumerate().skip(t).step_by(threads) {
                        let landed = http(
                            &urls[i % urls.len()],
                            "POST",
                            "/v1/chat/completions",
                            &[("content-type", "application/json"), ("x-user", v)],
                            &chat_body("hi", 1),
                        )
                        .ok()
                        .and_then(|(status, hs, _)| {
                            let pod = hs.into_iter().find(|(k, _)| k == "x-pod")?.1;
                            (status == 200).then(|| service_of(svcs, &pod).map(str::to_string))?
                        });
                        if landed.as_deref() == Some(higress_cluster(entries, v.as_bytes())) {
                            agree += 1;
                        }
                    }
                    agree
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    });
    eprintln!(
        "cluster_hash: ailb_core slots agree with the bench's Higress algorithm on {core_agrees} of {}",
        values.len()
    );
    println!(
        "BENCH cluster_hash_slot_agreement {:.4} ratio",
        agree as f64 / values.len() as f64
    );
    Ok(())
}

/// Plugin CPU per request for AdaptiveScore: the emulator's VM time over the 10-turn chat on
/// one gateway in front of 3 healthy services; beside it, in the same run, `cluster_hash` over
/// the same services (a decision with no statistics: the floor of a cluster policy). The goal
/// figure sends one request at a time; `_loaded_8_clients` sends the same chat from 8 clients
/// at once. On this 2-core machine the first differs from the second by how cold the caches
/// are when an idle worker wakes up, not by what the plugin does (docs/plugin-cpu.md).
pub fn cluster_plugin_cpu() -> anyhow::Result<()> {
    let bed = Bed::new(3, |c| {
        c.decode_us_per_token = 100;
        c.prefill_us_per_token = 1;
    });
    let svcs = services(&NAMES, 1);
    for (name, plugin) in [
        ("adaptive", metrics_plugin(&svcs, "AdaptiveScore")),
        // post_chat10 always sends content-type, so every request has the hash header.
        ("hash", hash_plugin("content-type", &THIRDS)),
    ] {
        let spec = bed.spec(&format!("cpu-{name}"), Some(plugin));
        let gw = Gateway::start_config(&cluster_config(&bed, &spec, &svcs), &spec.id)?;
        let us = vm_us_per_request(&gw, 50, 500)?;
        println!("BENCH plugin_us_per_request_cluster_{name} {us:.1} us");
        let loaded = vm_us_per_request_loaded(&gw, 8, 800)?;
        println!("BENCH plugin_us_per_request_cluster_{name}_loaded_8_clients {loaded:.1} us");
        if std::env::var_os("AILB_PROF").is_some() {
            prof_breakdown(&gw, name);
        }
    }
    Ok(())
}

/// The plugin's VM time per request when every VM entry finds cold caches, as an idle
/// worker's does (the emulator's `AILB_COLD_ENTRIES`, docs/plugin-cpu.md): the 10-turn chat,
/// one request at a time, to AdaptiveScore and cluster_hash as in [`cluster_plugin_cpu`],
/// beside the empty module (the host's share of a cold entry). Each plugin runs again with its
/// compiled code read back in before every entry, then with its linear memory: what the cold
/// figure owes to the plugin's code, and what to its data.
pub fn cluster_plugin_cpu_cold() -> anyhow::Result<()> {
    let bed = Bed::new(3, |c| {
        c.decode_us_per_token = 100;
        c.prefill_us_per_token = 1;
    });
    let svcs = services(&NAMES, 1);
    // Each entry first writes 96 MiB: a request costs tens of ms, so fewer of them.
    let (warm, n) = (10, 100);
    let start = |tag: &str, filter: &Filter, mode: &str| {
        let env = [("AILB_COLD_ENTRIES", mode)];
        gateway(&bed, &svcs, &format!("cold-{tag}-{mode}"), filter, &env)
    };
    let empty = start("empty", &Filter::Empty, "all")?;
    // The empty module routes nothing: the client names the service.
    let floor = vm_us_per_request_by(&empty, warm, n, || {
        let headers = [
            ("content-type", "application/json"),
            (TARGET_HEADER, NAMES[0]),
        ];
        let (status, _, _) = http(
            &empty.url,
            "POST",
            "/v1/chat/completions",
            &headers,
            &chat10(),
        )?;
        anyhow::ensure!(status == 200, "status {status}");
        Ok(())
    })?;
    drop(empty);
    println!("BENCH vm_floor_us_per_request_empty_module_cold_entries {floor:.1} us");
    for (name, plugin) in [
        ("adaptive", metrics_plugin(&svcs, "AdaptiveScore")),
        ("hash", hash_plugin("content-type", &THIRDS)),
    ] {
        let plugin = Filter::Plugin(plugin);
        let mut us = Vec::new();
        for mode in ["all", "code-warm", "memory-warm"] {
            let gw = start(name, &plugin, mode)?;
            us.push(vm_us_per_request(&gw, warm, n)?);
            if mode == "all" && std::env::var_os("AILB_PROF").is_some() {
                prof_breakdown(&gw, &format!("{name}-cold"));
            }
        }
        let [all, code_warm, memory_warm] = us[..] else {
            anyhow::bail!("three modes ran");
        };
        println!("BENCH plugin_us_per_request_cluster_{name}_cold_entries {all:.1} us");
        println!(
            "BENCH plugin_us_per_request_cluster_{name}_cold_entries_code_warm {code_warm:.1} us"
        );
        println!(
            "BENCH plugin_us_per_request_cluster_{name}_cold_entries_memory_warm {memory_warm:.1} us"
        );
    }
    Ok(())
}

/// Per request over the gateway's whole life (warm-up included): calls and µs of every export
/// and host call (`prof.*` in the emulator's `/stats`), for finding where the VM time goes.
pub fn prof_breakdown(gw: &Gateway, name: &str) {
    let stats = gw.stats();
    let streams = stats
        .get("gateway.streams_destroyed")
        .copied()
        .unwrap_or(0)
        .max(1) as f64;
    for (k, calls) in &stats {
        let Some(what) = k
            .strip_prefix("prof.")
            .and_then(|k| k.strip_suffix(".calls"))
        else {
            continue;
        };
        let ns = stats.get(&format!("prof.{what}.ns")).copied().unwrap_or(0) as f64;
        eprintln!(
            "PROF {name} {what:<40} {:>6.2} calls/req {:>7.2} us/req {:>6.2} us/call",
            *calls as f64 / streams,
            ns / streams / 1e3,
            ns / (*calls).max(1) as f64 / 1e3
        );
    }
}
