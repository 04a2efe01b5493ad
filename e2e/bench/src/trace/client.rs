//! Sends one streamed request and reads what the replay measures: the serving pod (`x-pod`) and
//! rank (`x-fake-rank`), the client-side times to the first and to the last body bytes, and from
//! the usage-only last chunk the prompt tokens, `cached_tokens` and the pod-side TTFT
//! (`fake_ttft_us`, fakepod's wire.rs).

use ailb_fakepod::load::client::HttpClient;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use std::time::Duration;
use tokio::time::{timeout, Instant};

/// What came back for one request (wall-clock times).
#[derive(Clone, Debug, Default)]
pub struct Answer {
    pub status: u16,
    pub pod: Option<String>,
    /// The data-parallel rank that served it (`x-fake-rank`, a fake pod with ranks).
    pub rank: Option<usize>,
    /// The plugin's debug header (`endpoint=…; reason=…`) when configured.
    pub debug: Option<String>,
    pub error: Option<String>,
    pub first_byte: Option<Duration>,
    /// To the end of the body (the whole answer streamed).
    pub last_byte: Option<Duration>,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub pod_ttft: Option<Duration>,
}

/// Bytes of the stream's end kept to find the usage chunk (it is the last event but `[DONE]`).
const TAIL: usize = 4096;

/// Sends `body` to `url`; `on_first` runs when the first body bytes arrive (an in-process
/// router releases a request's booked prefill tokens then, as llm-d does).
pub async fn send(
    client: &HttpClient,
    url: &str,
    headers: &[(String, String)],
    body: Vec<u8>,
    limit: Duration,
    on_first: impl FnOnce(),
) -> Answer {
    let mut a = Answer::default();
    let res = timeout(
        limit,
        exchange(client, url, headers, body, &mut a, on_first),
    )
    .await;
    match res {
        Ok(Ok(())) => {}
        Ok(Err(e)) => a.error = Some(e),
        Err(_) => a.error = Some("timeout".into()),
    }
    a
}

async fn exchange(
    client: &HttpClient,
    url: &str,
    headers: &[(String, String)],
    body: Vec<u8>,
    a: &mut Answer,
    on_first: impl FnOnce(),
) -> Result<(), String> {
    let start = Instant::now();
    let mut req = hyper::Request::post(url).header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let req = req
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let resp = client
        .request(req)
        .await
        .map_err(|e| format!("send: {e}"))?;
    a.status = resp.status().as_u16();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    };
    a.pod = header("x-pod");
    a.rank = header("x-fake-rank").and_then(|r| r.parse().ok());
    a.debug = header("x-ai-lb-debug");
    let mut body = resp.into_body();
    let mut tail: Vec<u8> = Vec::new();
    let mut on_first = Some(on_first);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| "truncated".to_string())?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        if let Some(f) = on_first.take() {
            a.first_byte = Some(start.elapsed());
            f();
        }
        tail.extend_from_slice(data);
        if tail.len() > 2 * TAIL {
            tail.drain(..tail.len() - TAIL);
        }
    }
    a.last_byte = Some(start.elapsed());
    if a.status != 200 {
        return Err(format!("status:{}", a.status));
    }
    let usage = last_usage(&tail).ok_or("no usage chunk")?;
    a.prompt_tokens = usage["prompt_tokens"].as_u64();
    a.cached_tokens = usage["prompt_tokens_details"]["cached_tokens"].as_u64();
    a.pod_ttft = usage["fake_ttft_us"].as_u64().map(Duration::from_micros);
    Ok(())
}

/// The `usage` object of the last SSE event that has one.
fn last_usage(tail: &[u8]) -> Option<Value> {
    let text = String::from_utf8_lossy(tail);
    text.split("\n\n")
        .filter_map(|e| e.trim().strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v.get("usage").cloned())
        .filter(|u| !u.is_null())
        .last()
}
