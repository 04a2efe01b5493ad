//! ai-load-balancer's wasm glue: the proxy-wasm context shells and the one module that makes
//! host calls (`ffi`). Every decision is made in the `ailb-core` crate, which has no proxy-wasm
//! dependency (docs/architecture.md).

#[cfg(target_arch = "wasm32")]
mod ffi;
#[cfg(target_arch = "wasm32")]
mod filter;

#[cfg(target_arch = "wasm32")]
proxy_wasm::main! {{
    // Our own panic hook: the SDK's unwraps its log call. Panics abort the VM anyway
    // (panic = "abort"); this makes the reason visible.
    std::panic::set_hook(Box::new(|info| {
        use ailb_core::host::{Host, LogLevel};
        ffi::WasmHost.log(LogLevel::Critical, &format!("[ai-load-balancer] panic: {info}"));
    }));
    proxy_wasm::set_root_context(|id| Box::new(filter::Root::new(id)));
}}

/// Higress's host reads the first `proxy_abi_version_*` export; under 0_2_100 a request-headers
/// Pause holds the headers but still delivers the body. The SDK's `_0_2_1` export is removed
/// from the Higress artifact after linking (tools/wasm-abi; docs/higress-abi.md).
#[cfg(all(target_arch = "wasm32", not(feature = "envoy")))]
#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_100() {}
