//! The Proxy-Wasm ABI this module exports: proxy-wasm 0.2.1's callbacks plus Higress's Redis
//! reply, written here instead of linking the crates.io SDK's dispatcher (which panics on
//! unknown callout tokens and unwraps host statuses in every callback; a panic kills the
//! worker's VM). Each callback routes the host's context id through [`Contexts`] to the
//! [`Balancer`] of its root; unknown ids and re-entrant calls are no-ops.
//!
//! Callbacks the plugin has no use for (trailers, TCP, gRPC, queues, foreign functions) are
//! not exported: proxy-wasm-cpp-host (Envoy, Higress) and the e2e emulator look every callback
//! up as optional and answer Continue / true for a missing one. The host's one required
//! export is the allocator, `proxy_on_memory_allocate` (or `malloc`).

use crate::contexts::Contexts;
use crate::ffi;
use crate::wasm_host::WasmHost;
#[cfg(not(feature = "envoy"))]
use ailb_core::balancer::CallStatus;
use ailb_core::balancer::{Balancer, Verdict};
use ailb_core::config::{self, Build};
use ailb_core::host::{Host, LogLevel};
use std::cell::{RefCell, RefMut};
use std::hash::{BuildHasher, Hasher};

/// The VM's contexts, which every callback reaches.
struct Registry(RefCell<Contexts<Box<Balancer>>>);

// SAFETY: this module is built for wasm32 only (lib.rs), without the threads feature: the VM
// runs one thread and calls one export at a time, so the cell is never shared across threads.
unsafe impl Sync for Registry {}

static REGISTRY: Registry = Registry(RefCell::new(Contexts::new()));

/// The registry; `None` inside a re-entrant call (which the host never makes) instead of a
/// panic.
fn registry() -> Option<RefMut<'static, Contexts<Box<Balancer>>>> {
    REGISTRY.0.try_borrow_mut().ok()
}

/// Runs `f` on the registry.
fn with_contexts<R>(f: impl FnOnce(&mut Contexts<Box<Balancer>>) -> R) -> Option<R> {
    registry().map(|mut c| f(&mut c))
}

/// Runs `f` on the balancer serving context `id` (a root, or an http context's root).
fn with_balancer<R>(id: u32, f: impl FnOnce(&mut Balancer, &mut WasmHost) -> R) -> Option<R> {
    with_contexts(|c| c.balancer(id).map(|b| f(b, &mut WasmHost))).flatten()
}

/// The stream of http context `id` ended: its balancer gives back what it acquired, once
/// (every end-of-stream callback calls this; the later ones stop at the registry).
fn end_stream(id: u32) {
    with_contexts(|c| {
        if let Some(b) = c.end(id).and_then(|r| c.root_balancer(r)) {
            b.on_done(&mut WasmHost, id);
        }
    });
}

/// proxy-wasm 0.2.1 `Action`.
const CONTINUE: u32 = 0;
const PAUSE: u32 = 1;
/// FilterDataStatus::StopIterationAndWatermark (docs/higress-abi.md §2), body callbacks only.
const STOP_AND_WATERMARK: u32 = 2;

fn action(v: Verdict) -> u32 {
    match v {
        Verdict::Continue => CONTINUE,
        Verdict::Pause => PAUSE,
        // Headers callbacks never get it; a header status 2 would mean something else.
        Verdict::PauseWatermark => PAUSE,
    }
}

fn data_action(v: Verdict) -> u32 {
    match v {
        Verdict::PauseWatermark => STOP_AND_WATERMARK,
        other => action(other),
    }
}

#[cfg(target_os = "wasi")]
extern "C" {
    /// wasi-libc's constructors (preopens, environment), synthesised by the linker.
    fn __wasm_call_ctors();
}

/// WASI reactor start: run the C constructors, then install our panic hook. Panics abort the
/// VM anyway (panic = "abort"); the hook makes the reason visible in the host's log.
#[no_mangle]
pub extern "C" fn _initialize() {
    // SAFETY: called once, by the host, before any other export.
    #[cfg(target_os = "wasi")]
    unsafe {
        __wasm_call_ctors()
    };
    std::panic::set_hook(Box::new(|info| {
        WasmHost.log(
            LogLevel::Critical,
            &format!("[ai-load-balancer] panic: {info}"),
        );
    }));
}

/// The plain-Envoy build speaks proxy-wasm 0.2.1, the ABI Envoy reads from this export.
#[cfg(feature = "envoy")]
#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

/// The Higress build exports 0_2_100 only: under it a request-headers Pause holds the headers
/// but still delivers the body (docs/higress-abi.md §1); under 0_2_1 it would starve the body.
#[cfg(not(feature = "envoy"))]
#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_100() {}

/// The host allocates every buffer it hands us here, with the Rust global allocator and the
/// layout of a `Vec<u8>` of exactly `size` bytes, so `ffi::fetch` may own it as that `Vec`.
/// Null (the host then fails that call) instead of a panic when the size is impossible.
#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    match std::alloc::Layout::array::<u8>(size) {
        // SAFETY: the layout has a non-zero size.
        Ok(layout) if size > 0 => unsafe { std::alloc::alloc(layout) },
        // A zero-length Vec owns no allocation: any non-null aligned pointer will do.
        Ok(_) => std::ptr::NonNull::dangling().as_ptr(),
        Err(_) => std::ptr::null_mut(),
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(_root: u32, _vm_configuration_size: usize) -> bool {
    true
}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(id: u32, parent: u32) {
    with_contexts(|c| c.create(id, parent));
}

