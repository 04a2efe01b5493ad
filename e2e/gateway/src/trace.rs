//! The host side of a module made by `wasm-abi trace-memory` (tools/wasm-abi/src/trace.rs):
//! its `ailb_trace.touch(address, length, function)` import records every access to linear
//! memory on this thread, for `ailb-footprint --trace` to count the data lines and pages a
//! request touches (docs/plugin-cpu.md "Data pages"). Modules without the import never call
//! it.

use crate::host_state::HostState;
use std::cell::RefCell;
use wasmtime::Linker;

thread_local! {
    static TOUCHED: RefCell<Vec<(u32, u32, u32)>> = const { RefCell::new(Vec::new()) };
}

pub fn add_to_linker(l: &mut Linker<HostState>) -> anyhow::Result<()> {
    l.func_wrap(
        "ailb_trace",
        "touch",
        |address: i32, length: i32, function: i32| {
            TOUCHED.with(|t| {
                t.borrow_mut()
                    .push((address as u32, length as u32, function as u32))
            });
        },
    )?;
    Ok(())
}

/// The accesses recorded since the last call: (address, length, function index).
pub fn take() -> Vec<(u32, u32, u32)> {
    TOUCHED.with(|t| std::mem::take(&mut *t.borrow_mut()))
}
