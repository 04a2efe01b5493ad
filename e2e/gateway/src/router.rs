//! The router of one stream, once the filters released the request: its route's cluster, the
//! host of each try and the tries themselves, retried as the route's `retry_policy` says
//! (retry_policy.rs), as Higress's Envoy 1.27 router does:
//! - the first try goes to the plugin's override host (if usable, upstream.rs `pick`); a retry
//!   ignores it (the router returns no override once `is_retry_` is set, ENV27
//!   router.h:499-504, docs/higress-abi.md §8) and runs the cluster's own LB over the hosts not
//!   tried yet while one is left (the `previous_hosts` predicate, always applied);
//! - a retried try's response is dropped here: the plugin's response phase sees only the last
//!   try's response, or the router's 503 / 504 when no try answered (response.rs);
//! - each try holds its host's active counts while it runs, and the last one until the response
//!   body ended; `upstream.address` names the host of the latest try;
//! - the cluster's `timeout_ms` is the route timeout, over all tries (no retry after it), and
//!   `per_try_timeout_ms` bounds each try (a retriable failure); retries wait Envoy's default
//!   jittered back-off.

use crate::retry_policy::{back_off, RetryPolicy, TryOutcome};
use crate::shared::{Cluster, Endpoint};
use crate::stream_data::Pairs;
use crate::upstream::{is_hop_header, match_route, route_cluster, ChanBody, Guards};
use crate::upstream::{BodyError, HttpClient, UpstreamResult};
use crate::worker::Worker;
use bytes::Bytes;
use http_body::Frame;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;

/// What the router's tries leave the response phase: the last try's result and, while its
/// response is being read, what it holds on its host.
pub struct Tried {
    pub res: UpstreamResult,
    pub guards: Option<Guards>,
}

pub struct Upstream {
    pub fut: Pin<Box<dyn Future<Output = Tried>>>,
    /// A body still arriving goes on through this (a request without a retry policy, or one
    /// whose body was too large to keep).
    pub body_tx: Option<UnboundedSender<Result<Frame<Bytes>, BodyError>>>,
}

fn header<'a>(h: &'a Pairs, name: &[u8]) -> Option<&'a [u8]> {
    h.iter().find(|(k, _)| k == name).map(|(_, v)| &v[..])
}

/// Whether the route the released headers match has a retry policy: the stream then keeps the
/// request body whole before the first try (the emulator's way of having it for a retry: Envoy
/// streams the first try while it buffers a copy, up to the buffer limit), so the first try
/// starts, and its host is picked, when the body is complete. The override is still the one
/// set while the headers were held.
pub fn keeps_body(w: &Worker, headers: &Pairs) -> bool {
    let path = header(headers, b":path").map(String::from_utf8_lossy);
    let route = match_route(&w.shared.cfg.routes, path.as_deref().unwrap_or("/"));
    route.is_some_and(|r| r.retry_policy.is_some())
}

/// What every try of the request sends.
struct Sender {
    w: Rc<Worker>,
    ctx: u32,
    cluster: Arc<Cluster>,
    client: HttpClient,
    /// Method, path and headers of the request, without a host to send it to.
    head: hyper::Request<()>,
    path: String,
    original_dst: Option<String>,
}

impl Sender {
    /// The request to `ep`; None if its address makes no URI.
    fn to(&self, ep: &Endpoint, body: ChanBody) -> Option<hyper::Request<ChanBody>> {
        let uri = format!("http://{}{}", ep.address, self.path).parse().ok()?;
        let mut req = hyper::Request::new(body);
        *req.method_mut() = self.head.method().clone();
        *req.uri_mut() = uri;
        *req.headers_mut() = self.head.headers().clone();
        Some(req)
    }

    /// Sends a try to `ep`, answered by `deadline`: `ep` holds it from now and
    /// `upstream.address` names `ep`.
    fn send(
        &self,
        ep: &Arc<Endpoint>,
        req: hyper::Request<ChanBody>,
        deadline: Instant,
    ) -> (impl Future<Output = UpstreamResult>, Guards) {
        self.w
            .with_stream(self.ctx, |s| s.upstream_host = Some(ep.address.clone()));
        let guards = (
            ep.begin_request(),
            self.w.upstreams.local_active(&ep.address),
        );
        let fut = tokio::time::timeout_at(deadline, self.client.request(req));
        (fut, guards)
    }
}

