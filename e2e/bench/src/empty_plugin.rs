//! A wasm module that exports the same Proxy-Wasm callbacks as the plugin and does nothing in
//! them: no host call, no state. Run where the plugin runs, its cost is the host's own share of
//! any wasm plugin (the filter's stream context, one VM entry per callback), the floor the
//! plugin's CPU figures are read against (`make bench`, docs/plugin-cpu.md). Two more modules
//! make a policy's host calls and nothing else, what those calls cost: cluster_hash's at request
//! headers, and cluster_metrics AdaptiveScore's over the whole request.

use std::path::PathBuf;

/// The callbacks a module leaves empty, each answering Continue (0) or true (1): one export per
/// line, so a module that defines one of them itself drops that line (`module`).
const QUIET_CALLBACKS: &str = r#"
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_request_body") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_response_body") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_done") (param i32) (result i32) (i32.const 1))
  (func (export "proxy_on_log") (param i32))
  (func (export "proxy_on_delete") (param i32))
"#;

/// Configure and request headers do nothing either. The allocator grows the memory: nothing
/// calls it (the module asks the host for no data), but every host requires one.
const EMPTY: &str = r#"
  (memory (export "memory") 1)
  (func (export "proxy_on_memory_allocate") (param $n i32) (result i32)
    (local $old i32)
    (local.set $old
      (memory.grow (i32.add (i32.shr_u (local.get $n) (i32.const 16)) (i32.const 1))))
    (if (result i32) (i32.lt_s (local.get $old) (i32.const 0))
      (then (i32.const 0))
      (else (i32.shl (local.get $old) (i32.const 16)))))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32) (i32.const 0))
"#;

