//! Prefill and decode roles per engine dialect (docs/disaggregated-serving.md §1, §2, §4):
//! a prefill pod's answer names its KV, a decode pod given it pulls instead of prefilling.

mod common;

use ailb_fakepod::pd::fabric::Fabric;
use ailb_fakepod::{EngineKind, LoadFailurePolicy, PodConfig, PodHandle, Role};
use common::*;
use serde_json::{json, Value};
use std::time::Duration;

/// 512 prompt tokens at 400 us each (~200 ms of prefill) against 1 us each to transfer.
fn tuned(c: &mut PodConfig, engine: EngineKind, role: Role, fabric: &Fabric) {
    c.engine = engine;
    c.role = role;
    c.prefill_us_per_token = 400;
    c.pd.kv_bytes_per_token = 1_000;
    c.pd.link_bytes_per_s = 1e9;
    c.pd.fabric = fabric.clone();
}

async fn pair(engine: EngineKind, d: impl FnOnce(&mut PodConfig)) -> (PodHandle, PodHandle) {
    let fabric = Fabric::new();
    let p = pod("p", |c| tuned(c, engine, Role::Prefill, &fabric)).await;
    let dec = pod("d", |c| {
        tuned(c, engine, Role::Decode, &fabric);
        d(c);
    })
    .await;
    (p, dec)
}

fn body(max_tokens: u64, stream: bool, extra: Value) -> Value {
    let mut v: Value =
        serde_json::from_str(&chat(&"abcd".repeat(500), "q", max_tokens, stream)).unwrap();
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

async fn post(p: &PodHandle, path: &str, v: &Value) -> (Seen, Value) {
    let s = send(
        &client(),
        "POST",
        &format!("{}{path}", p.url()),
        &v.to_string(),
        &[],
    )
    .await
    .unwrap();
    let j = serde_json::from_str(&s.text()).unwrap_or(Value::Null);
    (s, j)
}

const CHAT: &str = "/v1/chat/completions";

fn to_p() -> Value {
    json!({"kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false,
        "remote_engine_id": null, "remote_block_ids": null, "remote_host": null, "remote_port": null}})
}

#[tokio::test]
async fn vllm_prefill_names_its_blocks_and_decode_pulls_them() {
    let (p, d) = pair(EngineKind::VllmV1, |_| {}).await;
    let (s, a) = post(&p, CHAT, &body(1, false, to_p())).await;
    assert_eq!(s.status, 200);
    let kv = &a["kv_transfer_params"];
    assert_eq!(kv["do_remote_prefill"], true);
    assert_eq!(kv["remote_engine_id"], "p");
    assert_eq!(kv["remote_host"], "127.0.0.1");
    assert_eq!(kv["remote_port"], p.addr.port());
    assert_eq!(kv["tp_size"], 1);
    assert!(kv["remote_request_id"].is_string());
    let blocks = kv["remote_block_ids"][0].as_array().unwrap().len() as u64;
    assert!(blocks >= 30, "{blocks} blocks");
    let ps = p.state().pd.unwrap();
    assert_eq!(
        (ps.role.as_str(), ps.pins_made, ps.pinned_blocks),
        ("prefill", 1, blocks)
    );
    // The decode pod gets the client's body with the prefill's parameters.
    let (s, a) = post(&d, CHAT, &body(3, false, json!({"kv_transfer_params": kv}))).await;
    assert_eq!(s.status, 200, "{a}");
    assert!(
        s.total < Duration::from_millis(100),
        "pulled, not prefilled: {:?}",
        s.total
    );
    assert_eq!(a["usage"]["completion_tokens"], 3);
    let ds = d.state();
    let dpd = ds.pd.clone().unwrap();
    assert_eq!(
        (dpd.transfers_received, dpd.tokens_transferred),
        (1, ds.prompt_tokens_total)
    );
    assert!(
        ds.cache_blocks_used as u64 >= blocks,
        "transferred blocks are cached"
    );
    let ps = p.state().pd.unwrap();
    assert_eq!(
        (ps.pins_read, ps.pinned_blocks),
        (1, 0),
        "P lets its blocks go once read"
    );
    // The same parameters again: P no longer holds the blocks; the default policy fails.
    let (s, a) = post(&d, CHAT, &body(3, false, json!({"kv_transfer_params": kv}))).await;
    assert_eq!(s.status, 500, "{a}");
    let dpd = d.state().pd.unwrap();
    assert_eq!((dpd.load_failures, dpd.failed_requests), (1, 1));
}