/// Headers released to the router, the body with them if it is complete (`full_body`): route,
/// cluster, the first try's host (override or LB), then the tries; retried when the route has
/// a retry policy and the stream kept the body for it (`kept`, [`keeps_body`]).
pub fn start_upstream(
    w: &Rc<Worker>,
    ctx: u32,
    headers: &Pairs,
    full_body: Option<Vec<u8>>,
    kept: bool,
) -> Result<Upstream, (u16, String)> {
    let path = header(headers, b":path").map(|p| String::from_utf8_lossy(p).into_owned());
    let path = path.unwrap_or_else(|| "/".into());
    let Some(route) = match_route(&w.shared.cfg.routes, &path) else {
        return Err((404, "route not found".into()));
    };
    // Envoy's router: a cluster name it does not know (or none, for a `cluster_header` route
    // without the header) is `cluster_not_found_response_code`, 503 by default, with an
    // empty body (response flag NC); Envoy 1.40 answers so for both.
    let cluster = route_cluster(route, headers)
        .and_then(|name| w.upstreams.cluster(&name).map(|c| (name, c)));
    let Some((cluster_name, cluster)) = cluster else {
        w.shared.counters.cluster_not_found.fetch_add(1, Relaxed);
        return Err((503, String::new()));
    };
    let ovr = w.with_stream(ctx, |s| s.override_host.clone()).flatten();
    let original_dst = header(headers, b"x-envoy-original-dst-host")
        .map(|v| String::from_utf8_lossy(v).into_owned());
    let ep = w
        .upstreams
        .pick(&cluster, ovr.as_deref(), original_dst.as_deref(), &[])
        .ok_or((503, "no healthy upstream".to_string()))?;
    let method = header(headers, b":method").unwrap_or(b"GET");
    let mut b = hyper::Request::builder()
        .method(hyper::Method::from_bytes(method).map_err(|_| (400, "bad method".to_string()))?);
    if let Some(a) = header(headers, b":authority") {
        b = b.header("host", a);
    }
    for (k, v) in headers {
        if !k.starts_with(b":") && !is_hop_header(k) && k != b"host" {
            b = b.header(&k[..], &v[..]);
        }
    }
    let head = b.body(()).map_err(|e| (400, format!("bad request: {e}")))?;
    let client = w
        .upstreams
        .client(&cluster_name)
        .ok_or((503, "no cluster".to_string()))?
        .clone();
    let timeout = Duration::from_millis(cluster.cfg.timeout_ms);
    let sender = Sender {
        w: w.clone(),
        ctx,
        cluster,
        client,
        head,
        path,
        original_dst,
    };
    let bad_uri = || (400, "bad request: uri".to_string());
    // A complete body is attached whole so it goes out with Content-Length.
    let (body, body_tx) = match full_body {
        Some(b) => {
            let b = Bytes::from(b);
            if let Some(policy) = route.retry_policy.clone().filter(|_| kept) {
                let fut = with_retries(sender, policy, ep, b, timeout).ok_or_else(bad_uri)?;
                return Ok(Upstream { fut, body_tx: None });
            }
            (ChanBody::full(b), None)
        }
        None => {
            let (tx, body) = ChanBody::channel();
            (body, Some(tx))
        }
    };
    let req = sender.to(&ep, body).ok_or_else(bad_uri)?;
    let (fut, guards) = sender.send(&ep, req, Instant::now() + timeout);
    let fut = Box::pin(async move {
        let res = fut.await;
        Tried {
            res,
            guards: Some(guards),
        }
    });
    Ok(Upstream { fut, body_tx })
}

/// How a try ended, for the policy; None for the route timeout (never retried).
fn outcome(res: &UpstreamResult, per_try_deadline: bool) -> Option<TryOutcome> {
    match res {
        Ok(Ok(r)) => Some(TryOutcome::Status(r.status().as_u16())),
        Ok(Err(e)) if e.is_connect() => Some(TryOutcome::ConnectFailure),
        Ok(Err(_)) => Some(TryOutcome::Reset),
        Err(_) => per_try_deadline.then_some(TryOutcome::PerTryTimeout),
    }
}

/// The tries of a request whose body is kept (`body`): the first on `first`, then as many
/// retries as `policy` asks for and allows, each on the LB's pick among the hosts not tried.
/// None if the first try's URI cannot be built.
fn with_retries(
    sender: Sender,
    policy: RetryPolicy,
    first: Arc<Endpoint>,
    body: Bytes,
    timeout: Duration,
) -> Option<Pin<Box<dyn Future<Output = Tried>>>> {
    let route_deadline = Instant::now() + timeout;
    let per_try = policy.per_try_timeout();
    let try_deadline = move || {
        let d = per_try.map(|t| Instant::now() + t);
        d.map_or(route_deadline, |d| d.min(route_deadline))
    };
    let mut deadline = try_deadline();
    let req = sender.to(&first, ChanBody::full(body.clone()))?;
    // The first try starts now, as a request without retries does: its host counts it at once.
    let (mut fut, mut guards) = sender.send(&first, req, deadline);
    let counters = sender.w.shared.clone();
    Some(Box::pin(async move {
        let mut tried = vec![first.address.clone()];
        let mut retries = 0;
        loop {
            let res = fut.await;
            let retriable =
                outcome(&res, deadline < route_deadline).is_some_and(|o| policy.retries(o));
            let c = &counters.counters;
            if !retriable || retries == policy.num_retries {
                if retriable {
                    c.upstream_rq_retry_limit_exceeded.fetch_add(1, Relaxed);
                } else if retries > 0 {
                    c.upstream_rq_retry_success.fetch_add(1, Relaxed);
                }
                return Tried {
                    res,
                    guards: Some(guards),
                };
            }
            // The try is over: its host's counts come back now; its response (if any) is
            // dropped below, unread, never shown to the plugin.
            drop(guards);
            retries += 1;
            c.upstream_rq_retry.fetch_add(1, Relaxed);
            let wait = back_off(retries);
            if Instant::now() + wait >= route_deadline {
                drop(res);
                // The route timeout fires during the back-off: the router's 504.
                let res = tokio::time::timeout_at(route_deadline, std::future::pending()).await;
                return Tried { res, guards: None };
            }
            tokio::time::sleep(wait).await;
            let (cluster, dst) = (&sender.cluster, sender.original_dst.as_deref());
            let next = sender.w.upstreams.pick(cluster, None, dst, &tried);
            let Some((ep, req)) = next.and_then(|ep| {
                let req = sender.to(&ep, ChanBody::full(body.clone()))?;
                Some((ep, req))
            }) else {
                // No host to retry on: the failed try's answer stands.
                return Tried { res, guards: None };
            };
            drop(res);
            if !tried.contains(&ep.address) {
                tried.push(ep.address.clone());
            }
            deadline = try_deadline();
            (fut, guards) = sender.send(&ep, req, deadline);
        }
    }))
}
