//! The raw proxy-wasm 0.2.1 imports plus Higress's extensions, and the two rules every call
//! follows: a status number becomes a [`HostErrorKind`] here and nowhere else, and a buffer the
//! host hands over becomes an owned `Vec`. No SDK wrapper is used: the crates.io SDK's wrappers
//! panic on statuses they do not expect, and a panic kills the worker's VM.

use ailb_core::host::{HostError, HostErrorKind, HostResult, LogLevel};
use std::ptr::null_mut;

#[link(wasm_import_module = "env")]
extern "C" {
    pub fn proxy_log(level: u32, ptr: *const u8, len: usize) -> u32;
    pub fn proxy_get_log_level(out: *mut u32) -> u32;
    pub fn proxy_get_current_time_nanoseconds(out: *mut u64) -> u32;
    pub fn proxy_get_property(
        path: *const u8,
        len: usize,
        out: *mut *mut u8,
        out_len: *mut usize,
    ) -> u32;
    pub fn proxy_get_header_map_value(
        map: u32,
        key: *const u8,
        key_len: usize,
        out: *mut *mut u8,
        out_len: *mut usize,
    ) -> u32;
    pub fn proxy_get_header_map_pairs(map: u32, out: *mut *mut u8, out_len: *mut usize) -> u32;
    pub fn proxy_replace_header_map_value(
        map: u32,
        key: *const u8,
        key_len: usize,
        value: *const u8,
        value_len: usize,
    ) -> u32;
    pub fn proxy_add_header_map_value(
        map: u32,
        key: *const u8,
        key_len: usize,
        value: *const u8,
        value_len: usize,
    ) -> u32;
    pub fn proxy_remove_header_map_value(map: u32, key: *const u8, key_len: usize) -> u32;
    pub fn proxy_get_buffer_bytes(
        kind: u32,
        start: usize,
        max: usize,
        out: *mut *mut u8,
        out_len: *mut usize,
    ) -> u32;
    pub fn proxy_set_buffer_bytes(
        kind: u32,
        start: usize,
        size: usize,
        value: *const u8,
        value_len: usize,
    ) -> u32;
    pub fn proxy_continue_stream(stream: u32) -> u32;
    pub fn proxy_send_local_response(
        status: u32,
        details: *const u8,
        details_len: usize,
        body: *const u8,
        body_len: usize,
        headers: *const u8,
        headers_len: usize,
        grpc_status: i32,
    ) -> u32;
    pub fn proxy_set_effective_context(context_id: u32) -> u32;
    pub fn proxy_define_metric(kind: u32, name: *const u8, name_len: usize, out: *mut u32) -> u32;
    pub fn proxy_increment_metric(id: u32, delta: i64) -> u32;
    pub fn proxy_get_shared_data(
        key: *const u8,
        key_len: usize,
        out: *mut *mut u8,
        out_len: *mut usize,
        cas: *mut u32,
    ) -> u32;
    pub fn proxy_set_shared_data(
        key: *const u8,
        key_len: usize,
        value: *const u8,
        value_len: usize,
        cas: u32,
    ) -> u32;
    pub fn proxy_set_tick_period_milliseconds(ms: u32) -> u32;
    /// Headers and trailers are "pairs" buffers (`ailb_core::host::pairs`); the token comes
    /// back in `proxy_on_http_call_response`.
    pub fn proxy_http_call(
        cluster: *const u8,
        cluster_len: usize,
        headers: *const u8,
        headers_len: usize,
        body: *const u8,
        body_len: usize,
        trailers: *const u8,
        trailers_len: usize,
        timeout_ms: u32,
        token: *mut u32,
    ) -> u32;
}

#[cfg(not(feature = "envoy"))]
#[link(wasm_import_module = "env")]
extern "C" {
    pub fn proxy_get_upstream_hosts(out: *mut *mut u8, out_len: *mut usize) -> u32;
    pub fn proxy_set_upstream_override_host(addr: *const u8, len: usize) -> u32;
    pub fn proxy_redis_init(
        cluster: *const u8,
        cluster_len: usize,
        user: *const u8,
        user_len: usize,
        pass: *const u8,
        pass_len: usize,
        timeout_ms: u32,
    ) -> u32;
    pub fn proxy_redis_call(
        cluster: *const u8,
        cluster_len: usize,
        query: *const u8,
        query_len: usize,
        token: *mut u32,
    ) -> u32;
}

