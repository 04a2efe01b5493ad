//! `wasm-abi list FILE` — print every import and export.
//! `wasm-abi check FILE --host higress|envoy` — print them and fail on anything outside the
//!   allowed table of docs/higress-abi.md §1.
//! `wasm-abi strip FILE OUT NAME...` — write FILE without the named exports.
//! `wasm-abi order FILE OUT LIST` — write FILE with the functions LIST names first in its code
//!   section (src/order.rs).
//! `wasm-abi check-order FILE LIST` — fail when a line of LIST names no function of FILE.
//! `wasm-abi globals FILE OUT` — write FILE with each `ailb_global` getter and setter import
//!   made one wasm global (src/globals.rs).
//! `wasm-abi trace-memory FILE OUT` — write FILE with every memory access reported to the host
//!   first (src/trace.rs; a bench instrument).

mod globals;
mod order;
mod trace;
mod wasm;

use std::process::ExitCode;
use wasm::Module;

/// proxy-wasm 0.2.1 host functions (the SDK's imports).
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
/// Higress's extensions (docs/higress-abi.md §3).
const HIGRESS_IMPORTS: &[&str] = &[
    "proxy_redis_init",
    "proxy_redis_call",
    "proxy_get_upstream_hosts",
    "proxy_set_upstream_override_host",
    "proxy_inject_encoded_data_to_filter_chain",
];
/// proxy-wasm 0.2.1 callbacks.
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

fn check(m: &Module, host: &str) -> Result<Vec<String>, String> {
    let (abi, extra_imports, extra_exports): (&str, &[&str], &[&str]) = match host {
        "higress" => (
            "proxy_abi_version_0_2_100",
            HIGRESS_IMPORTS,
            &["proxy_on_redis_call_response"],
        ),
        "envoy" => ("proxy_abi_version_0_2_1", &[], &[]),
        other => return Err(format!("unknown host `{other}` (higress, envoy)")),
    };
    let mut problems = Vec::new();
    for i in m.imports()? {
        let ok = match i.module.as_str() {
            "env" => {
                i.kind == 0
                    && (STANDARD_IMPORTS.contains(&i.name.as_str())
                        || extra_imports.contains(&i.name.as_str()))
            }
            // The host registers the whole WASI preview1 list (docs/higress-abi.md §3).
            "wasi_snapshot_preview1" => i.kind == 0,
            _ => false,
        };
        if !ok {
            problems.push(format!(
                "import {}.{} is not allowed for {host}",
                i.module, i.name
            ));
        }
    }
    let exports = m.exports()?;
    let abis: Vec<&str> = exports
        .iter()
        .map(|e| e.name.as_str())
        .filter(|n| n.starts_with("proxy_abi_version_"))
        .collect();
    if abis != [abi] {
        problems.push(format!(
            "ABI exports {abis:?}: {host} needs exactly [\"{abi}\"]"
        ));
    }
    for e in &exports {
        let n = e.name.as_str();
        let known = n == abi || STANDARD_EXPORTS.contains(&n) || extra_exports.contains(&n);
        // Wrong ABI exports were reported above.
        if !known && !n.starts_with("proxy_abi_version_") {
            problems.push(format!("export {n} is not allowed for {host}"));
        }
    }
    Ok(problems)
}

fn list(m: &Module) -> Result<(), String> {
    for i in m.imports()? {
        println!("import {}.{}", i.module, i.name);
    }
    for e in m.exports()? {
        println!("export {}", e.name);
    }
    Ok(())
}

/// The lines of an order LIST file (src/order.rs).
fn read_list(path: &str) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    Ok(order::parse_list(&text))
}

