//! Fault injection and error handling of the fake pod.

mod common;

use common::*;
use std::time::Duration;

#[tokio::test]
async fn each_fault_mode_behaves() {
    let p = pod("pod-f", |_| {}).await;
    let c = client();
    let url = format!("{}/v1/chat/completions", p.url());
    let ok_body = chat("sys", "hi", 3, true);

    // reset: no response at all.
    let r = send(&c, "POST", &url, &ok_body, &[("x-fake-fault", "reset")]).await;
    assert!(r.is_err(), "reset must not answer: {r:?}");

    // reset-after-headers: a 200 whose body breaks off.
    let r = send(
        &c,
        "POST",
        &url,
        &ok_body,
        &[("x-fake-fault", "reset-after-headers")],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.pod.as_deref(), Some("pod-f"));
    assert!(r.body_error, "body must end in an error");
    assert!(!r.text().contains("[DONE]"));

    // hang: nothing within the client's patience.
    let hang = tokio::time::timeout(
        Duration::from_millis(300),
        send(&c, "POST", &url, &ok_body, &[("x-fake-fault", "hang")]),
    )
    .await;
    assert!(hang.is_err(), "hang must not answer");

    // status:NNN, with an OpenAI error body and the pod header.
    let r = send(
        &c,
        "POST",
        &url,
        &ok_body,
        &[("x-fake-fault", "status:503")],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.pod.as_deref(), Some("pod-f"));
    let v: serde_json::Value = serde_json::from_str(&r.text()).unwrap();
    assert!(v["error"]["message"].is_string());
    let r = send(
        &c,
        "POST",
        &url,
        &ok_body,
        &[("x-fake-fault", "status:429")],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 429);

    // x-fake-delay-ms delays the answer.
    let r = send(
        &c,
        "POST",
        &url,
        &chat("s", "u", 1, false),
        &[("x-fake-delay-ms", "150")],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);
    assert!(r.total >= Duration::from_millis(150), "{:?}", r.total);

    // Invalid JSON and bodies without a prompt are 400s in OpenAI shape.
    for bad in ["{not json", r#"{"messages": 3}"#] {
        let r = send(&c, "POST", &url, bad, &[]).await.unwrap();
        assert_eq!(r.status, 400);
        let v: serde_json::Value = serde_json::from_str(&r.text()).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }

    // The pod still serves normally, and bookkeeping saw every outcome.
    let r = send(&c, "POST", &url, &ok_body, &[]).await.unwrap();
    assert!(r.text().ends_with("data: [DONE]\n\n"));
    let s = p.state();
    for k in ["reset", "reset-after-headers", "hang", "503", "429", "400"] {
        assert!(s.status.contains_key(k), "{k} not counted: {:?}", s.status);
    }
    assert_eq!(s.running, 0);
    p.shutdown().await;
}

#[tokio::test]
async fn client_disconnect_frees_the_slot() {
    let p = pod("pod-d", |c| {
        c.max_running = 1;
        c.decode_us_per_token = 20_000;
    })
    .await;
    let c = client();
    let url = format!("{}/v1/chat/completions", p.url());
    // A 100-token stream (2 s) that the client drops after 100 ms.
    let _ = tokio::time::timeout(
        Duration::from_millis(100),
        send(&c, "POST", &url, &chat("s", "long", 100, true), &[]),
    )
    .await;
    assert!(
        eventually(Duration::from_millis(500), async || p.state().running == 0).await,
        "the aborted request must release its slot"
    );
    // So the next one starts right away.
    let r = send(&c, "POST", &url, &chat("s", "short", 1, true), &[])
        .await
        .unwrap();
    assert!(r.frames[0].0 < Duration::from_millis(500));
    p.shutdown().await;
}

/// `error_rate` fails the same requests (by arrival number) on every run of a seed, and a
/// different seed fails others; the share is close to the rate.
#[tokio::test]
async fn error_rate_is_seeded_and_reproducible() {
    let c = client();
    let mut runs = Vec::new();
    for seed in [7, 7, 8] {
        let p = pod("pod-e", |c| {
            c.error_rate = 0.2;
            c.fault_seed = seed;
            c.decode_us_per_token = 100;
        })
        .await;
        let url = format!("{}/v1/chat/completions", p.url());
        let mut statuses = Vec::new();
        for i in 0..200 {
            let r = send(
                &c,
                "POST",
                &url,
                &chat("s", &format!("q{i}"), 1, false),
                &[],
            )
            .await
            .unwrap();
            statuses.push(r.status);
        }
        assert_eq!(
            p.state().status.get("500").copied().unwrap_or(0) as usize,
            statuses.iter().filter(|s| **s == 500).count()
        );
        p.shutdown().await;
        runs.push(statuses);
    }
    assert_eq!(runs[0], runs[1], "same seed, same failures");
    assert_ne!(runs[0], runs[2], "another seed, other failures");
    for r in &runs {
        assert!(r.iter().all(|s| *s == 200 || *s == 500));
        let failed = r.iter().filter(|s| **s == 500).count();
        assert!((20..=60).contains(&failed), "{failed} of 200 at rate 0.2");
    }
}

/// `ttft_multiplier` 3 makes the first token three times as late at equal (idle) load, and
/// later tokens are not slowed.
#[tokio::test]
async fn ttft_multiplier_slows_the_first_token_only() {
    let c = client();
    let mut ttft = Vec::new();
    let mut gaps = Vec::new();
    for m in [1.0, 3.0] {
        let p = pod("pod-t", |c| {
            c.ttft_multiplier = m;
            c.prefill_us_per_token = 1000;
            c.decode_us_per_token = 20_000;
        })
        .await;
        let url = format!("{}/v1/chat/completions", p.url());
        let r = send(
            &c,
            "POST",
            &url,
            &chat("s", "one two three four five", 4, true),
            &[],
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200);
        ttft.push(r.frames[0].0.as_secs_f64());
        gaps.push((r.frames[3].0 - r.frames[1].0).as_secs_f64() / 2.0);
        p.shutdown().await;
    }
    let ratio = ttft[1] / ttft[0];
    assert!((2.4..3.6).contains(&ratio), "TTFT {ttft:?}: ratio {ratio}");
    assert!(
        gaps[1] < gaps[0] * 1.5,
        "decode after the first token: {gaps:?}"
    );
}