/// Parses the plugin configuration and gives `root` a balancer for it; a rejected
/// configuration answers false (the host refuses it) and leaves any earlier balancer.
#[no_mangle]
pub extern "C" fn proxy_on_configure(root: u32, _configuration_size: usize) -> bool {
    let host = &mut WasmHost;
    let raw = ffi::plugin_configuration().unwrap_or_default();
    // The host configures a live root again only with the configuration it has (a changed one
    // is a new root context: docs/higress-abi.md §11 "Root contexts"). A new balancer would
    // drop the counts its requests hold, so the one there stays.
    if with_contexts(|c| c.configured_with(root, &raw)) == Some(true) {
        return true;
    }
    match config::parse(&raw, Build::CURRENT) {
        Ok(parsed) => {
            let level = ffi::log_level();
            // Where the config leans on Higress's lenient reading, say so once per load
            // (docs/compatibility.md).
            for w in &parsed.warnings {
                host.log(LogLevel::Warn, &format!("[ai-load-balancer] config: {w}"));
            }
            let config = parsed.config;
            host.log(
                LogLevel::Info,
                &format!(
                    "[ai-load-balancer] {} config accepted: {}",
                    env!("CARGO_PKG_VERSION"),
                    config.summary()
                ),
            );
            let balancer = Box::new(Balancer::configure(host, config, entropy(), level));
            with_contexts(|c| c.configure(root, balancer, raw)).is_some()
        }
        Err(e) => {
            host.log(LogLevel::Error, &format!("[ai-load-balancer] {e}"));
            false
        }
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(id: u32, _headers: usize, end_of_stream: u32) -> u32 {
    with_balancer(id, |b, h| {
        action(b.on_request_headers(h, id, end_of_stream != 0))
    })
    .unwrap_or(CONTINUE)
}

#[no_mangle]
pub extern "C" fn proxy_on_request_body(id: u32, body_size: usize, end_of_stream: u32) -> u32 {
    with_balancer(id, |b, h| {
        data_action(b.on_request_body(h, id, body_size, end_of_stream != 0))
    })
    .unwrap_or(CONTINUE)
}

/// The response begins (the debug header, cluster_metrics' status); nothing is held. The
/// balancer's answer says whether the body chunks matter.
#[no_mangle]
pub extern "C" fn proxy_on_response_headers(id: u32, _headers: usize, _eos: u32) -> u32 {
    with_contexts(|c| {
        let wanted = c
            .balancer(id)
            .map(|b| b.on_response_headers(&mut WasmHost, id));
        c.watch_body(id, wanted == Some(true));
    });
    CONTINUE
}

/// cluster_metrics times the first response-body chunk (its TTFT); prefix_cache reads a
/// verified response's usage and may rewrite the chunk (its usage event out). Only a last chunk
/// is ever held, while the request's Redis writes are in flight (`Balancer::holds_response`;
/// resumed from their reply). A chunk the balancer said it does not want (most chunks of a
/// streamed answer) ends here.
#[no_mangle]
pub extern "C" fn proxy_on_response_body(id: u32, body_size: usize, eos: u32) -> u32 {
    let held = with_contexts(|c| {
        if !c.watches_body(id) {
            return false;
        }
        let b = c.balancer(id);
        let wanted = b.map(|b| b.on_response_body(&mut WasmHost, id, body_size, eos != 0));
        let held = c.balancer(id).is_some_and(|b| b.holds_response(id));
        c.watch_body(id, wanted == Some(true));
        held
    });
    if held == Some(true) {
        PAUSE
    } else {
        CONTINUE
    }
}

/// True: neither an http context nor a root needs the host to wait before deleting it.
#[no_mangle]
pub extern "C" fn proxy_on_done(id: u32) -> bool {
    end_stream(id);
    true
}

/// Backstop for hosts that skip on_done.
#[no_mangle]
pub extern "C" fn proxy_on_log(id: u32) {
    end_stream(id);
}

/// The context is gone: release its stream (backstop again) and forget it.
#[no_mangle]
pub extern "C" fn proxy_on_delete(id: u32) {
    end_stream(id);
    with_contexts(|c| c.delete(id));
}

#[no_mangle]
pub extern "C" fn proxy_on_tick(root: u32) {
    with_balancer(root, |b, h| b.on_tick(h));
}

/// A scrape callout answered, delivered to the context that dispatched it (the root; an http
/// context would reach its root's balancer). Tokens the balancer did not issue are ignored.
#[no_mangle]
pub extern "C" fn proxy_on_http_call_response(
    id: u32,
    token: u32,
    _headers: usize,
    body_size: usize,
    _trailers: usize,
) {
    with_balancer(id, |b, h| b.on_http_response(h, token, body_size));
}

/// Higress delivers every Redis reply here, on the root context that made the call.
#[cfg(not(feature = "envoy"))]
#[no_mangle]
pub extern "C" fn proxy_on_redis_call_response(root: u32, token: u32, status: u32, size: usize) {
    // Status 0: the reply is readable; anything else: timeout or connection failure
    // (docs/higress-abi.md §6).
    let status = if status == 0 {
        CallStatus::Ok
    } else {
        CallStatus::Failed
    };
    with_balancer(root, |b, h| b.on_redis_reply(h, token, status, size));
}

/// Per-VM randomness (request ids, tie-break seeds) from WASI's random_get via std's hasher keys.
fn entropy() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x5eed);
    h.finish()
}