/// Header map and buffer numbers of the ABI (proxy-wasm 0.2.1 `MapType` / `BufferType`;
/// buffer 9 is Higress's Redis reply).
pub const REQUEST_HEADERS: u32 = 0;
pub const RESPONSE_HEADERS: u32 = 2;
pub const HTTP_CALL_RESPONSE_HEADERS: u32 = 6;
pub const REQUEST_BODY: u32 = 0;
pub const RESPONSE_BODY: u32 = 1;
pub const HTTP_CALL_RESPONSE_BODY: u32 = 4;
const PLUGIN_CONFIGURATION: u32 = 7;
#[cfg(not(feature = "envoy"))]
pub const REDIS_CALL_RESPONSE: u32 = 9;
pub const STREAM_REQUEST: u32 = 0;
pub const STREAM_RESPONSE: u32 = 1;

/// The ABI's status numbers (proxy-wasm 0.2.1 `Status`) as domain errors: the only place a
/// status number is read.
pub fn error_kind(status: u32) -> HostErrorKind {
    match status {
        1 => HostErrorKind::NotFound,
        2 => HostErrorKind::BadArgument,
        6 => HostErrorKind::InvalidMemoryAccess,
        7 => HostErrorKind::Empty,
        8 => HostErrorKind::CasMismatch,
        10 => HostErrorKind::InternalFailure,
        12 => HostErrorKind::Unimplemented,
        s => HostErrorKind::Unknown(s),
    }
}

/// A call whose only answer is its status.
pub fn check(call: &'static str, status: u32) -> HostResult<()> {
    if status == 0 {
        Ok(())
    } else {
        Err(HostError::new(call, error_kind(status)))
    }
}

/// Takes ownership of a host-written buffer. The host allocated it through our
/// `proxy_on_memory_allocate` (src/exports.rs), which uses the Rust global allocator with the
/// layout of a `Vec<u8>` of exactly that length, so a `Vec` may own and free it.
fn owned(ptr: *mut u8, len: usize) -> Option<Vec<u8>> {
    if ptr.is_null() {
        None
    } else {
        // SAFETY: the host wrote `len` bytes into a buffer of exactly `len` bytes that it
        // obtained from `proxy_on_memory_allocate`, and gave up ownership.
        Some(unsafe { Vec::from_raw_parts(ptr, len, len) })
    }
}

/// A buffer-returning call: NotFound means "absent", anything else but Ok is an error. Ok with
/// no bytes (hosts write a null pointer for an empty value) reads as absent too.
pub fn fetch(
    call: &'static str,
    f: impl FnOnce(*mut *mut u8, *mut usize) -> u32,
) -> HostResult<Option<Vec<u8>>> {
    Ok(fetch_present(call, f)?.flatten())
}

/// [`fetch`] that tells an existing empty value (`Some(None)`) from an absent one (`None`):
/// shared data, where an empty value still has the CAS an update must write against.
pub fn fetch_present(
    call: &'static str,
    f: impl FnOnce(*mut *mut u8, *mut usize) -> u32,
) -> HostResult<Option<Option<Vec<u8>>>> {
    let mut ptr: *mut u8 = null_mut();
    let mut len: usize = 0;
    match f(&mut ptr, &mut len) {
        0 => Ok(Some(owned(ptr, len))),
        1 => Ok(None),
        status => Err(HostError::new(call, error_kind(status))),
    }
}

/// The plugin configuration buffer (root context, during on_configure).
pub fn plugin_configuration() -> HostResult<Vec<u8>> {
    // SAFETY: out-pointers are valid for the call; see `owned`.
    Ok(fetch("get_plugin_configuration", |p, l| unsafe {
        proxy_get_buffer_bytes(PLUGIN_CONFIGURATION, 0, usize::MAX, p, l)
    })?
    .unwrap_or_default())
}

/// The host's log level, so disabled levels cost no formatting.
pub fn log_level() -> LogLevel {
    let mut level = 2u32;
    // SAFETY: `level` outlives the call.
    unsafe { proxy_get_log_level(&mut level) };
    match level {
        0 => LogLevel::Trace,
        1 => LogLevel::Debug,
        2 => LogLevel::Info,
        3 => LogLevel::Warn,
        4 => LogLevel::Error,
        _ => LogLevel::Critical,
    }
}
