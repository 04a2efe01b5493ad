//! The build is cargo: `cargo build --release --target wasm32-wasip1 --lib` gives the Higress
//! artifact and the same with `--features envoy` the plain-Envoy one. Each exports exactly one
//! `proxy_abi_version_*`, chosen at compile time, and imports nothing outside its host's ABI
//! and WASI; `make build` copies them to `dist/` unchanged; and each loads and serves a
//! request in its host (the emulator, real Envoy 1.40).
//!
//! The builds reuse the target dirs `make build` uses, so after it they are no-ops.

use ailb_e2e::bed::{chat, Bed};
use ailb_e2e::envoy::{envoy_config, Envoy};
use ailb_e2e::gateway::glr_config;
use serde_json::json;
use std::path::PathBuf;
use std::process::Command;

/// proxy-wasm 0.2.1's host functions.
const STANDARD_IMPORTS: &[&str] = &[
    "proxy_add_header_map_value",
    "proxy_call_foreign_function",
    "proxy_close_stream",
    "proxy_continue_stream",
    "proxy_define_metric",
    "proxy_dequeue_shared_queue",
    "proxy_done",
    "proxy_enqueue_shared_queue",
    "proxy_get_buffer_bytes",
    "proxy_get_current_time_nanoseconds",
    "proxy_get_header_map_pairs",
    "proxy_get_header_map_value",
    "proxy_get_log_level",
    "proxy_get_metric",
    "proxy_get_property",
    "proxy_get_shared_data",
    "proxy_get_status",
    "proxy_grpc_call",
    "proxy_grpc_cancel",
    "proxy_grpc_close",
    "proxy_grpc_send",
    "proxy_grpc_stream",
    "proxy_http_call",
    "proxy_increment_metric",
    "proxy_log",
    "proxy_record_metric",
    "proxy_register_shared_queue",
    "proxy_remove_header_map_value",
    "proxy_replace_header_map_value",
    "proxy_resolve_shared_queue",
    "proxy_send_local_response",
    "proxy_set_buffer_bytes",
    "proxy_set_effective_context",
    "proxy_set_header_map_pairs",
    "proxy_set_property",
    "proxy_set_shared_data",
    "proxy_set_tick_period_milliseconds",
];

/// The Higress extensions the Higress build calls (src/ffi.rs; docs/higress-abi.md §3).
const HIGRESS_IMPORTS: &[&str] = &[
    "proxy_redis_init",
    "proxy_redis_call",
    "proxy_get_upstream_hosts",
    "proxy_set_upstream_override_host",
];

/// proxy-wasm 0.2.1's callbacks, the allocator, the memory and the WASI reactor start.
const STANDARD_EXPORTS: &[&str] = &[
    "memory",
    "_initialize",
    "proxy_on_memory_allocate",
    "proxy_on_vm_start",
    "proxy_on_configure",
    "proxy_on_context_create",
    "proxy_on_new_connection",
    "proxy_on_downstream_data",
    "proxy_on_upstream_data",
    "proxy_on_downstream_connection_close",
    "proxy_on_upstream_connection_close",
    "proxy_on_request_headers",
    "proxy_on_request_body",
    "proxy_on_request_trailers",
    "proxy_on_response_headers",
    "proxy_on_response_body",
    "proxy_on_response_trailers",
    "proxy_on_log",
    "proxy_on_done",
    "proxy_on_delete",
    "proxy_on_tick",
    "proxy_on_queue_ready",
    "proxy_on_http_call_response",
    "proxy_on_grpc_receive_initial_metadata",
    "proxy_on_grpc_receive",
    "proxy_on_grpc_receive_trailing_metadata",
    "proxy_on_grpc_close",
    "proxy_on_foreign_function",
];

/// One artifact: how cargo builds it, where `make build` puts it, what its host allows.
struct Artifact {
    /// Extra cargo arguments (feature, target dir), as the Makefile passes them.
    args: &'static [&'static str],
    /// The target dir those arguments give, from the repository root.
    target_dir: &'static str,
    dist: &'static str,
    abi: &'static str,
    extra_imports: &'static [&'static str],
    extra_exports: &'static [&'static str],
}

const HIGRESS: Artifact = Artifact {
    args: &[],
    target_dir: "target",
    dist: "dist/ai-load-balancer.wasm",
    abi: "proxy_abi_version_0_2_100",
    extra_imports: HIGRESS_IMPORTS,
    extra_exports: &["proxy_on_redis_call_response"],
};

const ENVOY: Artifact = Artifact {
    args: &["--features", "envoy", "--target-dir", "target/envoy"],
    target_dir: "target/envoy",
    dist: "dist/ai-load-balancer-envoy.wasm",
    abi: "proxy_abi_version_0_2_1",
    extra_imports: &[],
    extra_exports: &[],
};

/// Runs plain `cargo build` for `a` from the repository root; returns the module it wrote.
fn cargo_build(a: &Artifact) -> PathBuf {
    let root = ailb_e2e::repo_root();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(&root)
        // This test's own target dir is the e2e workspace's, not the plugin's, and the e2e
        // workspace is built linted (the Makefile's clippy-driver wrapper): the plugin is a
        // plain `cargo build`, whose output must be dist/'s byte for byte.
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS")
        .args(["build", "--release", "--target", "wasm32-wasip1", "--lib"])
        .args(a.args)
        .output()
        .expect("run cargo");
    assert!(
        out.status.success(),
        "cargo build {:?} failed:\n{}",
        a.args,
        String::from_utf8_lossy(&out.stderr)
    );
    root.join(a.target_dir)
        .join("wasm32-wasip1/release/ai_load_balancer.wasm")
}

