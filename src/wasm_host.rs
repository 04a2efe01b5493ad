//! [`WasmHost`]: the [`Host`] of a wasm build, every operation one raw import (src/ffi.rs).

use crate::ffi::*;
use ailb_core::host::{pairs, Host, HostResult, LogLevel, MetricType};
use std::ptr::null;

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

    fn now_us(&self) -> u64 {
        let mut ns: u64 = 0;
        // SAFETY: `ns` outlives the call.
        unsafe { proxy_get_current_time_nanoseconds(&mut ns) };
        ns / 1_000
    }

    fn property(&self, path: &[&str]) -> HostResult<Option<Vec<u8>>> {
        let joined = path.join("\0");
        // SAFETY: out-pointers are valid for the call; see `ffi::fetch`.
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

    fn request_header_map(&self) -> HostResult<Vec<u8>> {
        // SAFETY: as above. No headers = status 0 with a null pointer.
        Ok(fetch("get_header_map_pairs", |p, l| unsafe {
            proxy_get_header_map_pairs(REQUEST_HEADERS, p, l)
        })?
        .unwrap_or_default())
    }

    fn response_status(&self) -> HostResult<Option<Vec<u8>>> {
        // SAFETY: as above.
        fetch("get_header", |p, l| unsafe {
            proxy_get_header_map_value(RESPONSE_HEADERS, ":status".as_ptr(), ":status".len(), p, l)
        })
    }

    fn response_header_bytes(&self, name: &str) -> HostResult<Option<Vec<u8>>> {
        // SAFETY: as above.
        fetch("get_header", |p, l| unsafe {
            proxy_get_header_map_value(RESPONSE_HEADERS, name.as_ptr(), name.len(), p, l)
        })
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

    fn set_request_body(&mut self, body: &[u8]) -> HostResult<()> {
        // SAFETY: pointer/length of a live slice. Start 0 with a size past the end replaces
        // the whole buffered body (Envoy's and the emulator's rule).
        check("set_request_body", unsafe {
            proxy_set_buffer_bytes(REQUEST_BODY, 0, usize::MAX >> 1, body.as_ptr(), body.len())
        })
    }

    fn response_body(&self, start: usize, len: usize) -> HostResult<Vec<u8>> {
        // SAFETY: as for the request body.
        Ok(fetch("get_response_body", |p, l| unsafe {
            proxy_get_buffer_bytes(RESPONSE_BODY, start, len, p, l)
        })?
        .unwrap_or_default())
    }

    fn set_response_body(&mut self, body: &[u8]) -> HostResult<()> {
        // SAFETY: as above; in a response-body callback the buffer is the current chunk.
        check("set_response_body", unsafe {
            proxy_set_buffer_bytes(RESPONSE_BODY, 0, usize::MAX >> 1, body.as_ptr(), body.len())
        })
    }

    fn resume_request(&mut self) -> HostResult<()> {
        // SAFETY: no pointers.
        check("continue_stream", unsafe {
            proxy_continue_stream(STREAM_REQUEST)
        })
    }

    fn resume_response(&mut self) -> HostResult<()> {
        // SAFETY: no pointers.
        check("continue_stream", unsafe {
            proxy_continue_stream(STREAM_RESPONSE)
        })
    }

    fn send_local_response(
        &mut self,
        status: u32,
        details: &str,
        body: &[u8],
        extra: &[(&str, &str)],
    ) -> HostResult<()> {
        let mut all: Vec<(&str, &str)> = vec![("content-type", "text/plain")];
        all.extend_from_slice(extra);
        let headers = pairs::encode(&all);
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
        // SAFETY: out-pointers are valid for the call; see `ffi::fetch`.
        let v = fetch_present("get_shared_data", |p, l| unsafe {
            proxy_get_shared_data(key.as_ptr(), key.len(), p, l, &mut cas)
        })?;
        // An existing empty value is present, with its CAS (`shared::update` relies on it).
        Ok(v.map(|v| (v.unwrap_or_default(), cas)))
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
        let headers = pairs::encode(headers);
        let trailers = pairs::encode(&[]);
        let mut token = 0u32;
        // SAFETY: pointers/lengths of live buffers (no body: null, 0); `token` outlives
        // the call.
        check("http_call", unsafe {
            proxy_http_call(
                cluster.as_ptr(),
                cluster.len(),
                headers.as_ptr(),
                headers.len(),
                null(),
                0,
                trailers.as_ptr(),
                trailers.len(),
                timeout_ms,
                &mut token,
            )
        })?;
        Ok(token)
    }

    fn http_call_status(&self) -> HostResult<Option<u16>> {
        let name = ":status";
        // SAFETY: as in `ffi::fetch`.
        let raw = fetch("get_http_call_header", |p, l| unsafe {
            proxy_get_header_map_value(HTTP_CALL_RESPONSE_HEADERS, name.as_ptr(), name.len(), p, l)
        })?;
        Ok(raw.and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse().ok()))
    }

    fn http_call_body(&self, size: usize) -> HostResult<Vec<u8>> {
        // SAFETY: as in `ffi::fetch`.
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
fn unsupported(call: &'static str) -> ailb_core::host::HostError {
    ailb_core::host::HostError::new(call, ailb_core::host::HostErrorKind::Unsupported)
}
