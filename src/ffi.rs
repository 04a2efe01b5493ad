//! The real host: raw proxy-wasm 0.2.1 imports plus Higress's extensions. The SDK declares
//! some of the same imports with enum parameter types; ours use plain integers (the same wasm
//! signature), which is also how buffer type 9 is reachable at all (design §1, abi spec §1.3).
#![allow(clashing_extern_declarations)]

use ailb_core::host::{pairs, Host, HostError, HostErrorKind, HostResult, LogLevel, MetricType};
use std::ptr::null_mut;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, ptr: *const u8, len: usize) -> u32;
    fn proxy_get_current_time_nanoseconds(out: *mut u64) -> u32;
    fn proxy_get_property(
        path: *const u8,
        len: usize,
        out: *mut *mut u8,
        out_len: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_value(
        map: u32,
        key: *const u8,
        key_len: usize,
        out: *mut *mut u8,
        out_len: *mut usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        map: u32,
        key: *const u8,
        key_len: usize,
        value: *const u8,
        value_len: usize,
    ) -> u32;
    fn proxy_add_header_map_value(
        map: u32,
        key: *const u8,
        key_len: usize,
        value: *const u8,
        value_len: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(map: u32, key: *const u8, key_len: usize) -> u32;
    fn proxy_get_buffer_bytes(
        kind: u32,
        start: usize,
        max: usize,
        out: *mut *mut u8,
        out_len: *mut usize,
    ) -> u32;
    fn proxy_continue_stream(stream: u32) -> u32;
    fn proxy_send_local_response(
        status: u32,
        details: *const u8,
        details_len: usize,
        body: *const u8,
        body_len: usize,
        headers: *const u8,
        headers_len: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_set_effective_context(context_id: u32) -> u32;
    fn proxy_define_metric(kind: u32, name: *const u8, name_len: usize, out: *mut u32) -> u32;
    fn proxy_increment_metric(id: u32, delta: i64) -> u32;
    fn proxy_get_shared_data(
        key: *const u8,
        key_len: usize,
        out: *mut *mut u8,
        out_len: *mut usize,
        cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key: *const u8,
        key_len: usize,
        value: *const u8,
        value_len: usize,
        cas: u32,
    ) -> u32;
    fn proxy_set_tick_period_milliseconds(ms: u32) -> u32;
}

#[cfg(not(feature = "envoy"))]
#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_get_upstream_hosts(out: *mut *mut u8, out_len: *mut usize) -> u32;
    fn proxy_set_upstream_override_host(addr: *const u8, len: usize) -> u32;
    fn proxy_redis_init(
        cluster: *const u8,
        cluster_len: usize,
        user: *const u8,
        user_len: usize,
        pass: *const u8,
        pass_len: usize,
        timeout_ms: u32,
    ) -> u32;
    fn proxy_redis_call(
        cluster: *const u8,
        cluster_len: usize,
        query: *const u8,
        query_len: usize,
        token: *mut u32,
    ) -> u32;
}

const REQUEST_HEADERS: u32 = 0;
const RESPONSE_HEADERS: u32 = 2;
const REQUEST_BODY: u32 = 0;
#[cfg(not(feature = "envoy"))]
const REDIS_CALL_RESPONSE: u32 = 9;
const HTTP_CALL_RESPONSE_HEADERS: u32 = 6;
const HTTP_CALL_RESPONSE_BODY: u32 = 4;
const STREAM_REQUEST: u32 = 0;

/// The ABI's status numbers (proxy-wasm spec, docs/higress-abi.md "Statuses") as domain errors:
/// the only place a status number is read.
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

fn check(call: &'static str, status: u32) -> HostResult<()> {
    if status == 0 {
        Ok(())
    } else {
        Err(HostError::new(call, error_kind(status)))
    }
}

/// Takes ownership of a host-allocated buffer (allocated through the SDK's exported
/// `proxy_on_memory_allocate`, so a `Vec` of the same size owns it).
fn owned(ptr: *mut u8, len: usize) -> Option<Vec<u8>> {
    if ptr.is_null() {
        None
    } else {
        // SAFETY: the host wrote `len` bytes into a buffer of exactly `len` bytes that it
        // obtained from our allocator, and gave up ownership.
        Some(unsafe { Vec::from_raw_parts(ptr, len, len) })
    }
}

/// A buffer-returning call: NotFound means "absent", anything else but Ok is an error.
fn fetch(
    call: &'static str,
    f: impl FnOnce(*mut *mut u8, *mut usize) -> u32,
) -> HostResult<Option<Vec<u8>>> {
    let mut ptr: *mut u8 = null_mut();
    let mut len: usize = 0;
    match f(&mut ptr, &mut len) {
        0 => Ok(owned(ptr, len)),
        1 => Ok(None),
        status => Err(HostError::new(call, error_kind(status))),
    }
}

/// The host of a wasm build. Stateless: every call goes straight to the imports.
#[derive(Default)]
pub struct WasmHost;

impl Host for WasmHost {
    fn log(&self, level: LogLevel, message: &str) {
        // SAFETY: pointer/length of a live &str.
        let _ = unsafe { proxy_log(level as u32, message.as_ptr(), message.len()) };
    }

    fn now_ms(&self) -> u64 {
        let mut ns: u64 = 0;
        // SAFETY: `ns` outlives the call.
        unsafe { proxy_get_current_time_nanoseconds(&mut ns) };
        ns / 1_000_000
    }

    fn property(&self, path: &[&str]) -> HostResult<Option<Vec<u8>>> {
        let joined = path.join("\0");
        // SAFETY: out-pointers are valid for the call; see `owned`.
        fetch("get_property", |p, l| unsafe {
            proxy_get_property(joined.as_ptr(), joined.len(), p, l)
        })
    }

    fn request_header(&self, name: &str) -> HostResult<Option<String>> {
        // SAFETY: as above.
        let raw = fetch("get_header", |p, l| unsafe {
            proxy_get_header_map_value(REQUEST_HEADERS, name.as_ptr(), name.len(), p, l)
        })?;
        Ok(raw.map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    fn request_header_bytes(&self, name: &str) -> HostResult<Option<Vec<u8>>> {
        // SAFETY: as above.
        fetch("get_header", |p, l| unsafe {
            proxy_get_header_map_value(REQUEST_HEADERS, name.as_ptr(), name.len(), p, l)
        })
    }

    fn response_header(&self, name: &str) -> HostResult<Option<String>> {
        // SAFETY: as above.
        let raw = fetch("get_header", |p, l| unsafe {
            proxy_get_header_map_value(RESPONSE_HEADERS, name.as_ptr(), name.len(), p, l)
        })?;
        Ok(raw.map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    fn remove_request_header(&mut self, name: &str) -> HostResult<()> {
        // SAFETY: pointer/length of a live &str.
        check("remove_header", unsafe {
            proxy_remove_header_map_value(REQUEST_HEADERS, name.as_ptr(), name.len())
        })
    }

    fn set_request_header(&mut self, name: &str, value: &str) -> HostResult<()> {
        // SAFETY: pointer/length of live &strs.
        check("replace_header", unsafe {
            proxy_replace_header_map_value(
                REQUEST_HEADERS,
                name.as_ptr(),
                name.len(),
                value.as_ptr(),
                value.len(),
            )
        })
    }

    fn add_response_header(&mut self, name: &str, value: &str) -> HostResult<()> {
        // SAFETY: pointer/length of live &strs.
        check("add_header", unsafe {
            proxy_add_header_map_value(
                RESPONSE_HEADERS,
                name.as_ptr(),
                name.len(),
                value.as_ptr(),
                value.len(),
            )
        })
    }

    fn request_body(&self, start: usize, len: usize) -> HostResult<Vec<u8>> {
        // SAFETY: as above.
        Ok(fetch("get_request_body", |p, l| unsafe {
            proxy_get_buffer_bytes(REQUEST_BODY, start, len, p, l)
        })?
        .unwrap_or_default())
    }

    fn resume_request(&mut self) -> HostResult<()> {
        // SAFETY: no pointers.
        check("continue_stream", unsafe {
            proxy_continue_stream(STREAM_REQUEST)
        })
    }

    fn send_local_response(&mut self, status: u32, details: &str, body: &[u8]) -> HostResult<()> {
        let headers = pairs::encode(&[("content-type", "text/plain")]);
        // SAFETY: pointers/lengths of live buffers.
        check("send_local_response", unsafe {
            proxy_send_local_response(
                status,
                details.as_ptr(),
                details.len(),
                body.as_ptr(),
                body.len(),
                headers.as_ptr(),
                headers.len(),
                -1,
            )
        })
    }

    fn set_effective_context(&mut self, context_id: u32) -> HostResult<()> {
        // SAFETY: no pointers.
        check("set_effective_context", unsafe {
            proxy_set_effective_context(context_id)
        })
    }

    fn define_metric(&mut self, kind: MetricType, name: &str) -> HostResult<u32> {
        let mut id = 0u32;
        // SAFETY: pointer/length of a live &str; `id` outlives the call.
        check("define_metric", unsafe {
            proxy_define_metric(kind as u32, name.as_ptr(), name.len(), &mut id)
        })?;
        Ok(id)
    }

    fn increment_metric(&mut self, id: u32, delta: i64) -> HostResult<()> {
        // SAFETY: no pointers.
        check("increment_metric", unsafe {
            proxy_increment_metric(id, delta)
        })
    }

    fn shared_get(&self, key: &str) -> HostResult<Option<(Vec<u8>, u32)>> {
        let mut cas = 0u32;
        // SAFETY: out-pointers are valid for the call; see `owned`.
        let v = fetch("get_shared_data", |p, l| unsafe {
            proxy_get_shared_data(key.as_ptr(), key.len(), p, l, &mut cas)
        })?;
        Ok(v.map(|v| (v, cas)))
    }

    fn shared_set(&mut self, key: &str, value: &[u8], cas: u32) -> HostResult<()> {
        // SAFETY: pointers/lengths of live buffers.
        check("set_shared_data", unsafe {
            proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas)
        })
    }

    fn set_tick_period(&mut self, ms: u32) -> HostResult<()> {
        // SAFETY: no pointers.
        check("set_tick_period", unsafe {
            proxy_set_tick_period_milliseconds(ms)
        })
    }

    fn http_call(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout_ms: u32,
    ) -> HostResult<u32> {
        // Through the SDK so its dispatcher routes the response to the root context (it panics
        // on tokens it does not know). It panics itself only on statuses other than Ok,
        // BadArgument and InternalFailure, which no host returns for this call.
        proxy_wasm::hostcalls::dispatch_http_call(
            cluster,
            headers.to_vec(),
            None,
            Vec::new(),
            std::time::Duration::from_millis(u64::from(timeout_ms)),
        )
        .map_err(|s| HostError::new("http_call", error_kind(s as u32)))
    }

    fn http_call_status(&self) -> HostResult<Option<u16>> {
        let name = ":status";
        // SAFETY: as in `fetch`.
        let raw = fetch("get_http_call_header", |p, l| unsafe {
            proxy_get_header_map_value(HTTP_CALL_RESPONSE_HEADERS, name.as_ptr(), name.len(), p, l)
        })?;
        Ok(raw.and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse().ok()))
    }

    fn http_call_body(&self, size: usize) -> HostResult<Vec<u8>> {
        // SAFETY: as in `fetch`.
        Ok(fetch("get_http_call_body", |p, l| unsafe {
            proxy_get_buffer_bytes(HTTP_CALL_RESPONSE_BODY, 0, size, p, l)
        })?
        .unwrap_or_default())
    }

    #[cfg(not(feature = "envoy"))]
    fn upstream_hosts(&self) -> HostResult<Vec<u8>> {
        // SAFETY: as above. No hosts = status 0 with a null pointer.
        Ok(fetch("get_upstream_hosts", |p, l| unsafe {
            proxy_get_upstream_hosts(p, l)
        })?
        .unwrap_or_default())
    }

    #[cfg(not(feature = "envoy"))]
    fn set_upstream_override_host(&mut self, address: &str) -> HostResult<()> {
        // SAFETY: pointer/length of a live &str.
        check("set_upstream_override_host", unsafe {
            proxy_set_upstream_override_host(address.as_ptr(), address.len())
        })
    }

    #[cfg(not(feature = "envoy"))]
    fn redis_init(
        &mut self,
        cluster: &str,
        user: &str,
        password: &str,
        timeout_ms: u32,
    ) -> HostResult<()> {
        // SAFETY: pointers/lengths of live &strs.
        check("redis_init", unsafe {
            proxy_redis_init(
                cluster.as_ptr(),
                cluster.len(),
                user.as_ptr(),
                user.len(),
                password.as_ptr(),
                password.len(),
                timeout_ms,
            )
        })
    }

    #[cfg(not(feature = "envoy"))]
    fn redis_call(&mut self, cluster: &str, query: &[u8]) -> HostResult<u32> {
        let mut token = 0u32;
        // SAFETY: pointers/lengths of live buffers; `token` outlives the call.
        check("redis_call", unsafe {
            proxy_redis_call(
                cluster.as_ptr(),
                cluster.len(),
                query.as_ptr(),
                query.len(),
                &mut token,
            )
        })?;
        Ok(token)
    }

    #[cfg(not(feature = "envoy"))]
    fn redis_reply(&self, size: usize) -> HostResult<Vec<u8>> {
        // SAFETY: as above.
        Ok(fetch("get_redis_reply", |p, l| unsafe {
            proxy_get_buffer_bytes(REDIS_CALL_RESPONSE, 0, size, p, l)
        })?
        .unwrap_or_default())
    }

    #[cfg(feature = "envoy")]
    fn upstream_hosts(&self) -> HostResult<Vec<u8>> {
        Err(unsupported("get_upstream_hosts"))
    }

    #[cfg(feature = "envoy")]
    fn set_upstream_override_host(&mut self, _address: &str) -> HostResult<()> {
        Err(unsupported("set_upstream_override_host"))
    }

    #[cfg(feature = "envoy")]
    fn redis_init(&mut self, _: &str, _: &str, _: &str, _: u32) -> HostResult<()> {
        Err(unsupported("redis_init"))
    }

    #[cfg(feature = "envoy")]
    fn redis_call(&mut self, _: &str, _: &[u8]) -> HostResult<u32> {
        Err(unsupported("redis_call"))
    }

    #[cfg(feature = "envoy")]
    fn redis_reply(&self, _: usize) -> HostResult<Vec<u8>> {
        Err(unsupported("get_redis_reply"))
    }
}

#[cfg(feature = "envoy")]
fn unsupported(call: &'static str) -> HostError {
    HostError::new(call, HostErrorKind::Unsupported)
}

#[link(wasm_import_module = "env")]
extern "C" {
    #[link_name = "proxy_get_log_level"]
    fn proxy_get_log_level_raw(out: *mut u32) -> u32;
}

const PLUGIN_CONFIGURATION: u32 = 7;

/// The plugin configuration buffer (root context, during on_configure).
pub fn plugin_configuration() -> HostResult<Vec<u8>> {
    // SAFETY: as in `fetch`.
    Ok(fetch("get_plugin_configuration", |p, l| unsafe {
        proxy_get_buffer_bytes(PLUGIN_CONFIGURATION, 0, usize::MAX, p, l)
    })?
    .unwrap_or_default())
}

/// The host's log level, so disabled levels cost no formatting.
pub fn log_level() -> LogLevel {
    let mut level = 2u32;
    // SAFETY: `level` outlives the call.
    unsafe { proxy_get_log_level_raw(&mut level) };
    match level {
        0 => LogLevel::Trace,
        1 => LogLevel::Debug,
        2 => LogLevel::Info,
        3 => LogLevel::Warn,
        4 => LogLevel::Error,
        _ => LogLevel::Critical,
    }
}
