//! Shared helpers for the integration tests: fast pods and a recording HTTP client.
#![allow(dead_code)]

use ailb_fakepod::load::client::{new_client, HttpClient};
use ailb_fakepod::{spawn_pod, PodConfig, PodHandle};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use std::time::Duration;
use tokio::time::Instant;

/// A pod with millisecond-scale timings so tests stay short.
pub async fn pod(name: &str, tweak: impl FnOnce(&mut PodConfig)) -> PodHandle {
    let mut cfg = PodConfig {
        name: name.into(),
        prefill_us_per_token: 200,
        decode_us_per_token: 2_000,
        decode_batch_penalty: 0.0,
        ..PodConfig::default()
    };
    tweak(&mut cfg);
    spawn_pod(cfg).await.expect("spawn pod")
}

/// What a test saw of one exchange.
#[derive(Debug)]
pub struct Seen {
    pub status: u16,
    pub pod: Option<String>,
    pub headers: hyper::HeaderMap,
    /// Body frames with their arrival time since the request was sent.
    pub frames: Vec<(Duration, Bytes)>,
    /// Set when the body ended in an error (connection dropped mid-body).
    pub body_error: bool,
    pub total: Duration,
}

impl Seen {
    pub fn text(&self) -> String {
        self.frames
            .iter()
            .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
            .collect()
    }
}

pub fn client() -> HttpClient {
    new_client()
}

/// Sends a request; `Err` is the client error text (no response at all).
pub async fn send(
    c: &HttpClient,
    method: &str,
    url: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> Result<Seen, String> {
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::from(body.to_string()))).unwrap();
    let start = Instant::now();
    let resp = c.request(req).await.map_err(|e| format!("{e:?}"))?;
    let status = resp.status().as_u16();
    let pod = resp
        .headers()
        .get("x-pod")
        .map(|v| v.to_str().unwrap().to_string());
    let headers = resp.headers().clone();
    let mut b = resp.into_body();
    let mut frames = Vec::new();
    let mut body_error = false;
    while let Some(f) = b.frame().await {
        match f {
            Ok(f) => {
                if let Ok(d) = f.into_data() {
                    frames.push((start.elapsed(), d));
                }
            }
            Err(_) => {
                body_error = true;
                break;
            }
        }
    }
    Ok(Seen {
        status,
        pod,
        headers,
        frames,
        body_error,
        total: start.elapsed(),
    })
}

pub async fn get(c: &HttpClient, url: &str) -> String {
    send(c, "GET", url, "", &[]).await.unwrap().text()
}

/// Chat body with the given system text and user text.
pub fn chat(system: &str, user: &str, max_tokens: u64, stream: bool) -> String {
    serde_json::json!({
        "model": "fake-model",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
    .to_string()
}

/// Value of the first series named exactly `name` in Prometheus text.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    ailb_fakepod::metrics::parse_text(text)
        .ok()?
        .into_iter()
        .find(|(n, _, _)| n == name)
        .map(|(_, _, v)| v)
}

/// Polls `cond` every 5 ms for up to `limit`.
pub async fn eventually(limit: Duration, mut cond: impl AsyncFnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}
