//! Sends one planned request and measures it: TTFT is the first non-empty body frame (the first
//! SSE event when streaming), latency is the end of the body.

use super::plan::PlannedRequest;
use super::spec::AbortPhase;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::Response;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;
use tokio::time::{timeout, Instant};

/// Pooled keep-alive HTTP/1 client, as a gateway's clients would use.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn new_client() -> HttpClient {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(conn)
}

/// What happened to one request.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub index: usize,
    pub target: usize,
    /// `x-pod` response header.
    pub pod: Option<String>,
    pub status: Option<u16>,
    /// `None` = success; otherwise `status:NNN`, `connect`, `reset`, `truncated`, `timeout`,
    /// `aborted` or `other`.
    pub error: Option<String>,
    pub ttft: Option<Duration>,
    pub latency: Duration,
}

/// Sends `r` to `base` and waits for the whole body (or the abort/timeout).
pub async fn send(
    client: &HttpClient,
    base: &str,
    path: &str,
    r: &PlannedRequest,
    limit: Duration,
) -> Outcome {
    let start = Instant::now();
    let mut out = Outcome {
        index: r.index,
        target: r.target,
        pod: None,
        status: None,
        error: None,
        ttft: None,
        latency: Duration::ZERO,
    };
    let deadline = start + limit;
    let res = timeout(limit, exchange(client, base, path, r, start, &mut out))
        .await
        .unwrap_or(Err("timeout"));
    if let Err(kind) = res {
        out.error = Some(kind.to_string());
    }
    out.latency = start.elapsed().min(deadline - start);
    out
}

async fn sleep_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn exchange(
    client: &HttpClient,
    base: &str,
    path: &str,
    r: &PlannedRequest,
    start: Instant,
    out: &mut Outcome,
) -> Result<(), &'static str> {
    let mut req = hyper::Request::post(format!("{}{path}", base.trim_end_matches('/')))
        .header("content-type", "application/json");
    for (k, v) in &r.headers {
        req = req.header(k, v);
    }
    let req = req
        .body(Full::new(Bytes::from(r.body.clone())))
        .map_err(|_| "other")?;
    // A before-first-byte abort is armed from the send until the first body byte arrives.
    let mut abort_at = match &r.abort {
        Some(a) if a.phase == AbortPhase::BeforeFirstByte => Some(start + a.after),
        _ => None,
    };
    let resp: Response<Incoming> = tokio::select! {
        resp = client.request(req) => resp.map_err(|e| classify(&e))?,
        _ = sleep_opt(abort_at) => return Err("aborted"),
    };
    out.status = Some(resp.status().as_u16());
    out.pod = resp
        .headers()
        .get("x-pod")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let ok_status = resp.status().is_success();
    let mut body = resp.into_body();
    let mut tail = Vec::new();
    loop {
        let frame = tokio::select! {
            f = body.frame() => f,
            _ = sleep_opt(abort_at) => return Err("aborted"),
        };
        match frame {
            None => break,
            Some(Err(_)) => return Err("truncated"),
            Some(Ok(f)) => {
                let Some(data) = f.data_ref() else { continue };
                if data.is_empty() {
                    continue;
                }
                if out.ttft.is_none() {
                    out.ttft = Some(start.elapsed());
                    abort_at = None;
                    if let Some(a) = r
                        .abort
                        .as_ref()
                        .filter(|a| a.phase == AbortPhase::AfterFirstByte)
                    {
                        abort_at = Some(Instant::now() + a.after);
                    }
                }
                // Keep only the end: enough to see the stream terminator.
                tail.extend_from_slice(data);
                if tail.len() > 64 {
                    tail.drain(..tail.len() - 64);
                }
            }
        }
    }
    if !ok_status {
        return Err(status_kind(out.status));
    }
    if r.stream && !tail.ends_with(b"data: [DONE]\n\n") {
        return Err("truncated");
    }
    Ok(())
}

fn status_kind(status: Option<u16>) -> &'static str {
    // Leaked strings would be simpler but unbounded; map the common codes, else a bucket.
    match status {
        Some(400) => "status:400",
        Some(404) => "status:404",
        Some(408) => "status:408",
        Some(429) => "status:429",
        Some(500) => "status:500",
        Some(502) => "status:502",
        Some(503) => "status:503",
        Some(504) => "status:504",
        Some(s) if s >= 500 => "status:5xx",
        _ => "status:4xx",
    }
}

fn classify(e: &hyper_util::client::legacy::Error) -> &'static str {
    if e.is_connect() {
        return "connect";
    }
    // Walk the source chain: an io reset, or hyper's "closed before message completed".
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = src {
        if let Some(h) = s.downcast_ref::<hyper::Error>() {
            if h.is_incomplete_message() || h.is_canceled() {
                return "reset";
            }
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(
                io.kind(),
                ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof
            ) {
                return "reset";
            }
        }
        src = s.source();
    }
    "other"
}
