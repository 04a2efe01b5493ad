//! ai-load-balancer: LLM-aware endpoint picking for Higress / Envoy (Proxy-Wasm).
//!
//! Layout: `config` (parse + validate), `host` (all host calls), `redis` (RESP, scripts),
//! `upstream` (Higress host list), `request` (per-request state machine), `engine` (policy
//! decisions per VM), `filter` (the proxy-wasm context shells, wasm only).

pub mod config;
pub mod engine;
pub mod host;
pub mod metrics;
pub mod prefix;
pub mod redis;
pub mod request;
pub mod stats;
pub mod upstream;

#[cfg(target_arch = "wasm32")]
mod filter;

#[cfg(target_arch = "wasm32")]
proxy_wasm::main! {{
    // Our own panic hook: the SDK's unwraps its log call. Panics abort the VM anyway
    // (panic = "abort"); this makes the reason visible.
    std::panic::set_hook(Box::new(|info| {
        use host::Host;
        host::wasm::WasmHost.log(host::LogLevel::Critical, &format!("[ai-load-balancer] panic: {info}"));
    }));
    proxy_wasm::set_root_context(|id| Box::new(filter::Root::new(id)));
}}

/// Higress's host reads the first `proxy_abi_version_*` export; under 0_2_100 a request-headers
/// Pause holds the headers but still delivers the body. The SDK's `_0_2_1` export is removed
/// from the Higress artifact after linking (tools/wasm-abi; design §1).
#[cfg(all(target_arch = "wasm32", not(feature = "envoy")))]
#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_100() {}