fn run(args: &[String]) -> Result<bool, String> {
    let read = |p: &String| std::fs::read(p).map_err(|e| format!("{p}: {e}"));
    match args {
        [cmd, file] if cmd == "list" => {
            let bytes = read(file)?;
            list(&Module::parse(&bytes)?)?;
            Ok(true)
        }
        [cmd, file, flag, host] if cmd == "check" && flag == "--host" => {
            let bytes = read(file)?;
            let m = Module::parse(&bytes)?;
            list(&m)?;
            let problems = check(&m, host)?;
            for p in &problems {
                eprintln!("ABI CHECK FAILED: {file}: {p}");
            }
            if problems.is_empty() {
                println!("ABI check ok: {file} ({host})");
            }
            Ok(problems.is_empty())
        }
        [cmd, file, out, names @ ..] if cmd == "strip" && !names.is_empty() => {
            let bytes = read(file)?;
            let drop: Vec<&str> = names.iter().map(String::as_str).collect();
            let stripped = Module::parse(&bytes)?.without_exports(&drop)?;
            Module::parse(&stripped)?; // the result must still be a well-formed module
            std::fs::write(out, stripped).map_err(|e| format!("{out}: {e}"))?;
            Ok(true)
        }
        [cmd, file, out] if cmd == "globals" => {
            let rewritten = globals::globals(&read(file)?)?;
            std::fs::write(out, rewritten).map_err(|e| format!("{out}: {e}"))?;
            Ok(true)
        }
        [cmd, file, out] if cmd == "trace-memory" => {
            let traced = trace::trace_memory(&read(file)?)?;
            std::fs::write(out, traced).map_err(|e| format!("{out}: {e}"))?;
            Ok(true)
        }
        [cmd, file, list] if cmd == "check-order" => {
            let ordered = order::plan(&read(file)?, &read_list(list)?)?;
            for name in &ordered.unmatched {
                eprintln!(
                    "ORDER CHECK FAILED: {file}: no function is named {name} \
                     (`make hot-functions` rewrites the list)"
                );
            }
            if ordered.unmatched.is_empty() {
                println!(
                    "order check ok: {file} ({} functions listed first)",
                    ordered.moved
                );
            }
            Ok(ordered.unmatched.is_empty())
        }
        [cmd, file, out, list] if cmd == "order" => {
            let ordered = order::order(&read(file)?, &read_list(list)?)?;
            for name in &ordered.unmatched {
                eprintln!("wasm-abi order: no function is named {name}");
            }
            println!("wasm-abi order: {} functions first in {out}", ordered.moved);
            std::fs::write(out, ordered.module).map_err(|e| format!("{out}: {e}"))?;
            Ok(true)
        }
        _ => Err(
            "usage: wasm-abi list FILE | check FILE --host higress|envoy | \
             strip FILE OUT NAME... | order FILE OUT LIST | check-order FILE LIST | \
             globals FILE OUT | trace-memory FILE OUT"
                .into(),
        ),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("wasm-abi: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(out: &mut Vec<u8>, s: &str) {
        out.push(s.len() as u8);
        out.extend_from_slice(s.as_bytes());
    }

    /// A module with the given function imports (module, name) and function exports.
    fn module(imports: &[(&str, &str)], exports: &[&str]) -> Vec<u8> {
        let mut m = b"\0asm\x01\0\0\0".to_vec();
        let mut imp = vec![imports.len() as u8];
        for (module_name, field) in imports {
            name(&mut imp, module_name);
            name(&mut imp, field);
            imp.extend_from_slice(&[0, 0]); // func, type 0
        }
        m.push(2);
        m.push(imp.len() as u8);
        m.extend_from_slice(&imp);
        let mut exp = vec![exports.len() as u8];
        for (i, e) in exports.iter().enumerate() {
            name(&mut exp, e);
            exp.extend_from_slice(&[0, i as u8]);
        }
        m.push(7);
        m.push(exp.len() as u8);
        m.extend_from_slice(&exp);
        m
    }

    #[test]
    fn strip_leaves_only_the_higress_abi() {
        let raw = module(
            &[("env", "proxy_log"), ("env", "proxy_redis_call")],
            &[
                "proxy_abi_version_0_2_1",
                "proxy_abi_version_0_2_100",
                "proxy_on_configure",
            ],
        );
        let m = Module::parse(&raw).unwrap();
        assert_eq!(check(&m, "higress").unwrap().len(), 1, "two ABI exports");
        let stripped = m.without_exports(&["proxy_abi_version_0_2_1"]).unwrap();
        let s = Module::parse(&stripped).unwrap();
        let names: Vec<String> = s.exports().unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(names, ["proxy_abi_version_0_2_100", "proxy_on_configure"]);
        assert_eq!(s.imports().unwrap().len(), 2);
        assert!(check(&s, "higress").unwrap().is_empty());
    }

    #[test]
    fn envoy_build_may_not_import_higress_extensions() {
        let m = module(&[("env", "proxy_redis_call")], &["proxy_abi_version_0_2_1"]);
        let problems = check(&Module::parse(&m).unwrap(), "envoy").unwrap();
        assert_eq!(
            problems,
            ["import env.proxy_redis_call is not allowed for envoy"]
        );
        let m = module(
            &[("env", "proxy_log"), ("wasi_snapshot_preview1", "fd_write")],
            &["proxy_abi_version_0_2_1", "my_debug_fn"],
        );
        let problems = check(&Module::parse(&m).unwrap(), "envoy").unwrap();
        assert_eq!(problems, ["export my_debug_fn is not allowed for envoy"]);
        let m = module(&[("other", "x")], &["proxy_abi_version_0_2_100"]);
        assert_eq!(
            check(&Module::parse(&m).unwrap(), "higress").unwrap().len(),
            1
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(Module::parse(b"nope").is_err());
        let good = module(&[("env", "proxy_log")], &["proxy_abi_version_0_2_100"]);
        for cut in 8..good.len() {
            let _ = Module::parse(&good[..cut]).and_then(|m| m.imports().map(|_| ()));
        }
    }
}
