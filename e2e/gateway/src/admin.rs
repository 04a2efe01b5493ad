//! Admin HTTP server and active health checks, on their own thread so they never compete
//! with a worker's event loop.

use crate::health::Health;
use crate::shared::{MetricKind, Shared};
use crate::upstream::ChanBody;
use anyhow::Result;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// Envoy's cap on a stored health-check body (`StoreMetricsResponseBodyLimit`).
const METRICS_CAP: usize = 64 * 1024;

/// Serves until `stopped` reports the gateway dropped.
pub fn spawn(
    shared: Arc<Shared>,
    listener: std::net::TcpListener,
    mut stopped: tokio::sync::watch::Receiver<()>,
) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("admin".into())
        .spawn(move || {
            rt.block_on(async move {
                start_health_checks(&shared);
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                loop {
                    let accepted = tokio::select! {
                        _ = stopped.changed() => return,
                        a = listener.accept() => a,
                    };
                    let Ok((sock, _)) = accepted else {
                        continue;
                    };
                    let shared = shared.clone();
                    tokio::spawn(async move {
                        let svc = service_fn(move |req| {
                            let shared = shared.clone();
                            async move { Ok::<_, hyper::Error>(route(&shared, req)) }
                        });
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(sock), svc)
                            .await;
                    });
                }
            })
        })?;
    Ok(())
}

fn reply(code: u16, ctype: &str, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .header("content-type", ctype)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_default()
}

