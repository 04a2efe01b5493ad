//! Plugin code lines per request (e2e/suite/src/footprint.rs): the cluster bench's two
//! policies, beside the compact AdaptiveScore (e2e/compact-adaptive) and the empty module, in
//! one run. The streamed runs' µs over the floor follow these lines at roughly 0.1 µs each
//! (docs/plugin-cpu.md), and unlike those µs the counts repeat exactly. So do the code pages
//! those lines are on, and the data pages and lines a request touches
//! (e2e/suite/src/data_footprint.rs).
//!
//! `AILB_FOOTPRINT_ORDER=<file>` writes the plugin's functions that every request runs, the
//! AdaptiveScore run's then cluster_hash's, each by lines, most first, demangled:
//! `make hot-functions` keeps tools/hot-functions.txt so, the order `make build` gives the
//! code section (tools/wasm-abi/src/order.rs).

use crate::cluster::{NAMES, THIRDS};
use ailb_e2e::cluster::{hash_plugin, TARGET_HEADER};
use ailb_e2e::data_footprint::{self, DataFootprint};
use ailb_e2e::empty_plugin::empty_wasm;
use ailb_e2e::footprint::{measure, Footprint};
use ailb_e2e::{compact_adaptive_wasm, plugin_wasm};
use serde_json::{json, Value};
use std::path::Path;

/// A one-worker gateway config: the three services as clusters (never dialled: the
/// footprint driver answers for them), one route following the cluster header.
fn config(wasm: &Path, plugin: Value) -> Value {
    let clusters: Vec<Value> = NAMES
        .iter()
        .enumerate()
        .map(|(i, n)| {
            json!({"name": n, "lb_policy": "round_robin",
                              "endpoints": [{"address": format!("127.0.0.1:{}", 9 + i)}]})
        })
        .collect();
    json!({"workers": 1, "log_level": "warn", "clusters": clusters,
           "routes": [{"name": "llm-route", "match": {"prefix": "/"}, "cluster_header": TARGET_HEADER}],
           "plugin": {"wasm": wasm, "config": plugin}})
}

fn count(name: &str, wasm: &Path, plugin: Value) -> anyhow::Result<(Footprint, DataFootprint)> {
    let scratch =
        std::env::temp_dir().join(format!("ailb-footprint-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let counted = count_in(&scratch, wasm, plugin);
    let _ = std::fs::remove_dir_all(&scratch);
    let (fp, data) = counted?;
    if std::env::var_os("AILB_FOOTPRINT_DETAIL").is_some() {
        for (f, n) in &fp.by_function {
            eprintln!("footprint {name}: {n:4} {f}");
        }
        for line in &data.detail {
            eprintln!("footprint {name} data {line}");
        }
        eprintln!(
            "footprint {name} data pages per entry (context, request headers, body, response \
             headers, ten chunks, end): {}",
            data.each_entry
        );
    }
    Ok((fp, data))
}

/// The code count under callgrind, then the data counts: pages as they are, lines from the
/// module rewritten by `wasm-abi trace-memory` (built by `make build`).
fn count_in(
    scratch: &Path,
    wasm: &Path,
    plugin: Value,
) -> anyhow::Result<(Footprint, DataFootprint)> {
    let path = scratch.join("gateway.yaml");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&config(wasm, plugin.clone()))?,
    )?;
    let fp = measure(&path, scratch)?;
    let traced = scratch.join("traced.wasm");
    let tool = ailb_e2e::repo_root().join("tools/wasm-abi/target/release/wasm-abi");
    let status = std::process::Command::new(&tool)
        .arg("trace-memory")
        .arg(wasm)
        .arg(&traced)
        .status()
        .map_err(|e| anyhow::anyhow!("{}: {e} (make build builds it)", tool.display()))?;
    anyhow::ensure!(
        status.success(),
        "wasm-abi trace-memory {} failed",
        wasm.display()
    );
    let traced_config = scratch.join("gateway-traced.yaml");
    std::fs::write(
        &traced_config,
        serde_json::to_string_pretty(&config(&traced, plugin))?,
    )?;
    let data = data_footprint::measure(&path, &traced_config, &traced)?;
    Ok((fp, data))
}

