//! A wasm module that exports the same Proxy-Wasm callbacks as the plugin and does nothing in
//! them: no host call, no state. Run where the plugin runs, its cost is the host's own share of
//! any wasm plugin (the filter's stream context, one VM entry per callback), the floor the
//! plugin's CPU figures are read against (`make bench`, README "Test bed").

use std::path::PathBuf;

/// Every callback answers Continue (0) or true (1). The allocator grows the memory: nothing
/// calls it (the module asks the host for no data), but every host requires one.
const EMPTY_WAT: &str = r#"
(module
  (memory (export "memory") 1)
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param $n i32) (result i32)
    (local $old i32)
    (local.set $old
      (memory.grow (i32.add (i32.shr_u (local.get $n) (i32.const 16)) (i32.const 1))))
    (if (result i32) (i32.lt_s (local.get $old) (i32.const 0))
      (then (i32.const 0))
      (else (i32.shl (local.get $old) (i32.const 16)))))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_request_body") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_response_body") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_done") (param i32) (result i32) (i32.const 1))
  (func (export "proxy_on_log") (param i32))
  (func (export "proxy_on_delete") (param i32)))
"#;

/// The empty module, written once per process to the temp directory.
pub fn empty_wasm() -> anyhow::Result<PathBuf> {
    let path = std::env::temp_dir().join(format!("ailb-empty-plugin-{}.wasm", std::process::id()));
    if !path.exists() {
        std::fs::write(&path, wat::parse_str(EMPTY_WAT)?)?;
    }
    Ok(path)
}