/// The header-map and metric imports of the host-call modules. Imports come first in a
/// module's text, so a module with more of its own adds them between this and
/// `host_call_defs!`.
macro_rules! host_call_imports {
    () => {
        r#"
  (import "env" "proxy_get_header_map_value" (func $get (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_remove_header_map_value" (func $rm (param i32 i32 i32) (result i32)))
  (import "env" "proxy_replace_header_map_value"
    (func $replace (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_define_metric" (func $define (param i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_increment_metric" (func $increment (param i32 i64) (result i32)))
"#
    };
}

/// What the host-call modules share: memory, an allocator bumping through the second page
/// (the host allocates the values it returns in the module), a counter defined at configure,
/// `$route`, which names llm-a in the cluster header (remove, then replace, as the plugin does
/// for cluster_hash) and counts the request, and `$publish`, the same without the removal (as
/// the plugin publishes cluster_metrics: its replace drops the client's copies). Addresses
/// below 1024 hold names (16-127) and the host's out-parameters (128-159).
macro_rules! host_call_defs {
    () => {
        r#"
  (memory (export "memory") 2)
  (data (i32.const 32) "x-higress-target-cluster")
  (data (i32.const 64) "llm-a")
  (data (i32.const 80) "probe.routed")
  (global $heap (mut i32) (i32.const 65536))
  (func (export "proxy_on_memory_allocate") (param $n i32) (result i32)
    (local $p i32)
    (if (i32.gt_u (local.get $n) (i32.const 4096))
      (then (return (i32.shl
        (memory.grow (i32.add (i32.shr_u (local.get $n) (i32.const 16)) (i32.const 1)))
        (i32.const 16)))))
    (local.set $p (global.get $heap))
    (if (i32.gt_u (i32.add (local.get $p) (local.get $n)) (i32.const 131072))
      (then (local.set $p (i32.const 65536))))
    (global.set $heap (i32.add (local.get $p) (local.get $n)))
    (local.get $p))
  (func (export "proxy_on_configure") (param i32 i32) (result i32)
    (drop (call $define (i32.const 0) (i32.const 80) (i32.const 12) (i32.const 128)))
    (i32.const 1))
  (func $route
    (drop (call $rm (i32.const 0) (i32.const 32) (i32.const 24)))
    (call $publish))
  (func $publish
    (drop (call $replace (i32.const 0) (i32.const 32) (i32.const 24) (i32.const 64) (i32.const 5)))
    (drop (call $increment (i32.load (i32.const 128)) (i64.const 1))))
"#
    };
}

/// At request headers, the host calls cluster_hash makes there: read the hash header, then
/// `$route`.
const HOST_CALLS: &str = concat!(
    host_call_imports!(),
    host_call_defs!(),
    r#"
  (data (i32.const 16) "x-user")
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (drop (call $get (i32.const 0) (i32.const 16) (i32.const 6) (i32.const 136) (i32.const 140)))
    (call $route)
    (i32.const 0))
"#
);

/// AdaptiveScore's host calls, as `ailb-bench cluster-cpu`'s `AILB_PROF` counts them per
/// request (10): at request headers the clock, a read of the statistics record and its write
/// back under the read's compare-and-swap token (a record of 3 services, 300 bytes, written
/// fresh when absent), then `$publish`; at response headers `:status`; at the first answer chunk
/// the clock (a byte per context, mod 4096, marks the chunk still awaited); at stream end the
/// clock and the record's read and write again. The record's bytes go back unchanged: the cost
/// measured is the host's, not a decision's.
const ADAPTIVE_HOST_CALLS: &str = concat!(
    host_call_imports!(),
    r#"
  (import "env" "proxy_get_current_time_nanoseconds" (func $now (param i32) (result i32)))
  (import "env" "proxy_get_shared_data" (func $get_shared (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_set_shared_data" (func $set_shared (param i32 i32 i32 i32 i32) (result i32)))
"#,
    host_call_defs!(),
    r#"
  (data (i32.const 96) ":status")
  (data (i32.const 112) "ailb.cm.probe")
  ;; Read the record and write it back under the read's token (fresh, 300 zero bytes at 1024,
  ;; when there is none).
  (func $update
    (if (i32.eqz (call $get_shared
          (i32.const 112) (i32.const 13) (i32.const 136) (i32.const 140) (i32.const 144)))
      (then (drop (call $set_shared (i32.const 112) (i32.const 13)
        (i32.load (i32.const 136)) (i32.load (i32.const 140)) (i32.load (i32.const 144)))))
      (else (drop (call $set_shared (i32.const 112) (i32.const 13)
        (i32.const 1024) (i32.const 300) (i32.const 0))))))
  (func (export "proxy_on_request_headers") (param $ctx i32) (param i32 i32) (result i32)
    (drop (call $now (i32.const 152)))
    (call $update)
    (call $publish)
    (i32.store8 (i32.add (i32.const 4096) (i32.and (local.get $ctx) (i32.const 4095))) (i32.const 1))
    (i32.const 0))
  (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32)
    (drop (call $get (i32.const 2) (i32.const 96) (i32.const 7) (i32.const 136) (i32.const 140)))
    (i32.const 0))
  (func (export "proxy_on_response_body") (param $ctx i32) (param i32 i32) (result i32)
    (local $flag i32)
    (local.set $flag (i32.add (i32.const 4096) (i32.and (local.get $ctx) (i32.const 4095))))
    (if (i32.load8_u (local.get $flag))
      (then
        (i32.store8 (local.get $flag) (i32.const 0))
        (drop (call $now (i32.const 152)))))
    (i32.const 0))
  (func (export "proxy_on_done") (param i32) (result i32)
    (drop (call $now (i32.const 152)))
    (call $update)
    (i32.const 1))
"#
);

/// The empty module, written once per process to the temp directory.
pub fn empty_wasm() -> anyhow::Result<PathBuf> {
    module("empty", EMPTY)
}

/// The module that makes cluster_hash's request-header host calls and nothing else.
pub fn host_calls_wasm() -> anyhow::Result<PathBuf> {
    module("host-calls", HOST_CALLS)
}

/// The module that makes AdaptiveScore's host calls and nothing else.
pub fn adaptive_host_calls_wasm() -> anyhow::Result<PathBuf> {
    module("adaptive-host-calls", ADAPTIVE_HOST_CALLS)
}

/// `module_text(own)` compiled to `ailb-<name>-plugin-<hash of the module>.wasm` in the temp
/// directory. Named by its content, so every run and test process shares one file per module
/// version instead of leaving one per process behind; put in place whole
/// (`ailb_testkit::replace_file`), since tests write it from several threads.
fn module(name: &str, own: &str) -> anyhow::Result<PathBuf> {
    let wasm = wat::parse_str(module_text(own))?;
    let hash = ailb_core::hash::fnv1a(ailb_core::hash::FNV_OFFSET, &wasm);
    let path = std::env::temp_dir().join(format!("ailb-{name}-plugin-{hash:016x}.wasm"));
    if std::fs::read(&path).ok().as_deref() != Some(&wasm[..]) {
        ailb_testkit::replace_file(&path, &wasm)?;
    }
    Ok(path)
}

/// `(module <own> <QUIET_CALLBACKS but those own exports>)`.
fn module_text(own: &str) -> String {
    let quiet: String = QUIET_CALLBACKS
        .lines()
        .filter(|line| !exported_name(line).is_some_and(|e| own.contains(e)))
        .map(|line| format!("{line}\n"))
        .collect();
    format!("(module {own} {quiet})")
}

/// The `(export "name")` of a line of WAT, if it has one.
fn exported_name(line: &str) -> Option<&str> {
    let start = line.find("(export \"")?;
    let name = &line[start + "(export \"".len()..];
    let end = start + "(export \"".len() + name.find("\")")? + "\")".len();
    Some(&line[start..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every module exports each callback exactly once, its own or the quiet one, and parses.
    #[test]
    fn every_module_exports_each_callback_once() {
        let callbacks: Vec<&str> = QUIET_CALLBACKS.lines().filter_map(exported_name).collect();
        assert_eq!(callbacks.len(), 9);
        for (name, own) in [
            ("empty", EMPTY),
            ("host-calls", HOST_CALLS),
            ("adaptive-host-calls", ADAPTIVE_HOST_CALLS),
        ] {
            let text = module_text(own);
            wat::parse_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            for cb in &callbacks {
                let n = text.matches(cb).count();
                assert_eq!(n, 1, "{name} has {cb} {n} times");
            }
        }
    }
}
