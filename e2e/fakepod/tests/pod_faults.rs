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
