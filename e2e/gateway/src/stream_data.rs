//! Host-side records the host calls read and write: per-stream data, plugin signals,
//! queued Redis/HTTP callouts and their results.

use crate::config::{RouteCfg, RouteTarget};
use std::cell::RefCell;
use std::rc::Rc;
use tokio::sync::Notify;

pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// `list` as [`Pairs`], for driving a VM in process (tests).
pub fn pairs(list: &[(&str, &str)]) -> Pairs {
    list.iter()
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

/// A local reply requested by `proxy_send_local_response`.
#[derive(Clone, Debug)]
pub struct LocalReply {
    pub status: u16,
    pub details: String,
    pub body: Vec<u8>,
    pub headers: Pairs,
}

/// What the plugin asked for on a stream. Host calls only set these flags; the stream task
/// acts on them after the VM call returns, which gives Envoy's "after VM call action" order.
#[derive(Default, Debug)]
pub struct Signals {
    pub resume_request: bool,
    pub resume_response: bool,
    pub local_reply: Option<LocalReply>,
    pub close: bool,
    /// The VM died (a trap in any callback): set by the host on every live stream of that VM
    /// and never taken, so a stream paused on a callout is failed or passed at once.
    pub vm_failed: bool,
}

#[derive(Default)]
pub struct StreamSignals {
    pub flags: RefCell<Signals>,
    pub notify: Notify,
}

impl StreamSignals {
    /// The pending requests, cleared; `vm_failed` stays set.
    pub fn take(&self) -> Signals {
        let mut flags = self.flags.borrow_mut();
        let out = std::mem::take(&mut *flags);
        flags.vm_failed = out.vm_failed;
        out
    }

    pub fn vm_failed(&self) -> bool {
        self.flags.borrow().vm_failed
    }

    /// Marks the stream's VM dead and wakes the stream task.
    pub fn fail_vm(&self) {
        self.flags.borrow_mut().vm_failed = true;
        self.notify.notify_one();
    }
}

/// Host-side data of one HTTP stream context.
pub struct StreamData {
    pub req_headers: Pairs,
    pub req_trailers: Pairs,
    pub resp_headers: Pairs,
    pub resp_trailers: Pairs,
    /// The request body a host call reads and writes: the chunk of a body callback and, while
    /// the plugin holds a buffered body (its last body callback answered StopIteration), that
    /// body, as Envoy's `decodingBuffer()` is then reachable from any callback of the stream.
    pub req_body: Vec<u8>,
    /// A host call replaced `req_body` (`proxy_set_buffer_bytes`): outside a body callback, the
    /// held body is that replacement from then on.
    pub req_body_set: bool,
    pub resp_body: Vec<u8>,
    pub override_host: Option<String>,
    /// Set once the request headers went to the router; a later override is ignored.
    pub headers_released: bool,
    pub route_name: Option<String>,
    /// The route's one cluster (a `cluster` route).
    pub cluster_name: Option<String>,
    /// A `cluster_header` route's header: its current value names the cluster.
    pub cluster_header: Option<String>,
    /// The host of the router's latest try (property `upstream.address`): set when each try
    /// starts, so once the response is in, the host that served it (Envoy's
    /// `upstreamInfo().upstreamHost()`, updated by every retry).
    pub upstream_host: Option<String>,
    pub signals: Rc<StreamSignals>,
}

impl StreamData {
    pub fn new(req_headers: Pairs, route: Option<&RouteCfg>) -> StreamData {
        let route_name = route.map(|r| r.name.clone());
        let (cluster_name, cluster_header) = match route.map(RouteCfg::target) {
            Some(RouteTarget::Cluster(c)) => (Some(c.to_string()), None),
            Some(RouteTarget::Header(h)) => (None, Some(h.to_string())),
            None => (None, None),
        };
        StreamData {
            req_headers,
            req_trailers: Vec::new(),
            resp_headers: Vec::new(),
            resp_trailers: Vec::new(),
            req_body: Vec::new(),
            req_body_set: false,
            resp_body: Vec::new(),
            override_host: None,
            headers_released: false,
            route_name,
            cluster_name,
            cluster_header,
            upstream_host: None,
            signals: Rc::new(StreamSignals::default()),
        }
    }
}

impl StreamData {
    /// The cluster the `cluster_name` property and `proxy_get_upstream_hosts` report. For a
    /// `cluster_header` route it follows the header as it is now: Higress clears the route
    /// cache when a filter changes a request header, so the route's cluster is re-resolved
    /// from the new value (docs/higress-abi.md §9); absent, Envoy's dynamic route entry names
    /// the cluster "".
    pub fn current_cluster(&self) -> Option<String> {
        match &self.cluster_header {
            None => self.cluster_name.clone(),
            Some(h) => Some(
                self.req_headers
                    .iter()
                    .find(|(k, _)| k.as_slice() == h.as_bytes())
                    .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_default(),
            ),
        }
    }
}

/// A Redis command queued by `proxy_redis_call`, sent by the worker after the VM call.
pub struct RedisOut {
    pub cluster: String,
    pub token: u32,
    pub query: Vec<u8>,
}

/// Per-cluster settings from `proxy_redis_init` (last init wins, as with Envoy's shared client).
#[derive(Clone, Debug, PartialEq)]
pub struct RedisInit {
    pub username: String,
    pub password: String,
    pub timeout_ms: u64,
    pub db: Option<u32>,
    pub flush_timeout_ms: u64,
    pub flush_size: usize,
}

impl Default for RedisInit {
    fn default() -> Self {
        RedisInit {
            username: String::new(),
            password: String::new(),
            timeout_ms: 1000,
            db: None,
            flush_timeout_ms: 3,
            flush_size: 1024,
        }
    }
}

/// An HTTP callout queued by `proxy_http_call`.
pub struct HttpOut {
    pub context_id: u32,
    pub token: u32,
    pub cluster: String,
    pub headers: Pairs,
    pub body: Vec<u8>,
    pub timeout_ms: u64,
}

/// Response of an HTTP callout, readable during `proxy_on_http_call_response`.
#[derive(Default)]
pub struct HttpCallResp {
    pub headers: Pairs,
    pub body: Vec<u8>,
    pub trailers: Pairs,
}
