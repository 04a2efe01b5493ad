//! Per-worker upstream side: one pooled hyper client per cluster (Envoy keeps connection
//! pools per worker), the cluster load balancers, route matching and the channel body type.

use crate::config::{ClusterType, LbPolicy, RouteCfg, RouteTarget};
use crate::health::Health;
use crate::shared::{Cluster, Endpoint, Shared};
use crate::stream_data::Pairs;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::cell::RefCell;
use std::collections::HashMap;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;

pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// What an upstream request gives: the response, a client error, or the route timeout.
pub type UpstreamResult = Result<
    Result<hyper::Response<hyper::body::Incoming>, hyper_util::client::legacy::Error>,
    tokio::time::error::Elapsed,
>;

/// Returning this makes hyper drop the connection (a stream reset from the client's view).
#[derive(Debug)]
pub struct Reset(pub &'static str);
impl std::fmt::Display for Reset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}
impl std::error::Error for Reset {}

/// A body fed from a channel (plus optional first chunk); `len` makes it Content-Length.
pub struct ChanBody {
    first: Option<Bytes>,
    rx: Option<mpsc::UnboundedReceiver<Result<Frame<Bytes>, BodyError>>>,
    len: Option<u64>,
}

impl ChanBody {
    pub fn full(b: Bytes) -> ChanBody {
        let len = Some(b.len() as u64);
        ChanBody {
            first: if b.is_empty() { None } else { Some(b) },
            rx: None,
            len,
        }
    }
    pub fn channel() -> (
        mpsc::UnboundedSender<Result<Frame<Bytes>, BodyError>>,
        ChanBody,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            tx,
            ChanBody {
                first: None,
                rx: Some(rx),
                len: None,
            },
        )
    }
}

impl Body for ChanBody {
    type Data = Bytes;
    type Error = BodyError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if let Some(b) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        match self.rx.as_mut() {
            Some(rx) => rx.poll_recv(cx),
            None => Poll::Ready(None),
        }
    }
    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rx.is_none()
    }
    fn size_hint(&self) -> SizeHint {
        match self.len {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

pub type HttpClient = Client<HttpConnector, ChanBody>;

/// What a try holds on its endpoint until it ends (for a response, until its body did): the
/// endpoint's active count and the worker's count for least_request.
pub type Guards = (crate::shared::ActiveGuard, LocalActive);

/// Decrements the per-worker active count used by least_request.
pub struct LocalActive(Rc<RefCell<HashMap<String, i64>>>, String);
impl Drop for LocalActive {
    fn drop(&mut self) {
        if let Some(v) = self.0.borrow_mut().get_mut(&self.1) {
            *v -= 1;
        }
    }
}

pub struct Upstreams {
    shared: Arc<Shared>,
    clients: HashMap<String, HttpClient>,
    rr: RefCell<HashMap<String, usize>>,
    active: Rc<RefCell<HashMap<String, i64>>>,
}

impl Upstreams {
    pub fn new(shared: Arc<Shared>) -> Upstreams {
        let mut clients = HashMap::new();
        for (name, c) in &shared.clusters {
            let mut conn = HttpConnector::new();
            conn.set_nodelay(true);
            conn.set_connect_timeout(Some(Duration::from_millis(c.cfg.connect_timeout_ms)));
            let client = Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(60))
                .build(conn);
            clients.insert(name.clone(), client);
        }
        Upstreams {
            shared,
            clients,
            rr: RefCell::new(HashMap::new()),
            active: Rc::new(RefCell::new(HashMap::new())),
        }
    }

    pub fn client(&self, cluster: &str) -> Option<&HttpClient> {
        self.clients.get(cluster)
    }

    pub fn cluster(&self, name: &str) -> Option<Arc<Cluster>> {
        self.shared.clusters.get(name).cloned()
    }

    pub fn local_active(&self, addr: &str) -> LocalActive {
        *self
            .active
            .borrow_mut()
            .entry(addr.to_string())
            .or_insert(0) += 1;
        LocalActive(self.active.clone(), addr.to_string())
    }

    /// Choose the endpoint of a try. The override wins only if it names a member of the
    /// cluster whose health is Healthy or Degraded (Envoy's default `override_host_status`);
    /// otherwise the cluster's own LB runs, over the hosts not in `tried` while any is left
    /// (a retry: Envoy's `previous_hosts` predicate, retry.rs).
    pub fn pick(
        &self,
        cluster: &Cluster,
        override_host: Option<&str>,
        original_dst: Option<&str>,
        tried: &[String],
    ) -> Option<Arc<Endpoint>> {
        if cluster.cfg.kind == ClusterType::OriginalDst {
            return original_dst.map(|a| cluster.dynamic_endpoint(a));
        }
        if let Some(o) = override_host {
            if let Some(e) = cluster.find(o) {
                if e.health() != Health::Unhealthy {
                    return Some(e);
                }
            }
        }
        let healthy: Vec<&Arc<Endpoint>> = cluster
            .endpoints
            .iter()
            .filter(|e| e.health() != Health::Unhealthy)
            .collect();
        // Envoy's panic mode: with no healthy host, balance over all hosts.
        let mut cands: Vec<&Arc<Endpoint>> = if healthy.is_empty() {
            cluster.endpoints.iter().collect()
        } else {
            healthy
        };
        if cands.iter().any(|e| !tried.contains(&e.address)) {
            cands.retain(|e| !tried.contains(&e.address));
        }
        if cands.is_empty() {
            return None;
        }
        let i = match cluster.cfg.lb_policy {
            LbPolicy::RoundRobin => {
                let mut rr = self.rr.borrow_mut();
                let n = rr.entry(cluster.cfg.name.clone()).or_insert(0);
                *n = n.wrapping_add(1);
                *n % cands.len()
            }
            LbPolicy::Random => rand::random_range(0..cands.len()),
            LbPolicy::LeastRequest => {
                let a = rand::random_range(0..cands.len());
                let b = rand::random_range(0..cands.len());
                let act = self.active.borrow();
                let load = |i: usize| act.get(&cands[i].address).copied().unwrap_or(0);
                if load(b) < load(a) {
                    b
                } else {
                    a
                }
            }
        };
        Some(cands[i].clone())
    }
}

/// First route whose matcher accepts `path`.
pub fn match_route<'a>(routes: &'a [RouteCfg], path: &str) -> Option<&'a RouteCfg> {
    let p = path.split('?').next().unwrap_or(path);
    routes
        .iter()
        .find(|r| match (&r.matcher.exact, &r.matcher.prefix) {
            (Some(e), _) => p == e,
            (None, Some(pre)) => p.starts_with(pre.as_str()),
            (None, None) => true,
        })
}

/// The cluster name `route` sends a request with `headers` to. A `cluster_header` route reads
/// the header's first value as Envoy's router does; `None` when the header is absent (Envoy
/// then looks up the cluster "" and, like for a name it does not know, answers 503).
pub fn route_cluster(route: &RouteCfg, headers: &Pairs) -> Option<String> {
    match route.target() {
        RouteTarget::Cluster(c) => Some(c.to_string()),
        RouteTarget::Header(h) => headers
            .iter()
            .find(|(k, _)| k.as_slice() == h.as_bytes())
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned()),
    }
}

/// Hop-by-hop and framing headers are not forwarded; hyper re-frames the body.
pub fn is_hop_header(name: &[u8]) -> bool {
    matches!(
        name,
        b"connection"
            | b"keep-alive"
            | b"proxy-connection"
            | b"transfer-encoding"
            | b"upgrade"
            | b"te"
            | b"trailer"
            | b"content-length"
    )
}