#[tokio::test]
async fn vllm_decode_without_or_with_bad_params_prefills_itself() {
    let (p, d) = pair(EngineKind::VllmV1, |_| {}).await;
    let (_, a) = post(&p, CHAT, &body(1, false, to_p())).await;
    let kv = a["kv_transfer_params"].clone();
    let (s, _) = post(&d, CHAT, &body(2, false, json!({}))).await;
    assert_eq!(s.status, 200);
    assert!(
        s.total > Duration::from_millis(150),
        "prefilled itself: {:?}",
        s.total
    );
    let mut wrong = kv.clone();
    wrong["remote_port"] = json!("80");
    let mut no_id = kv.clone();
    no_id.as_object_mut().unwrap().remove("remote_request_id");
    for bad in [wrong, no_id] {
        let (s, _) = post(
            &d,
            CHAT,
            &body(1, false, json!({"kv_transfer_params": bad})),
        )
        .await;
        assert_eq!(s.status, 200);
    }
    let (s, _) = post(
        &d,
        CHAT,
        &body(1, false, json!({"kv_transfer_params": "yes"})),
    )
    .await;
    assert_eq!(s.status, 400, "not a dict: a validation error");
    let dpd = d.state().pd.unwrap();
    assert_eq!(
        (
            dpd.self_prefill_missing,
            dpd.self_prefill_invalid,
            dpd.transfers_received
        ),
        (1, 2, 0)
    );
    // An unknown engine, or the right one at another address: the pull fails.
    let mut other = kv.clone();
    other["remote_engine_id"] = json!("nobody");
    let mut moved = kv.clone();
    moved["remote_port"] = json!(1);
    for bad in [other, moved] {
        let (s, _) = post(
            &d,
            CHAT,
            &body(1, false, json!({"kv_transfer_params": bad})),
        )
        .await;
        assert_eq!(s.status, 500);
    }
    assert_eq!(d.state().pd.unwrap().load_failures, 2);
    assert_eq!(
        p.state().pd.unwrap().pinned_blocks,
        kv["remote_block_ids"][0].as_array().unwrap().len() as u64
    );
}

#[tokio::test]
async fn a_failing_link_follows_the_load_failure_policy() {
    for policy in [LoadFailurePolicy::Recompute, LoadFailurePolicy::Fail] {
        let (p, d) = pair(EngineKind::VllmV1, |c| {
            c.pd.transfer_fails = true;
            c.pd.load_failure_policy = policy;
        })
        .await;
        let (_, a) = post(&p, CHAT, &body(1, false, to_p())).await;
        let kv = &a["kv_transfer_params"];
        let (s, a) = post(&d, CHAT, &body(2, true, json!({"kv_transfer_params": kv}))).await;
        assert_eq!(s.status, 200, "a stream's headers are out before the pull");
        let text = s.text();
        match policy {
            LoadFailurePolicy::Recompute => {
                assert!(text.contains("[DONE]") && !text.contains("error"), "{text}");
                assert!(s.frames[0].0 > Duration::from_millis(150), "recomputed");
            }
            LoadFailurePolicy::Fail => {
                assert!(
                    text.contains("\"error\"") && text.contains("KV load failed"),
                    "{text} {a}"
                );
            }
        }
        let dpd = d.state().pd.unwrap();
        assert_eq!(dpd.load_failures, 1);
        assert_eq!(
            dpd.failed_requests,
            u64::from(policy == LoadFailurePolicy::Fail)
        );
        assert!(
            p.state().pd.unwrap().pinned_blocks > 0,
            "an unread pin stays until its timeout"
        );
    }
}

#[tokio::test]
async fn unread_pins_expire() {
    let fabric = Fabric::new();
    let p = pod("p", |c| {
        tuned(c, EngineKind::VllmV1, Role::Prefill, &fabric);
        c.prefill_us_per_token = 10;
        c.pd.pin_timeout_us = 1_000;
    })
    .await;
    let (_, a) = post(&p, CHAT, &body(1, false, to_p())).await;
    assert!(a["kv_transfer_params"].is_object());
    tokio::time::sleep(Duration::from_millis(10)).await;
    let ps = p.state().pd.unwrap();
    assert_eq!((ps.pins_expired, ps.pinned_blocks), (1, 0));
    // A colocated pod ignores the parameters altogether, as vLLM without a connector does.
    let plain = pod("c", |c| c.prefill_us_per_token = 10).await;
    let (s, a) = post(&plain, CHAT, &body(1, false, to_p())).await;
    assert_eq!(s.status, 200);
    assert!(a.get("kv_transfer_params").is_none() && plain.state().pd.is_none());
}

