//! Values the glue keeps in wasm globals rather than in linear memory.
//!
//! Rust puts every static in linear memory, and for a worker idle between callbacks each
//! page of it a callback touches is a page walk and a cache miss. A global lives with the
//! VM's own state, which every entry touches anyway. So a callback that reads only globals
//! touches no page of the plugin's memory: the body watch answers almost every chunk of a
//! streamed answer that way (src/body_watch.rs, docs/plugin-cpu.md "Body chunks").
//!
//! Rust cannot declare a wasm global, so each is a getter and a setter imported from
//! `ailb_global`, which `make build` turns into one mutable global starting at zero
//! (`wasm-abi globals`, tools/wasm-abi/src/globals.rs). A module that skipped that step
//! fails to load instead of misbehaving: no host provides `ailb_global`, and `make check-abi`
//! refuses the import. Tests, native and `make wasm-unit-test`, keep the value in a cell.

#[cfg(all(target_arch = "wasm32", not(test)))]
mod imp {
    #[link(wasm_import_module = "ailb_global")]
    extern "C" {
        fn body_watch_get() -> u64;
        fn body_watch_set(bits: u64);
    }

    pub fn body_watch() -> u64 {
        // SAFETY: after `wasm-abi globals`, a `global.get` of a mutable i64 global: no
        // memory, no precondition.
        unsafe { body_watch_get() }
    }

    pub fn set_body_watch(bits: u64) {
        // SAFETY: as `body_watch`, a `global.set`.
        unsafe { body_watch_set(bits) }
    }
}

#[cfg(any(not(target_arch = "wasm32"), test))]
mod imp {
    use std::cell::Cell;

    thread_local! {
        static BODY_WATCH: Cell<u64> = const { Cell::new(0) };
    }

    pub fn body_watch() -> u64 {
        BODY_WATCH.with(Cell::get)
    }

    pub fn set_body_watch(bits: u64) {
        BODY_WATCH.with(|c| c.set(bits));
    }
}

/// The body watch's summary (src/body_watch.rs): bit `i` set while a stream whose id is `i`
/// modulo 64 reads its response body.
pub use imp::{body_watch, set_body_watch};
