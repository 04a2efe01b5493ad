//! ai-load-balancer's wasm glue: the Proxy-Wasm exports (`exports`), the context registry
//! (`contexts`), the raw host imports (`ffi`) and the `Host` built on them (`wasm_host`).
//! Every decision is made in the `ailb-core` crate, which knows nothing of the ABI.

#[cfg(any(target_arch = "wasm32", test))]
mod contexts;
#[cfg(target_arch = "wasm32")]
mod exports;
#[cfg(target_arch = "wasm32")]
mod ffi;
#[cfg(target_arch = "wasm32")]
mod wasm_host;
