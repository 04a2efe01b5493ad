//! The fake pod's engine model seen through HTTP: prefix cache, queueing, streaming, metrics.

mod common;

use common::*;
use std::time::Duration;

#[tokio::test]
async fn repeated_prompt_hits_cache_and_gets_faster() {
    // 2000-token system prompt at 200 us/token = ~400 ms cold prefill.
    let p = pod("pod-a", |c| c.prefill_us_per_token = 200).await;
    let c = client();
    let url = format!("{}/v1/chat/completions", p.url());
    let system = "abcd".repeat(2000);
    let cold = send(&c, "POST", &url, &chat(&system, "q1", 2, true), &[])
        .await
        .unwrap();
    let warm = send(&c, "POST", &url, &chat(&system, "q2", 2, true), &[])
        .await
        .unwrap();
    let (cold_ttft, warm_ttft) = (cold.frames[0].0, warm.frames[0].0);
    assert!(
        cold_ttft > Duration::from_millis(300),
        "cold TTFT {cold_ttft:?}"
    );
    assert!(
        warm_ttft * 4 < cold_ttft,
        "warm {warm_ttft:?} vs cold {cold_ttft:?}"
    );
    let s = p.state();
    assert!(s.prefix_hit_tokens >= 1984, "hits {}", s.prefix_hit_tokens);
    assert_eq!(s.prefix_query_tokens, s.prompt_tokens_total);
    let m = get(&c, &format!("{}/metrics", p.url())).await;
    assert_eq!(
        metric(&m, "vllm:prefix_cache_hits_total"),
        Some(s.prefix_hit_tokens as f64)
    );
    assert_eq!(
        metric(&m, "vllm:prefix_cache_queries_total"),
        Some(s.prefix_query_tokens as f64)
    );
    // usage reports the cached tokens like OpenAI's prompt_tokens_details.
    let ns = send(&c, "POST", &url, &chat(&system, "q3", 1, false), &[])
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&ns.text()).unwrap();
    assert!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            >= 1984
    );
    assert_eq!(v["usage"]["completion_tokens"], 1);
    // A reset with ?cache=1 makes the next request cold again.
    send(
        &c,
        "POST",
        &format!("{}/admin/reset?cache=1", p.url()),
        "",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(p.state().prefix_hit_tokens, 0);
    let again = send(&c, "POST", &url, &chat(&system, "q4", 1, true), &[])
        .await
        .unwrap();
    assert!(again.frames[0].0 > Duration::from_millis(300));
    p.shutdown().await;
}

#[tokio::test]
async fn queueing_beyond_max_running_shows_in_metrics() {
    let p = pod("pod-q", |c| {
        c.max_running = 2;
        c.decode_us_per_token = 5_000;
        c.lora_adapters = vec!["ad1".into(), "ad2".into()];
    })
    .await;
    let c = client();
    let url = format!("{}/v1/chat/completions", p.url());
    let mut tasks = Vec::new();
    for i in 0..5 {
        let (c, url) = (c.clone(), url.clone());
        // 60 tokens x 5 ms = 300 ms each; the first two (ad1) run, the rest wait.
        let model = if i < 2 { "ad1" } else { "ad2" };
        let body = serde_json::json!({"model": model, "max_tokens": 60,
            "messages": [{"role": "user", "content": format!("hold {i}")}]})
        .to_string();
        tasks.push(tokio::spawn(async move {
            send(&c, "POST", &url, &body, &[]).await
        }));
        tokio::time::sleep(Duration::from_millis(10)).await; // fixed arrival order
    }
    let murl = format!("{}/metrics", p.url());
    let seen = eventually(Duration::from_secs(2), async || {
        let m = get(&c, &murl).await;
        metric(&m, "vllm:num_requests_waiting") == Some(3.0)
            && metric(&m, "vllm:num_requests_running") == Some(2.0)
    })
    .await;
    assert!(seen, "expected 2 running / 3 waiting");
    let m = get(&c, &murl).await;
    assert!(
        m.contains("running_lora_adapters=\"ad1\",waiting_lora_adapters=\"ad2\""),
        "{m}"
    );
    assert!(metric(&m, "vllm:kv_cache_usage_perc").unwrap() > 0.0);
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap().status, 200);
    }
    let s = p.state();
    assert_eq!(
        (s.running, s.waiting, s.peak_running, s.peak_waiting),
        (0, 0, 2, 3)
    );
    assert_eq!(s.kv_tokens, 0);
    assert_eq!(s.status.get("200"), Some(&5));
    p.shutdown().await;
}