pub fn plugin_code_lines() -> anyhow::Result<()> {
    let plugin = plugin_wasm();
    // As the streamed bench configures AdaptiveScore for LLM services (cluster.rs).
    let adaptive = json!({"lb_type": "cluster", "lb_policy": "cluster_metrics",
        "lb_config": {"mode": "AdaptiveScore", "service_list": NAMES, "p2c_choices": 3, "inflight_capacity": 8}});
    let runs = [
        ("cluster_adaptive", plugin.clone(), adaptive),
        ("cluster_hash", plugin, hash_plugin("x-user", &THIRDS)),
        (
            "cluster_adaptive_compact_reference",
            compact_adaptive_wasm()?,
            json!({}),
        ),
        ("empty_module", empty_wasm()?, json!({})),
    ];
    // `AILB_FOOTPRINT_ONLY=<name>` counts that run alone (a change's count in a quarter of the
    // time).
    let only = std::env::var("AILB_FOOTPRINT_ONLY").ok();
    if let Some(o) = &only {
        anyhow::ensure!(
            runs.iter().any(|(name, ..)| name == o),
            "AILB_FOOTPRINT_ONLY={o} names no run"
        );
    }
    let order = std::env::var_os("AILB_FOOTPRINT_ORDER");
    anyhow::ensure!(
        order.is_none() || only.is_none(),
        "AILB_FOOTPRINT_ORDER lists both plugin runs: not with AILB_FOOTPRINT_ONLY"
    );
    let mut hot: Vec<String> = Vec::new();
    for (name, wasm, cfg) in runs {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let (fp, data) = count(name, &wasm, cfg)?;
        println!("BENCH code_lines_per_request_{name} {} lines", fp.lines);
        println!("BENCH code_pages_per_request_{name} {} pages", fp.pages);
        println!(
            "BENCH code_instructions_per_request_{name} {} count",
            fp.instructions
        );
        println!("BENCH data_pages_per_request_{name} {} pages", data.pages);
        println!(
            "BENCH data_entry_pages_per_request_{name} {} pages",
            data.entry_pages
        );
        println!(
            "BENCH data_chunk_pages_per_request_{name} {} pages",
            data.chunk_pages
        );
        println!("BENCH data_lines_per_request_{name} {} lines", data.lines);
        if wasm == plugin_wasm() {
            for (function, _) in &fp.by_function {
                // The engine's trampolines and builtins are not the module's functions.
                let listed = rustc_demangle::demangle(function).to_string();
                let engine = ["wasm[", "signatures[", "wasmtime_"]
                    .iter()
                    .any(|p| function.starts_with(p));
                if !engine && !hot.contains(&listed) {
                    hot.push(listed);
                }
            }
        }
    }
    if let Some(path) = order {
        let mut text = String::from(HOT_FUNCTIONS_HEADER);
        for f in &hot {
            text.push_str(f);
            text.push('\n');
        }
        ailb_testkit::replace_file(Path::new(&path), text.as_bytes())?;
        eprintln!(
            "wrote {} functions to {}",
            hot.len(),
            Path::new(&path).display()
        );
    }
    Ok(())
}

const HOT_FUNCTIONS_HEADER: &str = "\
# The plugin's functions that every cluster request runs (AdaptiveScore's, then cluster_hash's,
# each by code lines, most first), demangled. `make build` moves them to the front of the code
# section (tools/wasm-abi/src/order.rs), so they share a few code pages (docs/plugin-cpu.md
# \"Code pages\"). Where a hash matches no function (another build), every function of that
# name moves. Written by `make hot-functions`; a name no function has any more is reported by
# the build and costs only its own function's place.
";
