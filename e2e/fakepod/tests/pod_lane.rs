//! The engine-like pod the trace bench uses: one prefill lane at a token rate, KV admission,
//! grouped streaming, cached tokens and pod-side TTFT in the last SSE chunk, restart, probe.

mod common;

use common::*;
use serde_json::{json, Value};

/// A streamed chat with `include_usage`; returns the usage-only chunk's `usage` and the number
/// of SSE events before it.
async fn stream_usage(
    c: &ailb_fakepod::load::client::HttpClient,
    url: &str,
    text: &str,
    max_tokens: u64,
) -> (Value, usize) {
    let body = json!({"model": "fake-model", "stream": true, "max_tokens": max_tokens,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": text}]})
    .to_string();
    let s = send(c, "POST", url, &body, &[]).await.unwrap();
    assert_eq!(s.status, 200);
    let all = s.text();
    let events: Vec<&str> = all.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(*events.last().unwrap(), "data: [DONE]");
    let usage: Value = serde_json::from_str(&events[events.len() - 2][6..]).unwrap();
    (usage["usage"].clone(), events.len() - 2)
}

#[tokio::test]
async fn lane_serialises_prefill_and_reports_cached_tokens_and_ttft() {
    // 100k tokens/s: a 4,000-token prompt takes 40 ms of lane time.
    let p = pod("pod-l", |c| {
        c.prefill_tokens_per_s = 100_000.0;
        c.decode_us_per_token = 1_000;
        c.stream_interval = 8;
    })
    .await;
    let c = client();
    let url = format!("{}/v1/chat/completions", p.url());
    let docs: Vec<String> = (0..3)
        .map(|i| format!("{i}{}", "abcd".repeat(4000)))
        .collect();
    // Three cold prompts at once share the lane: the last one's TTFT is about 3 × 40 ms.
    let mut tasks = Vec::new();
    for d in docs.clone() {
        let (c, url) = (c.clone(), url.clone());
        tasks.push(tokio::spawn(
            async move { stream_usage(&c, &url, &d, 20).await },
        ));
    }
    let mut ttfts = Vec::new();
    for t in tasks {
        let (usage, events) = t.await.unwrap();
        assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
        // 20 tokens: 1 alone, then groups of 8 (8, 8, 3).
        assert_eq!(events, 4);
        ttfts.push(usage["fake_ttft_us"].as_u64().unwrap());
    }
    ttfts.sort();
    assert!(ttfts[0] >= 40_000, "{ttfts:?}");
    assert!(
        ttfts[2] >= 120_000,
        "the third waited for two prefills: {ttfts:?}"
    );
    // The same prompt again: all but the partial last block is cached, TTFT is short.
    let (usage, _) = stream_usage(&c, &url, &docs[0], 4).await;
    let prompt = usage["prompt_tokens"].as_u64().unwrap();
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(prompt - cached < 16, "{prompt} {cached}");
    assert!(usage["fake_ttft_us"].as_u64().unwrap() < 30_000, "{usage}");
    // The probe sees the same cache; a restart empties it and moves the start time.
    let probe_body = json!({"messages": [{"role": "user", "content": docs[1]}]}).to_string();
    let probe_url = format!("{}/admin/probe", p.url());
    let before = probe(&c, &probe_url, &probe_body).await;
    assert_eq!(
        before["cached_tokens"],
        usage["prompt_tokens_details"]["cached_tokens"]
    );
    let start0 = p.state().started_unix;
    send(&c, "POST", &format!("{}/admin/restart", p.url()), "", &[])
        .await
        .unwrap();
    let after = probe(&c, &probe_url, &probe_body).await;
    assert_eq!(after["cached_tokens"], 0);
    let s = p.state();
    assert_eq!(s.restarts, 1);
    assert!(s.started_unix > start0);
    let m = get(&c, &format!("{}/metrics", p.url())).await;
    assert!(m.contains("process_start_time_seconds "), "{m}");
    p.shutdown().await;
}

async fn probe(c: &ailb_fakepod::load::client::HttpClient, url: &str, body: &str) -> Value {
    let s = send(c, "POST", url, body, &[]).await.unwrap();
    serde_json::from_str(&s.text()).unwrap()
}

#[tokio::test]
async fn kv_admission_makes_requests_wait_for_room() {
    // 2,048 tokens of KV: a 1,000-token prompt with half of 1,000 output tokens fits once.
    let p = pod("pod-kv", |c| {
        c.kv_admission = true;
        c.kv_capacity_tokens = 2048;
        c.cache_blocks = 128;
        c.decode_us_per_token = 100;
        c.stream_interval = 100;
    })
    .await;
    let c = client();
    let url = format!("{}/v1/chat/completions", p.url());
    let mut tasks = Vec::new();
    for i in 0..2 {
        let (c, url) = (c.clone(), url.clone());
        let text = format!("{i}{}", "wxyz".repeat(1000));
        tasks.push(tokio::spawn(async move {
            stream_usage(&c, &url, &text, 1000).await
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let s = p.state();
    assert_eq!(
        s.peak_running, 1,
        "the second request waited for the first's KV"
    );
    assert_eq!(s.peak_waiting, 1);
    assert!(s.cache_blocks_used > 0);
    p.shutdown().await;
}