#[tokio::test]
async fn sglang_decode_waits_for_its_room() {
    let (p, d) = pair(EngineKind::Sglang, |c| c.pd.bootstrap_timeout_us = 600_000).await;
    let room = json!({"bootstrap_host": "127.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 7});
    // Both at once, as mini_lb sends them; the decode pod's answer waits for P's prefill.
    let (dv, pv) = (body(2, true, room.clone()), body(2, true, room.clone()));
    let (ds, ps) = tokio::join!(post(&d, CHAT, &dv), post(&p, CHAT, &pv));
    assert_eq!((ds.0.status, ps.0.status), (200, 200));
    assert!(ds.0.text().contains("[DONE]") && !ds.0.text().contains("error"));
    let dpd = d.state().pd.unwrap();
    assert_eq!(dpd.transfers_received, 1);
    assert_eq!(p.state().pd.unwrap().pins_read, 1);
    assert_eq!(p.state().generation_tokens_total, 1, "P makes one token");
    // A room nobody prefills: the decode pod gives up.
    let lost = json!({"bootstrap_host": "127.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 8});
    let (s, a) = post(&d, CHAT, &body(2, false, lost)).await;
    assert_eq!(s.status, 500, "{a}");
    assert_eq!(d.state().pd.unwrap().room_timeouts, 1);
    // Wrong types and missing fields.
    let (s, _) = post(
        &d,
        CHAT,
        &body(1, false, json!({"bootstrap_room": "seven"})),
    )
    .await;
    assert_eq!(s.status, 400);
    let (s, _) = post(&d, CHAT, &body(1, false, json!({"bootstrap_room": 9}))).await;
    assert_eq!(s.status, 200);
    assert_eq!(
        d.state().pd.unwrap().self_prefill_invalid,
        1,
        "no bootstrap_host"
    );
}

#[tokio::test]
async fn trtllm_context_and_generation() {
    let (p, d) = pair(EngineKind::TrtLlm, |_| {}).await;
    let prompt = "abcd".repeat(500);
    let ctx = json!({"model": "fake-model", "prompt": prompt, "max_tokens": 5, "stream": false,
        "disaggregated_params": {"request_type": "context_only", "disagg_request_id": 99}});
    let (s, a) = post(&p, "/v1/completions", &ctx).await;
    assert_eq!(s.status, 200, "{a}");
    let dp = a["choices"][0]["disaggregated_params"].clone();
    assert_eq!(dp["disagg_request_id"], 99);
    assert!(dp["ctx_request_id"].is_u64() && dp["encoded_opaque_state"].is_string());
    assert_eq!(
        a["usage"]["completion_tokens"], 1,
        "context_only makes one token"
    );
    let ids = a["prompt_token_ids"].clone();
    assert_eq!(ids.as_array().unwrap().len(), 500);
    let mut gp = dp.clone();
    gp["request_type"] = json!("generation_only");
    let gen = json!({"model": "fake-model", "prompt": ids, "max_tokens": 4, "stream": false,
        "disaggregated_params": gp});
    let (s, a) = post(&d, "/v1/completions", &gen).await;
    assert_eq!(s.status, 200, "{a}");
    assert_eq!(
        a["usage"]["prompt_tokens"], 500,
        "answered from the prefilled text"
    );
    assert_eq!(d.state().pd.unwrap().transfers_received, 1);
    for (bad, status) in [
        (json!({"request_type": "both"}), 400),
        (json!({"ctx_request_id": 1}), 400),
        (json!("context_only"), 400),
        (
            json!({"request_type": "generation_only", "ctx_request_id": 1, "encoded_opaque_state": "!!"}),
            200,
        ),
    ] {
        let v = json!({"model": "fake-model", "prompt": "hi", "max_tokens": 1, "disaggregated_params": bad});
        assert_eq!(
            post(&d, "/v1/completions", &v).await.0.status,
            status,
            "{bad}"
        );
    }
    assert_eq!(d.state().pd.unwrap().self_prefill_invalid, 1);
}

#[tokio::test]
async fn a_decode_pod_with_a_prefill_lane_pulls_beside_it() {
    let (p, d) = pair(EngineKind::VllmV1, |c| c.prefill_tokens_per_s = 2_000.0).await;
    let (_, a) = post(&p, CHAT, &body(1, false, to_p())).await;
    let kv = &a["kv_transfer_params"];
    let (s, a) = post(&d, CHAT, &body(2, false, json!({"kv_transfer_params": kv}))).await;
    assert_eq!(s.status, 200, "{a}");
    assert!(
        s.total < Duration::from_millis(100),
        "not through the lane: {:?}",
        s.total
    );
    let st = d.state();
    assert_eq!(
        st.prefix_query_tokens, st.prompt_tokens_total,
        "looked up once"
    );
    // The pulled prompt is now cached on the decode pod: a plain request hits it.
    let (_, a) = post(&d, CHAT, &body(1, false, json!({}))).await;
    assert!(
        a["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            >= 496
    );
}
