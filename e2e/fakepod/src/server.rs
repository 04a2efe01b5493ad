//! HTTP front of a fake pod: routing, fault injection and streaming (its handle: pod.rs).

use crate::body::{json_resp, respond, ChannelBody, RespBody};
use crate::config::{EngineKind, MetricsSource};
use crate::dp::Ranks;
use crate::engine::Engine;
use crate::fault::Fault;
use crate::generate::generate_pd;
use crate::metrics;
use crate::openai::{error_body, parse_request};
use crate::probe::probe_body;
use crate::rng::Rng;
use crate::tokenize::ApiKind;
use anyhow::Result;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::sleep;

/// How long `x-fake-fault: hang` holds a request (the connection is dropped afterwards).
const HANG_FOR: Duration = Duration::from_secs(3600);

pub(crate) struct Ctx {
    pub(crate) ranks: Arc<Ranks>,
    pub(crate) ids: AtomicU64,
    /// Generation requests received, numbering the `error_rate` draws.
    pub(crate) received: AtomicU64,
}

/// Returned by the service to make hyper drop the connection without a response.
#[derive(Debug)]
struct DropConnection;

impl std::fmt::Display for DropConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("fault injection: drop connection")
    }
}

impl std::error::Error for DropConnection {}

/// TCP stream that closes with RST (SO_LINGER 0) when a fault asked for a reset, so clients
/// see `connection reset` rather than a polite FIN.
struct FaultStream {
    inner: TcpStream,
    reset: Arc<AtomicBool>,
}

impl Drop for FaultStream {
    fn drop(&mut self) {
        if self.reset.load(Ordering::Relaxed) {
            let _ = self.inner.set_zero_linger();
        }
    }
}

impl AsyncRead for FaultStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for FaultStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