/// What in `wasm` falls outside `a`'s host: every import not a WASI function or an allowed
/// `env` function, every unknown export, and the ABI exports unless exactly `a.abi`.
fn abi_problems(wasm: &[u8], a: &Artifact) -> Vec<String> {
    let mut problems = Vec::new();
    if let Err(e) = wasmparser::Validator::new().validate_all(wasm) {
        return vec![format!("invalid module: {e}")];
    }
    let mut abis = Vec::new();
    for payload in wasmparser::Parser::new(0).parse_all(wasm) {
        match payload {
            Ok(wasmparser::Payload::ImportSection(r)) => {
                for import in r.into_imports() {
                    let i = match import {
                        Ok(i) => i,
                        Err(e) => return vec![format!("import section: {e}")],
                    };
                    let func = matches!(i.ty, wasmparser::TypeRef::Func(_));
                    let allowed = match i.module {
                        "wasi_snapshot_preview1" => func,
                        "env" => {
                            func && (STANDARD_IMPORTS.contains(&i.name)
                                || a.extra_imports.contains(&i.name))
                        }
                        _ => false,
                    };
                    if !allowed {
                        problems.push(format!("import {}.{}", i.module, i.name));
                    }
                }
            }
            Ok(wasmparser::Payload::ExportSection(r)) => {
                for export in r {
                    let name = match export {
                        Ok(e) => e.name,
                        Err(e) => return vec![format!("export section: {e}")],
                    };
                    if name.starts_with("proxy_abi_version_") {
                        abis.push(name.to_string());
                    } else if !STANDARD_EXPORTS.contains(&name) && !a.extra_exports.contains(&name)
                    {
                        problems.push(format!("export {name}"));
                    }
                }
            }
            Ok(_) => {}
            Err(e) => return vec![format!("parse: {e}")],
        }
    }
    if abis != [a.abi] {
        problems.push(format!("ABI exports {abis:?}, not [{:?}]", a.abi));
    }
    problems
}

/// Builds `a` with cargo, checks its ABI, and that `dist/` holds the very same bytes.
fn built_and_checked(a: &Artifact) -> PathBuf {
    let module = cargo_build(a);
    let wasm = std::fs::read(&module).expect("read the cargo output");
    let problems = abi_problems(&wasm, a);
    assert!(problems.is_empty(), "{}: {problems:?}", module.display());
    let dist = ailb_e2e::repo_root().join(a.dist);
    let copied = std::fs::read(&dist)
        .unwrap_or_else(|e| panic!("{}: {e} (run `make build`)", dist.display()));
    assert!(
        copied == wasm,
        "{} is not the cargo output {} (run `make build`)",
        dist.display(),
        module.display()
    );
    module
}

#[test]
fn the_abi_check_refuses_what_a_host_would_not_load() {
    let module = |imports: &str, exports: &str| {
        wat::parse_str(format!(
            r#"(module {imports} (memory (export "memory") 1) {exports})"#
        ))
        .unwrap()
    };
    let redis = r#"(import "env" "proxy_redis_call" (func (param i32 i32 i32 i32 i32 i32 i32) (result i32)))"#;
    let abi = |v: &str| format!(r#"(func (export "proxy_abi_version_{v}"))"#);
    let good = module(redis, &abi("0_2_100"));
    assert!(abi_problems(&good, &HIGRESS).is_empty());
    assert_eq!(
        abi_problems(&good, &ENVOY),
        [
            "import env.proxy_redis_call",
            r#"ABI exports ["proxy_abi_version_0_2_100"], not ["proxy_abi_version_0_2_1"]"#
        ]
    );
    let both = module("", &(abi("0_2_1") + &abi("0_2_100")));
    assert_eq!(abi_problems(&both, &HIGRESS).len(), 1, "two ABI exports");
    let other = module(
        r#"(import "ailb_global" "x" (func))"#,
        &(abi("0_2_1") + r#"(func (export "my_debug_fn"))"#),
    );
    assert_eq!(
        abi_problems(&other, &ENVOY),
        ["import ailb_global.x", "export my_debug_fn"]
    );
}

/// The Higress artifact, as cargo built it, serves a request end to end in the emulator:
/// global_least_request through a real Redis.
#[test]
fn cargo_builds_the_higress_artifact_and_it_serves_in_the_emulator() {
    let module = built_and_checked(&HIGRESS);
    let bed = Bed::new(2, |c| c.decode_us_per_token = 100);
    let cfg = glr_config(bed.redis.port, json!({}));
    let mut spec = bed.spec("cargo-higress", None);
    spec.plugin = Some((module, cfg));
    let gw = bed.gateway(&spec);
    assert_eq!(chat(&gw.url, "hello", 1).0, 200, "{}", gw.logs());
    assert_eq!(gw.stat("ai_lb.glr.routed"), 1, "{}", gw.logs());
}

/// The plain-Envoy artifact, as cargo built it, serves a request in real Envoy 1.40 (the
/// Envoy tests, tests/envoy*.rs, run the same bytes from `dist/`).
#[test]
fn cargo_builds_the_envoy_artifact_and_it_serves_in_envoy() {
    let module = built_and_checked(&ENVOY);
    let bed = Bed::new(2, |c| c.decode_us_per_token = 100);
    let pods = bed.pod_addrs();
    let plugin = json!({"lb_policy": "global_least_request", "lb_config": {"endpoints": pods}});
    let envoy = Envoy::start_with(|port, admin| envoy_config(port, admin, &pods, &plugin, &module));
    assert_eq!(chat(&envoy.url, "hello", 1).0, 200, "{}", envoy.logs());
    assert_eq!(envoy.stat("ai_lb.glr.routed"), 1, "{}", envoy.logs());
}
