//! A wasm module that exports the same Proxy-Wasm callbacks as the plugin and does nothing in
//! them: no host call, no state. Run where the plugin runs, its cost is the host's own share of
//! any wasm plugin (the filter's stream context, one VM entry per callback), the floor the
//! plugin's CPU figures are read against (`make bench`, README "Test bed"). A second module
//! makes cluster_hash's host calls at request headers and nothing else: what those calls cost.

use std::path::PathBuf;

/// The callbacks both modules leave empty, each answering Continue (0) or true (1).
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

/// At request headers, the host calls cluster_hash makes there: read the hash header (the
/// host allocates its value in the module), remove and replace the cluster header, count the
/// request. The allocator bumps through the second page.
const HOST_CALLS: &str = r#"
  (import "env" "proxy_get_header_map_value" (func $get (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_remove_header_map_value" (func $rm (param i32 i32 i32) (result i32)))
  (import "env" "proxy_replace_header_map_value"
    (func $replace (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_define_metric" (func $define (param i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_increment_metric" (func $increment (param i32 i64) (result i32)))
  (memory (export "memory") 2)
  (data (i32.const 16) "x-user")
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
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (drop (call $get (i32.const 0) (i32.const 16) (i32.const 6) (i32.const 136) (i32.const 140)))
    (drop (call $rm (i32.const 0) (i32.const 32) (i32.const 24)))
    (drop (call $replace (i32.const 0) (i32.const 32) (i32.const 24) (i32.const 64) (i32.const 5)))
    (drop (call $increment (i32.load (i32.const 128)) (i64.const 1)))
    (i32.const 0))
"#;

/// The empty module, written once per process to the temp directory.
pub fn empty_wasm() -> anyhow::Result<PathBuf> {
    module("empty", EMPTY)
}

/// The module that makes cluster_hash's request-header host calls and nothing else.
pub fn host_calls_wasm() -> anyhow::Result<PathBuf> {
    module("host-calls", HOST_CALLS)
}

/// `(module <own> <QUIET_CALLBACKS>)`, compiled to `ailb-<name>-plugin-<pid>.wasm` in the temp
/// directory once per process.
fn module(name: &str, own: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::temp_dir().join(format!("ailb-{name}-plugin-{}.wasm", std::process::id()));
    if !path.exists() {
        let text = format!("(module {own} {QUIET_CALLBACKS})");
        std::fs::write(&path, wat::parse_str(text)?)?;
    }
    Ok(path)
}
