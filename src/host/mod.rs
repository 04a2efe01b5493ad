//! Everything the plugin asks of the host goes through [`Host`]. The wasm implementation
//! ([`wasm::WasmHost`]) is the only code that touches FFI; tests drive the same logic with
//! [`mock::MockHost`]. Every call returns a `Result`: the SDK's own wrappers panic on
//! unexpected statuses, and a panic kills the worker's VM.

pub mod pairs;

#[cfg(test)]
pub mod mock;
#[cfg(target_arch = "wasm32")]
pub mod wasm;

use std::fmt;

pub use proxy_wasm::types::{LogLevel, MetricType};

/// A host call that did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostError {
    pub call: &'static str,
    pub status: u32,
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.status {
            1 => "not found",
            2 => "bad argument / not available here",
            6 => "invalid memory access",
            7 => "empty",
            8 => "cas mismatch",
            10 => "internal failure",
            12 => "unimplemented",
            UNSUPPORTED => "not supported by this build",
            _ => "error",
        };
        write!(f, "{} failed: status {} ({what})", self.call, self.status)
    }
}

/// Status used for calls this build does not have (Higress extensions in the Envoy build).
pub const UNSUPPORTED: u32 = 0xffff;

pub type HostResult<T> = Result<T, HostError>;

/// The host operations the plugin uses. Stream operations act on the current (or effective)
/// HTTP context.
pub trait Host {
    fn log(&self, level: LogLevel, message: &str);
    fn now_ms(&self) -> u64;
    fn property(&self, path: &[&str]) -> HostResult<Option<Vec<u8>>>;
    fn request_header(&self, name: &str) -> HostResult<Option<String>>;
    fn remove_request_header(&mut self, name: &str) -> HostResult<()>;
    fn set_request_header(&mut self, name: &str, value: &str) -> HostResult<()>;
    fn add_response_header(&mut self, name: &str, value: &str) -> HostResult<()>;
    fn request_body(&self, start: usize, len: usize) -> HostResult<Vec<u8>>;
    fn resume_request(&mut self) -> HostResult<()>;
    fn send_local_response(&mut self, status: u32, details: &str, body: &[u8]) -> HostResult<()>;
    fn set_effective_context(&mut self, context_id: u32) -> HostResult<()>;
    fn define_metric(&mut self, kind: MetricType, name: &str) -> HostResult<u32>;
    fn increment_metric(&mut self, id: u32, delta: i64) -> HostResult<()>;

    // Standard ABI, used by endpoint_metrics (scraping, per-proxy state) and the Envoy build.
    /// Process-wide shared data: value and CAS, `None` when the key does not exist.
    fn shared_get(&self, key: &str) -> HostResult<Option<(Vec<u8>, u32)>>;
    /// Writes `value`; `cas` 0 = unconditionally, else it must match (status 8 otherwise).
    fn shared_set(&mut self, key: &str, value: &[u8], cas: u32) -> HostResult<()>;
    /// Root context only: calls `on_tick` every `ms` milliseconds (0 = off).
    fn set_tick_period(&mut self, ms: u32) -> HostResult<()>;
    /// An HTTP callout from the root context; the token comes back in `on_http_call_response`.
    fn http_call(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout_ms: u32,
    ) -> HostResult<u32>;
    /// During `on_http_call_response`: the `:status` of the response, if any.
    fn http_call_status(&self) -> HostResult<Option<u16>>;
    /// During `on_http_call_response`: up to `max` bytes of the response body.
    fn http_call_body(&self, size: usize) -> HostResult<Vec<u8>>;

    // Higress extensions (design §1). The Envoy build answers `UNSUPPORTED`.
    fn upstream_hosts(&self) -> HostResult<Vec<u8>>;
    fn set_upstream_override_host(&mut self, address: &str) -> HostResult<()>;
    fn redis_init(
        &mut self,
        cluster: &str,
        user: &str,
        password: &str,
        timeout_ms: u32,
    ) -> HostResult<()>;
    fn redis_call(&mut self, cluster: &str, query: &[u8]) -> HostResult<u32>;
    /// The reply of the Redis callback being delivered (buffer type 9).
    fn redis_reply(&self, size: usize) -> HostResult<Vec<u8>>;
}
