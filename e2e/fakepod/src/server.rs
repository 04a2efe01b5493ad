//! HTTP front of a fake pod: routing, fault injection, streaming and the pod handle tests use.

use crate::body::{full, ChannelBody, RespBody};
use crate::config::{MetricsSource, PodConfig};
use crate::engine::{Engine, Job, Running, Snapshot};
use crate::metrics;
use crate::openai::{self, error_body, parse_request, token_text, GenRequest, RespMeta, Usage};
use crate::tokenize::{block_hashes, fnv1a, tokenize, ApiKind};
use anyhow::{Context as _, Result};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::{sleep, sleep_until, Instant};

/// How long `x-fake-fault: hang` holds a request (the connection is dropped afterwards).
const HANG_FOR: Duration = Duration::from_secs(3600);

/// A running fake pod. Dropping it stops the server and aborts its connections.
pub struct PodHandle {
    pub name: String,
    pub addr: SocketAddr,
    engine: Arc<Engine>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl PodHandle {
    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Current engine state (same as `GET /admin/state`).
    pub fn state(&self) -> Snapshot {
        self.engine.snapshot()
    }

    /// The engine (for in-process assertions).
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Stops accepting, aborts open connections and waits for the accept loop to end.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for PodHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Binds `cfg.listen` and serves until the handle is shut down or dropped.
pub async fn spawn_pod(cfg: PodConfig) -> Result<PodHandle> {
    let listener = TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("bind {}", cfg.listen))?;
    let addr = listener.local_addr()?;
    let name = cfg.name.clone();
    let engine = Engine::new(cfg);
    let ctx = Arc::new(Ctx {
        engine: engine.clone(),
        ids: AtomicU64::new(0),
    });
    let (stop_tx, mut stop_rx) = oneshot::channel();
    let task = tokio::spawn(async move {
        // Connections live in this set so that stopping the pod aborts them all.
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                _ = &mut stop_rx => break,
                accepted = listener.accept() => {
                    if let Ok((stream, _)) = accepted {
                        conns.spawn(serve_conn(stream, ctx.clone()));
                    }
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
        conns.shutdown().await;
    });
    Ok(PodHandle {
        name,
        addr,
        engine,
        stop: Some(stop_tx),
        task,
    })
}

struct Ctx {
    engine: Arc<Engine>,
    ids: AtomicU64,
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

async fn serve_conn(stream: TcpStream, ctx: Arc<Ctx>) {
    let _ = stream.set_nodelay(true); // SSE chunks must leave at once for honest TTFT
    let reset = Arc::new(AtomicBool::new(false));
    let io = TokioIo::new(FaultStream {
        inner: stream,
        reset: reset.clone(),
    });
    let svc = hyper::service::service_fn(move |req| {
        let (ctx, reset) = (ctx.clone(), reset.clone());
        async move {
            let name = HeaderValue::from_str(&ctx.engine.cfg.name)
                .unwrap_or_else(|_| HeaderValue::from_static("invalid-name"));
            let mut resp = handle(req, &ctx, &reset).await?;
            resp.headers_mut().insert("x-pod", name);
            Ok::<_, DropConnection>(resp)
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(io, svc)
        .await;
}

fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<RespBody> {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn json_resp(status: StatusCode, body: String) -> Response<RespBody> {
    respond(status, "application/json", body)
}

async fn handle(
    req: Request<Incoming>,
    ctx: &Ctx,
    reset: &AtomicBool,
) -> Result<Response<RespBody>, DropConnection> {
    let engine = &ctx.engine;
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let kind = match (req.method(), path.as_str()) {
        (&Method::POST, "/v1/chat/completions") => ApiKind::Chat,
        (&Method::POST, "/v1/completions") => ApiKind::Completions,
        (&Method::GET, "/metrics") => return Ok(metrics_resp(engine)),
        (&Method::GET, "/admin/state") => {
            let body = serde_json::to_string(&engine.snapshot()).unwrap_or_default();
            return Ok(json_resp(StatusCode::OK, body));
        }
        (&Method::POST, "/admin/reset") => {
            let cache = query
                .split('&')
                .any(|kv| kv == "cache=1" || kv == "cache=true");
            engine.reset(cache);
            return Ok(json_resp(StatusCode::OK, r#"{"ok":true}"#.into()));
        }
        (&Method::GET, "/health") => return Ok(respond(StatusCode::OK, "text/plain", "")),
        (&Method::GET, "/v1/models") => return Ok(models_resp(engine)),
        _ => {
            return Ok(json_resp(
                StatusCode::NOT_FOUND,
                error_body(404, &format!("no route for {} {path}", req.method())),
            ))
        }
    };
    engine.count_request();
    let fault = header(&req, "x-fake-fault");
    let delay_ms: u64 = header(&req, "x-fake-delay-ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Err(DropConnection),
    };
    if delay_ms > 0 {
        sleep(Duration::from_millis(delay_ms)).await;
    }
    if let Some(fault) = fault.as_deref() {
        if let Some(resp) = inject_fault(fault, engine, reset).await? {
            return Ok(resp);
        }
    }
    let gen = match parse_request(kind, &body) {
        Ok(g) => g,
        Err(msg) => {
            engine.count_status("400");
            return Ok(json_resp(StatusCode::BAD_REQUEST, error_body(400, &msg)));
        }
    };
    engine.count_status("200");
    let n = ctx.ids.fetch_add(1, Ordering::Relaxed);
    Ok(generate(engine.clone(), gen, n).await)
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
    match fault {
        "reset" => {
            engine.count_status("reset");
            reset.store(true, Ordering::Relaxed);
            Err(DropConnection)
        }
        "hang" => {
            engine.count_status("hang");
            sleep(HANG_FOR).await;
            reset.store(true, Ordering::Relaxed);
            Err(DropConnection)
        }
        "reset-after-headers" => {
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
        f => {
            let Some(code) = f.strip_prefix("status:") else {
                return Ok(None);
            };
            let status = code
                .trim()
                .parse::<u16>()
                .ok()
                .and_then(|c| StatusCode::from_u16(c).ok())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            engine.count_status(status.as_str());
            Ok(Some(json_resp(
                status,
                error_body(status.as_u16(), "injected fault"),
            )))
        }
    }
}

fn metrics_resp(engine: &Engine) -> Response<RespBody> {
    let ct = "text/plain; version=0.0.4; charset=utf-8";
    match &engine.cfg.metrics {
        MetricsSource::Live => respond(
            StatusCode::OK,
            ct,
            metrics::render(&engine.cfg, &engine.snapshot()),
        ),
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

/// Everything decided about a request before it enters the engine.
struct Plan {
    job: Job,
    hashes: Vec<u64>,
    /// Blocks of prompt + answer, cached once the answer is complete (vLLM keeps the KV of
    /// generated tokens too, so a conversation's next turn hits through the previous answer).
    after: Vec<u64>,
    out_tokens: u64,
    seed: u64,
    meta: RespMeta,
    include_usage: bool,
}

fn plan(engine: &Engine, gen: &GenRequest, n: u64) -> Plan {
    let cfg = &engine.cfg;
    let lora = engine.lora_for(gen.model.as_deref());
    let tokens = tokenize(&gen.prompt);
    let namespace = lora.as_deref().unwrap_or(&cfg.served_model_name);
    let hashes = block_hashes(namespace, &tokens, cfg.block_tokens);
    let answered = openai::after_answer(
        gen.kind,
        &gen.prompt,
        &openai::answer_text(&gen.prompt, out_tokens_of(cfg, gen)),
    );
    let after = block_hashes(namespace, &tokenize(&answered), cfg.block_tokens);
    let out_tokens = out_tokens_of(cfg, gen);
    let prefix = match gen.kind {
        ApiKind::Chat => "chatcmpl",
        ApiKind::Completions => "cmpl",
    };
    Plan {
        job: Job {
            prompt_tokens: tokens.len() as u64,
            block_hashes: hashes.clone(),
            lora,
        },
        hashes,
        after,
        out_tokens,
        seed: fnv1a(0, gen.prompt.as_bytes()),
        meta: RespMeta {
            id: format!("{prefix}-{}-{n}", cfg.name),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            model: gen
                .model
                .clone()
                .unwrap_or_else(|| cfg.served_model_name.clone()),
            kind: gen.kind,
        },
        include_usage: gen.include_usage,
    }
}

fn out_tokens_of(cfg: &crate::config::PodConfig, gen: &GenRequest) -> u64 {
    gen.max_tokens
        .unwrap_or(cfg.default_max_tokens)
        .clamp(1, cfg.max_output_tokens.max(1))
}

/// Queue, then prefill: sleeps for the uncached part of the prompt and caches its blocks.
async fn prefill(engine: &Arc<Engine>, p: &Plan) -> Running {
    let run = engine.admit(&p.job).await;
    let uncached = p.job.prompt_tokens - run.hit_tokens;
    sleep(Duration::from_micros(
        uncached * engine.cfg.prefill_us_per_token,
    ))
    .await;
    run.commit_prompt(&p.hashes);
    run
}

/// Decode step deadlines are absolute so sub-millisecond steps don't accumulate timer slack.
async fn next_token(engine: &Engine, deadline: &mut Instant, run: &mut Running) {
    *deadline += engine.decode_step();
    sleep_until(*deadline).await;
    run.add_generated();
}

async fn generate(engine: Arc<Engine>, gen: GenRequest, n: u64) -> Response<RespBody> {
    let p = plan(&engine, &gen, n);
    if gen.stream {
        let (tx, body) = ChannelBody::pair(64);
        tokio::spawn(async move {
            // A client that goes away cancels the request and frees its slot, as vLLM aborts.
            tokio::select! {
                _ = tx.closed() => {}
                _ = stream_tokens(&engine, &p, &tx) => {}
            }
        });
        let mut r = Response::new(body);
        let h = r.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        h.insert("cache-control", HeaderValue::from_static("no-cache"));
        return r;
    }
    let mut run = prefill(&engine, &p).await;
    let mut deadline = Instant::now();
    let mut text = String::new();
    for i in 0..p.out_tokens {
        next_token(&engine, &mut deadline, &mut run).await;
        text.push_str(token_text(p.seed, i));
    }
    run.commit_prompt(&p.after);
    let usage = Usage {
        prompt: p.job.prompt_tokens,
        completion: p.out_tokens,
        cached: run.hit_tokens,
    };
    let mut r = json_resp(StatusCode::OK, p.meta.full(&text, usage));
    let h = r.headers_mut();
    h.insert(
        "x-fake-queue-us",
        HeaderValue::from(run.queue_wait.as_micros() as u64),
    );
    h.insert("x-fake-cached-tokens", HeaderValue::from(run.hit_tokens));
    r
}

async fn stream_tokens(
    engine: &Arc<Engine>,
    p: &Plan,
    tx: &mpsc::Sender<Result<Bytes, std::io::Error>>,
) {
    let mut run = prefill(engine, p).await;
    let mut deadline = Instant::now();
    for i in 0..p.out_tokens {
        next_token(engine, &mut deadline, &mut run).await;
        let finish = (i + 1 == p.out_tokens).then_some("length");
        let chunk = p.meta.chunk(token_text(p.seed, i), i == 0, finish);
        if tx.send(Ok(chunk.into())).await.is_err() {
            return;
        }
    }
    if p.include_usage {
        let usage = Usage {
            prompt: p.job.prompt_tokens,
            completion: p.out_tokens,
            cached: run.hit_tokens,
        };
        let _ = tx.send(Ok(p.meta.usage_chunk(usage).into())).await;
    }
    run.commit_prompt(&p.after);
    drop(run); // the request is finished before [DONE] goes out
    let _ = tx
        .send(Ok(Bytes::from_static(openai::DONE.as_bytes())))
        .await;
}
