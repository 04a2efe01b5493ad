//! Everything the plugin asks of the host goes through [`Host`]. The wasm glue crate implements
//! it (the only code that touches FFI); tests drive the same logic with [`mock::MockHost`]. Every call returns a `Result`: the SDK's own wrappers panic on
//! unexpected statuses, and a panic kills the worker's VM.

pub mod pairs;

#[cfg(test)]
pub mod mock;

use std::fmt;

/// Log levels, in the host's order (proxy-wasm `LogLevel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
    Critical,
}

/// Metric kinds the host can define (proxy-wasm `MetricType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
}

/// Why a host call failed, in domain terms: the glue maps the ABI's status numbers to these
/// (docs/higress-abi.md, "Statuses"), so nothing above the glue compares numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostErrorKind {
    NotFound,
    /// Bad argument, or not available in this phase or on this host (e.g. an unknown Redis
    /// cluster while Envoy is still receiving clusters, a header write after routing).
    BadArgument,
    InvalidMemoryAccess,
    Empty,
    /// A shared-data write lost its compare-and-swap race.
    CasMismatch,
    InternalFailure,
    Unimplemented,
    /// A call this build does not have (Higress extensions in the Envoy build).
    Unsupported,
    /// A status the ABI does not define; kept for the log line only.
    Unknown(u32),
}

/// A host call that did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostError {
    pub call: &'static str,
    pub kind: HostErrorKind,
}

impl HostError {
    pub fn new(call: &'static str, kind: HostErrorKind) -> HostError {
        HostError { call, kind }
    }
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            HostErrorKind::NotFound => "not found".to_string(),
            HostErrorKind::BadArgument => "bad argument / not available here".to_string(),
            HostErrorKind::InvalidMemoryAccess => "invalid memory access".to_string(),
            HostErrorKind::Empty => "empty".to_string(),
            HostErrorKind::CasMismatch => "cas mismatch".to_string(),
            HostErrorKind::InternalFailure => "internal failure".to_string(),
            HostErrorKind::Unimplemented => "unimplemented".to_string(),
            HostErrorKind::Unsupported => "not supported by this build".to_string(),
            HostErrorKind::Unknown(s) => format!("status {s}"),
        };
        write!(f, "{} failed: {what}", self.call)
    }
}

pub type HostResult<T> = Result<T, HostError>;

/// The host operations the plugin uses. Stream operations act on the current (or effective)
/// HTTP context.
pub trait Host {
    fn log(&self, level: LogLevel, message: &str);
    fn now_ms(&self) -> u64;
    /// The same clock in µs (the latency models time first tokens that come in a millisecond).
    fn now_us(&self) -> u64 {
        self.now_ms().saturating_mul(1000)
    }
    fn property(&self, path: &[&str]) -> HostResult<Option<Vec<u8>>>;
    fn request_header(&self, name: &str) -> HostResult<Option<String>>;
    /// A request header's raw bytes (hashing must not depend on UTF-8 validity).
    fn request_header_bytes(&self, name: &str) -> HostResult<Option<Vec<u8>>> {
        self.request_header(name).map(|v| v.map(String::into_bytes))
    }
    /// Every request header in the pairs encoding ([`pairs`]): one host call, where looking up
    /// several names that are usually absent costs one each (the agent session headers,
    /// balancer/policies/session.rs).
    fn request_header_map(&self) -> HostResult<Vec<u8>>;
    fn remove_request_header(&mut self, name: &str) -> HostResult<()>;
    fn set_request_header(&mut self, name: &str, value: &str) -> HostResult<()>;
    fn add_response_header(&mut self, name: &str, value: &str) -> HostResult<()>;
    /// In the response phases: the response's `:status` header, raw bytes (cluster_metrics'
    /// success; bytes, so reading it runs no UTF-8 conversion). The only response header
    /// read, so the host names it itself (`src/wasm_host.rs` says why).
    fn response_status(&self) -> HostResult<Option<Vec<u8>>>;
    fn request_body(&self, start: usize, len: usize) -> HostResult<Vec<u8>>;
    /// In the response phases: a response header's raw bytes (prefix_cache reads
    /// `content-type` and `content-encoding` before it edits a stream, balancer/verify.rs).
    fn response_header_bytes(&self, _name: &str) -> HostResult<Option<Vec<u8>>> {
        Err(HostError::new("get_header", HostErrorKind::Unsupported))
    }
    /// Replaces the buffered request body (prefix_cache's `include_usage`, core/src/verify/inject.rs).
    fn set_request_body(&mut self, _body: &[u8]) -> HostResult<()> {
        Err(HostError::new(
            "set_request_body",
            HostErrorKind::Unsupported,
        ))
    }
    /// In a response-body callback: bytes of the current chunk.
    fn response_body(&self, _start: usize, _len: usize) -> HostResult<Vec<u8>> {
        Err(HostError::new("response_body", HostErrorKind::Unsupported))
    }
    /// In a response-body callback: replaces the current chunk.
    fn set_response_body(&mut self, _body: &[u8]) -> HostResult<()> {
        Err(HostError::new(
            "set_response_body",
            HostErrorKind::Unsupported,
        ))
    }
    fn resume_request(&mut self) -> HostResult<()>;
    /// Resumes the response of the effective context, held at its last body chunk.
    fn resume_response(&mut self) -> HostResult<()> {
        Err(HostError::new(
            "continue_stream",
            HostErrorKind::Unsupported,
        ))
    }
    /// `headers` ride along besides `content-type: text/plain` (e.g. `retry-after`).
    fn send_local_response(
        &mut self,
        status: u32,
        details: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> HostResult<()>;
    fn set_effective_context(&mut self, context_id: u32) -> HostResult<()>;
    fn define_metric(&mut self, kind: MetricType, name: &str) -> HostResult<u32>;
    fn increment_metric(&mut self, id: u32, delta: i64) -> HostResult<()>;

    // Standard ABI, used by endpoint_metrics (scraping, per-proxy state) and the Envoy build.
    /// Process-wide shared data: value and CAS, `None` when the key does not exist.
    fn shared_get(&self, key: &str) -> HostResult<Option<(Vec<u8>, u32)>>;
    /// Writes `value`; `cas` 0 = unconditionally, else it must match ([`HostErrorKind::CasMismatch`] otherwise).
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

    // Higress extensions (docs/higress-abi.md §3). The Envoy build answers
    // [`HostErrorKind::Unsupported`].
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

/// A host property read as UTF-8 text (`route_name`, `cluster_name`); None when absent, not
/// text, or unreadable.
pub fn text_property(host: &dyn Host, name: &str) -> Option<String> {
    host.property(&[name])
        .ok()
        .flatten()
        .and_then(|b| String::from_utf8(b).ok())
}