#[tokio::test]
async fn sse_delivers_tokens_incrementally() {
    let p = pod("pod-s", |c| c.decode_us_per_token = 10_000).await;
    let c = client();
    let body = serde_json::json!({"prompt": "hello", "max_tokens": 20, "stream": true,
        "stream_options": {"include_usage": true}})
    .to_string();
    let s = send(
        &c,
        "POST",
        &format!("{}/v1/completions", p.url()),
        &body,
        &[],
    )
    .await
    .unwrap();
    assert_eq!(s.status, 200);
    assert_eq!(s.pod.as_deref(), Some("pod-s"));
    assert!(s.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let text = s.text();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 22, "20 tokens + usage + [DONE]");
    assert!(events.iter().all(|e| e.starts_with("data: ")));
    assert_eq!(*events.last().unwrap(), "data: [DONE]");
    let usage: serde_json::Value = serde_json::from_str(&events[20][6..]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 20);
    // ~200 ms of decoding: the first token must arrive long before the end.
    let first = s.frames[0].0;
    assert!(s.frames.len() >= 20, "one frame per token");
    assert!(first * 4 < s.total, "first {first:?} total {:?}", s.total);
    assert!(s.total >= Duration::from_millis(190));
    p.shutdown().await;
}

#[tokio::test]
async fn metrics_dialects_files_and_garbage() {
    let c = client();
    let v1 = pod("m1", |_| {}).await;
    let m = get(&c, &format!("{}/metrics", v1.url())).await;
    ailb_fakepod::metrics::parse_text(&m).unwrap();
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
    ] {
        assert!(metric(&m, name).is_some(), "{name} missing");
        let family = name.trim_end_matches("_total");
        assert!(
            m.contains(&format!("# HELP {family} ")) && m.contains(&format!("# TYPE {family} "))
        );
    }
    assert!(m.contains("{engine=\"0\",model_name=\"fake-model\"}"));
    assert!(
        !m.contains("lora_requests_info"),
        "only with --lora-adapters"
    );

    let sg = pod("m2", |c| c.engine = ailb_fakepod::EngineKind::Sglang).await;
    let m = get(&c, &format!("{}/metrics", sg.url())).await;
    for name in [
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:cache_hit_rate",
    ] {
        assert!(metric(&m, name).is_some(), "{name} missing");
    }
    assert!(!m.contains("vllm:"));

    let path =
        std::env::temp_dir().join(format!("ailb-fakepod-metrics-{}.txt", std::process::id()));
    std::fs::write(&path, "# TYPE x gauge\nx{a=\"1\"} 7\n").unwrap();
    let f = pod("m3", |c| {
        c.metrics = ailb_fakepod::MetricsSource::File(path.clone())
    })
    .await;
    assert_eq!(
        get(&c, &format!("{}/metrics", f.url())).await,
        "# TYPE x gauge\nx{a=\"1\"} 7\n"
    );
    let _ = std::fs::remove_file(&path);

    let g = pod("m4", |c| c.metrics = ailb_fakepod::MetricsSource::Garbage).await;
    let m = get(&c, &format!("{}/metrics", g.url())).await;
    assert!(ailb_fakepod::metrics::parse_text(&m).is_err());
}

#[tokio::test]
async fn next_turn_hits_through_the_previous_answer() {
    // vLLM keeps the KV of generated tokens: a conversation's next turn, which carries the
    // answer in its history, is cached through that answer, not only through the old prompt.
    let p = pod("pod-a", |c| c.decode_us_per_token = 100).await;
    let c = client();
    let url = format!("{}/v1/chat/completions", p.url());
    let turn1 = serde_json::json!({"messages": [
        {"role": "system", "content": "abcd".repeat(100)},
        {"role": "user", "content": "q1"},
    ]});
    let mut body = turn1.clone();
    body["max_tokens"] = 64.into();
    let r = send(&c, "POST", &url, &body.to_string(), &[])
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&r.text()).unwrap();
    let answer = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let prompt1 =
        ailb_fakepod::tokenize::canonical_prompt(ailb_fakepod::tokenize::ApiKind::Chat, &turn1)
            .unwrap();
    assert_eq!(
        answer,
        ailb_fakepod::openai::answer_text(&prompt1, 64),
        "answers are predictable"
    );
    let mut turn2 = turn1.clone();
    turn2["messages"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"role": "assistant", "content": answer}));
    turn2["messages"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"role": "user", "content": "q2"}));
    turn2["max_tokens"] = 1.into();
    let before = p.state().prefix_hit_tokens;
    send(&c, "POST", &url, &turn2.to_string(), &[])
        .await
        .unwrap();
    let hit = p.state().prefix_hit_tokens - before;
    let prompt1_tokens = ailb_fakepod::tokenize::tokenize(&prompt1).len() as u64;
    assert!(
        hit >= prompt1_tokens + 48,
        "hit {hit} tokens; turn 1's prompt alone is {prompt1_tokens}"
    );
    p.shutdown().await;
}