pub(crate) async fn serve_conn(stream: TcpStream, ctx: Arc<Ctx>) {
    let _ = stream.set_nodelay(true); // SSE chunks must leave at once for honest TTFT
    let reset = Arc::new(AtomicBool::new(false));
    let io = TokioIo::new(FaultStream {
        inner: stream,
        reset: reset.clone(),
    });
    let svc = hyper::service::service_fn(move |req| {
        let (ctx, reset) = (ctx.clone(), reset.clone());
        async move {
            let name = HeaderValue::from_str(&ctx.ranks.first().engine.cfg.name)
                .unwrap_or_else(|_| HeaderValue::from_static("invalid-name"));
            // Which endpoints the gateway listed (plain Envoy's override_host header), echoed
            // so a test sees where a retry was meant to go.
            let listed = req.headers().get("x-gateway-destination-endpoint").cloned();
            let mut resp = handle(req, &ctx, &reset).await?;
            resp.headers_mut().insert("x-pod", name);
            if let Some(listed) = listed {
                resp.headers_mut().insert("x-fake-listed", listed);
            }
            Ok::<_, DropConnection>(resp)
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(io, svc)
        .await;
}

async fn handle(
    req: Request<Incoming>,
    ctx: &Ctx,
    reset: &AtomicBool,
) -> Result<Response<RespBody>, DropConnection> {
    let ranks = &ctx.ranks;
    let engine = &ranks.first().engine;
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    // A gateway route may keep its own path prefix (`/<route>/v1/chat/completions`, the
    // Redis Cluster bed's many routes, e2e/suite/src/redis_cluster.rs): the API is what follows.
    let api = path.find("/v1/").map_or(path.as_str(), |i| &path[i..]);
    let kind = match (req.method(), path.as_str(), ApiKind::of_path(api)) {
        (&Method::POST, _, Some(kind)) => kind,
        (&Method::GET, "/metrics", _) => {
            let resp = metrics_resp(ranks);
            engine.count_metrics_served(&query);
            return Ok(resp);
        }
        // trtllm-serve's Prometheus text (latency_page.rs); not counted as a `/metrics` page.
        (&Method::GET, "/prometheus/metrics", _) if engine.cfg.engine == EngineKind::TrtLlm => {
            let ct = "text/plain; version=0.0.4; charset=utf-8";
            let snaps: Vec<_> = ranks.list.iter().map(|r| r.engine.snapshot()).collect();
            let page = metrics::render_prometheus_path(&engine.cfg, &snaps);
            return Ok(respond(StatusCode::OK, ct, page));
        }
        (&Method::GET, "/admin/state", _) => {
            let body = serde_json::to_string(&ranks.snapshot()).unwrap_or_default();
            return Ok(json_resp(StatusCode::OK, body));
        }
        (&Method::POST, "/admin/reset", _) => {
            let cache = query
                .split('&')
                .any(|kv| kv == "cache=1" || kv == "cache=true");
            ranks.reset(cache);
            return Ok(json_resp(StatusCode::OK, r#"{"ok":true}"#.into()));
        }
        (&Method::POST, "/admin/restart", _) => {
            ranks.restart();
            return Ok(json_resp(StatusCode::OK, r#"{"ok":true}"#.into()));
        }
        (&Method::POST, "/admin/probe", _) => {
            let api = query.strip_prefix("api=").unwrap_or("");
            let body = req
                .into_body()
                .collect()
                .await
                .map_err(|_| DropConnection)?;
            return Ok(match probe_body(engine, api, &body.to_bytes()) {
                Ok(p) => json_resp(
                    StatusCode::OK,
                    serde_json::to_string(&p).unwrap_or_default(),
                ),
                Err(msg) => json_resp(StatusCode::BAD_REQUEST, error_body(400, &msg)),
            });
        }
        (&Method::GET, "/health", _) => return Ok(respond(StatusCode::OK, "text/plain", "")),
        (&Method::GET, "/v1/models", _) => return Ok(models_resp(engine)),
        _ => {
            return Ok(json_resp(
                StatusCode::NOT_FOUND,
                error_body(404, &format!("no route for {} {path}", req.method())),
            ))
        }
    };
    // A pod with several ranks counts a request on the rank that takes it (below).
    let single = ranks.list.len() == 1;
    if single {
        engine.count_request();
    }
    let k = ctx.received.fetch_add(1, Ordering::Relaxed);
    let fault_header = header(&req, "x-fake-fault");
    let rank_header = header(&req, "x-data-parallel-rank");
    let delay_ms: u64 = header(&req, "x-fake-delay-ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Err(DropConnection),
    };
    // Only a pod with ranks or a P/D role reads the body's own fields (the rank, the P/D
    // parameters); a plain pod's hot path parses the body once, as before.
    let first = ranks.first();
    let fields = if single && first.pd.role == crate::pd::Role::Colocated {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null)
    };
    let rank = match ranks.pick(engine.cfg.engine, rank_header.as_deref(), &fields) {
        Ok(r) => r,
        Err(msg) => {
            if !single {
                engine.count_request();
            }
            engine.count_status("400");
            return Ok(json_resp(StatusCode::BAD_REQUEST, error_body(400, &msg)));
        }
    };
    let engine = &rank.engine;
    if !single {
        engine.count_request();
    }
    let cfg = &engine.cfg;
    let rate = engine.error_rate();
    let fault = fault_header.or_else(|| {
        (rate > 0.0 && Rng::derive(cfg.fault_seed, &[k]).chance(rate))
            .then(|| cfg.error_fault.clone())
    });
    if delay_ms > 0 {
        sleep(Duration::from_millis(delay_ms)).await;
    }
    if let Some(fault) = fault.as_deref() {
        if let Some(resp) = inject_fault(fault, engine, reset).await? {
            return Ok(resp);
        }
    }
    let mut gen = match parse_request(kind, &body) {
        Ok(g) => g,
        Err(msg) => {
            engine.count_status("400");
            return Ok(json_resp(StatusCode::BAD_REQUEST, error_body(400, &msg)));
        }
    };
    if let Some(prev) = &gen.previous_response_id {
        // The stored history comes first; an unknown response is a 404, as vLLM answers it.
        match cfg.responses.get(prev) {
            Some(history) => gen.prompt = format!("{history}{}", gen.prompt),
            None => {
                engine.count_status("404");
                let msg = format!("Response with id '{prev}' not found.");
                return Ok(json_resp(StatusCode::NOT_FOUND, error_body(404, &msg)));
            }
        }
    }
    let pd = match crate::pd::request::prepare(cfg.engine, &rank.pd, &fields, &mut gen) {
        Ok(pd) => pd,
        Err(msg) => {
            engine.count_status("400");
            return Ok(json_resp(StatusCode::BAD_REQUEST, error_body(400, &msg)));
        }
    };
    engine.count_status("200");
    let n = ctx.ids.fetch_add(1, Ordering::Relaxed);
    let mut resp = generate_pd(engine.clone(), gen, n, pd).await;
    if !single {
        // Which rank served: tests check the rank headers and the balancer by it.
        resp.headers_mut()
            .insert("x-fake-rank", HeaderValue::from(rank.index));
    }
    Ok(resp)
}

fn header(req: &Request<Incoming>, name: &str) -> Option<String> {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_string())
}

/// Applies `x-fake-fault`. `Ok(None)` = unknown fault, serve normally.
async fn inject_fault(
    fault: &str,
    engine: &Engine,
    reset: &AtomicBool,
) -> Result<Option<Response<RespBody>>, DropConnection> {
    let Some(fault) = Fault::parse(fault) else {
        return Ok(None);
    };
    match fault {
        Fault::Reset => {
            engine.count_status("reset");
            reset.store(true, Ordering::Relaxed);
            Err(DropConnection)
        }
        Fault::Hang => {
            engine.count_status("hang");
            sleep(HANG_FOR).await;
            reset.store(true, Ordering::Relaxed);
            Err(DropConnection)
        }
        Fault::ResetAfterHeaders => {
            engine.count_status("reset-after-headers");
            reset.store(true, Ordering::Relaxed);
            // Headers go out with the first frame; the error afterwards makes hyper abort the
            // connection without the chunked terminator, i.e. a truncated 200.
            let (tx, body) = ChannelBody::pair(4);
            tokio::spawn(async move {
                let _ = tx
                    .send(Ok(Bytes::from_static(b"data: {\"id\":\"trunc")))
                    .await;
                sleep(Duration::from_millis(20)).await;
                let _ = tx
                    .send(Err(std::io::Error::other("fault: reset-after-headers")))
                    .await;
            });
            let mut r = Response::new(body);
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
            Ok(Some(r))
        }
        Fault::Status(status) => {
            engine.count_status(status.as_str());
            Ok(Some(json_resp(
                status,
                error_body(status.as_u16(), "injected fault"),
            )))
        }
    }
}

fn metrics_resp(ranks: &Ranks) -> Response<RespBody> {
    let ct = "text/plain; version=0.0.4; charset=utf-8";
    let engine = &ranks.first().engine;
    match &engine.cfg.metrics {
        MetricsSource::Live => {
            let snaps: Vec<_> = ranks.list.iter().map(|r| r.engine.snapshot()).collect();
            respond(
                StatusCode::OK,
                ct,
                metrics::render_ranks(&engine.cfg, &snaps),
            )
        }
        MetricsSource::Garbage => respond(StatusCode::OK, ct, metrics::GARBAGE),
        MetricsSource::File(p) => match std::fs::read(p) {
            Ok(b) => respond(StatusCode::OK, ct, b),
            Err(e) => respond(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                e.to_string(),
            ),
        },
    }
}

fn models_resp(engine: &Engine) -> Response<RespBody> {
    let cfg = &engine.cfg;
    let data: Vec<_> = std::iter::once(&cfg.served_model_name)
        .chain(&cfg.lora_adapters)
        .map(|m| serde_json::json!({"id": m, "object": "model", "owned_by": "ailb-fakepod"}))
        .collect();
    json_resp(
        StatusCode::OK,
        serde_json::json!({"object": "list", "data": data}).to_string(),
    )
}