fn query_param(q: &str, key: &str) -> Option<String> {
    q.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn route(shared: &Shared, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let q = req.uri().query().unwrap_or("").to_string();
    match (req.method().as_str(), req.uri().path()) {
        (_, "/ready") => reply(200, "text/plain", "LIVE\n".into()),
        ("GET", "/stats") => reply(200, "text/plain", stats(shared)),
        ("GET", "/admin/upstreams") => reply(200, "application/json", upstreams_json(shared)),
        ("POST", "/admin/reset_peaks") => {
            for c in shared.clusters.values() {
                for e in &c.endpoints {
                    e.peak_active.store(e.active.load(Relaxed), Relaxed);
                }
            }
            reply(200, "text/plain", "OK\n".into())
        }
        ("POST", "/admin/health") => {
            let (Some(c), Some(a), Some(s)) = (
                query_param(&q, "cluster"),
                query_param(&q, "address"),
                query_param(&q, "status"),
            ) else {
                return reply(400, "text/plain", "need cluster, address, status\n".into());
            };
            let Ok(h) = Health::parse(&s) else {
                return reply(400, "text/plain", "bad status\n".into());
            };
            match shared.clusters.get(&c).and_then(|cl| cl.find(&a)) {
                Some(e) => {
                    e.set_health(h);
                    reply(200, "text/plain", "OK\n".into())
                }
                None => reply(404, "text/plain", "no such endpoint\n".into()),
            }
        }
        _ => reply(404, "text/plain", "not found\n".into()),
    }
}

fn stats(shared: &Shared) -> String {
    let mut out = String::new();
    let c = &shared.counters;
    let id = &shared.cfg.gateway_id;
    for (k, v) in [
        ("requests_total", c.requests.load(Relaxed)),
        ("local_replies", c.local_replies.load(Relaxed)),
        (
            "upstream_connect_failures",
            c.upstream_5xx_local.load(Relaxed),
        ),
        ("upstream_rq_retry", c.upstream_rq_retry.load(Relaxed)),
        (
            "upstream_rq_retry_success",
            c.upstream_rq_retry_success.load(Relaxed),
        ),
        (
            "upstream_rq_retry_limit_exceeded",
            c.upstream_rq_retry_limit_exceeded.load(Relaxed),
        ),
        ("client_aborts", c.client_aborts.load(Relaxed)),
        ("cluster_not_found", c.cluster_not_found.load(Relaxed)),
        ("streams_destroyed", c.streams_destroyed.load(Relaxed)),
        ("redis_calls", c.redis_calls.load(Relaxed)),
        ("redis_failures", c.redis_failures.load(Relaxed)),
        ("vm_traps", c.vm_traps.load(Relaxed)),
        ("vm_reloads", c.vm_reloads.load(Relaxed)),
        ("vm_call_ns", c.vm_call_ns.load(Relaxed)),
        ("vm_call_cpu_ns", c.vm_call_cpu_ns.load(Relaxed)),
        ("vm_calls", c.vm_calls.load(Relaxed)),
    ] {
        out.push_str(&format!("gateway.{k} {v}\n"));
    }
    out.push_str(&format!("gateway.id {id}\n"));
    if let Some(i) = crate::instrument::get() {
        out.push_str(&i.stats_lines());
    }
    for m in shared
        .metrics
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
    {
        match m.kind {
            MetricKind::Histogram => {
                out.push_str(&format!("{}.count {}\n", m.name, m.count.load(Relaxed)));
                out.push_str(&format!("{}.sum {}\n", m.name, m.value.load(Relaxed)));
            }
            _ => out.push_str(&format!("{} {}\n", m.name, m.value.load(Relaxed))),
        }
    }
    out
}

fn upstreams_json(shared: &Shared) -> String {
    let mut list = Vec::new();
    let mut names: Vec<&String> = shared.clusters.keys().collect();
    names.sort();
    for n in names {
        let c = &shared.clusters[n];
        let dynamic: Vec<_> = c
            .dynamic
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        for e in c.endpoints.iter().chain(dynamic.iter()) {
            list.push(serde_json::json!({
                "gateway_id": shared.cfg.gateway_id,
                "cluster": n,
                "address": e.address,
                "health": e.health().as_str(),
                "requests_total": e.requests_total.load(Relaxed),
                "active": e.active.load(Relaxed),
                "peak_active": e.peak_active.load(Relaxed),
            }));
        }
    }
    serde_json::Value::Array(list).to_string()
}

fn start_health_checks(shared: &Arc<Shared>) {
    let client: Client<HttpConnector, ChanBody> =
        Client::builder(TokioExecutor::new()).build_http();
    for c in shared.clusters.values() {
        let Some(hc) = c.cfg.health_check.clone() else {
            continue;
        };
        for e in c.endpoints.clone() {
            let (client, hc) = (client.clone(), hc.clone());
            tokio::spawn(async move {
                let (mut ok_run, mut fail_run) = (0u32, 0u32);
                let mut iv = tokio::time::interval(Duration::from_millis(hc.interval_ms.max(10)));
                loop {
                    iv.tick().await;
                    let uri = format!("http://{}{}", e.address, hc.path);
                    let Ok(req) = Request::get(uri).body(ChanBody::full(Bytes::new())) else {
                        return;
                    };
                    let probe = async {
                        let r = client.request(req).await.map_err(|e| e.to_string())?;
                        let good = r.status().is_success();
                        let status = r.status();
                        let body = r.into_body().collect().await.map_err(|e| e.to_string())?;
                        Ok((good, status, body.to_bytes()))
                    };
                    let res =
                        tokio::time::timeout(Duration::from_millis(hc.timeout_ms), probe).await;
                    let res = match res {
                        Ok(Ok((true, _, body))) => Ok(body),
                        Ok(Ok((false, status, _))) => Err(format!("status {status}")),
                        Ok(Err(e)) => Err(e),
                        Err(_) => Err(format!("no answer in {} ms", hc.timeout_ms)),
                    };
                    match res {
                        Ok(body) => {
                            fail_run = 0;
                            ok_run += 1;
                            if hc.store_metrics {
                                let cut = &body[..body.len().min(METRICS_CAP)];
                                *e.hc_metrics.lock().unwrap_or_else(|p| p.into_inner()) =
                                    Some(String::from_utf8_lossy(cut).into_owned());
                            }
                            if ok_run >= hc.healthy_threshold && e.health() == Health::Unhealthy {
                                e.set_health(Health::Healthy);
                                eprintln!("health check: {} is healthy", e.address);
                            }
                        }
                        Err(why) => {
                            ok_run = 0;
                            fail_run += 1;
                            // A transition is printed with its cause: a test that sees a pod
                            // leave the healthy set unexpectedly reads why in the gateway log.
                            if fail_run >= hc.unhealthy_threshold && e.health() != Health::Unhealthy
                            {
                                e.set_health(Health::Unhealthy);
                                eprintln!("health check: {} is unhealthy: {why}", e.address);
                            }
                        }
                    }
                }
            });
        }
    }
}
