//! Data-parallel ranks behind one port (docs/disaggregated-serving.md §5): each rank its own
//! queue and cache, the rank read as the engine reads it, metrics labelled per rank.

mod common;

use ailb_fakepod::pd::fabric::Fabric;
use ailb_fakepod::{EngineKind, Role};
use common::*;
use serde_json::{json, Value};

fn rank_of(s: &Seen) -> Option<u64> {
    s.headers.get("x-fake-rank")?.to_str().ok()?.parse().ok()
}

fn cached(s: &Seen) -> u64 {
    let v: Value = serde_json::from_str(&s.text()).unwrap();
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

#[tokio::test]
async fn vllm_ranks_keep_their_own_caches_and_series() {
    let p = pod("dp", |c| {
        c.dp_ranks = 2;
        c.prefill_us_per_token = 10;
    })
    .await;
    let c = client();
    let url = format!("{}/v1/chat/completions", p.url());
    let body = chat(&"abcd".repeat(200), "q", 1, false);
    let on = |r: &'static str| [("X-Data-Parallel-Rank", r)];
    let a = send(&c, "POST", &url, &body, &on("0")).await.unwrap();
    assert_eq!((a.status, rank_of(&a), cached(&a)), (200, Some(0), 0));
    let b = send(&c, "POST", &url, &body, &on("1")).await.unwrap();
    assert_eq!(
        (rank_of(&b), cached(&b)),
        (Some(1), 0),
        "rank 1 has its own cache"
    );
    let again = send(&c, "POST", &url, &body, &on("0")).await.unwrap();
    assert!(cached(&again) >= 192, "rank 0 kept the prompt");
    // Out of range is a 400; a non-integer is ignored (the balancer picks).
    let out = send(&c, "POST", &url, &body, &on("2")).await.unwrap();
    assert_eq!(out.status, 400);
    assert!(out.text().contains("out of range [0, 2)"));
    assert_eq!(
        send(&c, "POST", &url, &body, &on("-1"))
            .await
            .unwrap()
            .status,
        400
    );
    let junk = send(&c, "POST", &url, &body, &on("one")).await.unwrap();
    assert_eq!(junk.status, 200);
    // An idle pod's balancer spreads consecutive requests over the ranks.
    let mut seen = Vec::new();
    for _ in 0..2 {
        seen.push(rank_of(&send(&c, "POST", &url, &body, &[]).await.unwrap()).unwrap());
    }
    seen.sort();
    assert_eq!(seen, [0, 1]);
    let s = p.state();
    assert_eq!(s.ranks.len(), 2);
    assert_eq!(s.ranks[1].rank, Some(1));
    assert_eq!(
        s.requests_total,
        s.ranks[0].requests_total + s.ranks[1].requests_total
    );
    let m = get(&c, &format!("{}/metrics", p.url())).await;
    let series = ailb_fakepod::metrics::parse_text(&m).unwrap();
    for rank in ["0", "1"] {
        let label = format!("engine=\"{rank}\",model_name=\"fake-model\"");
        assert!(
            series
                .iter()
                .any(|(n, l, _)| n == "vllm:prefix_cache_queries_total" && *l == label),
            "{m}"
        );
    }
    assert_eq!(m.matches("# TYPE vllm:num_requests_running").count(), 1);
}

#[tokio::test]
async fn sglang_ranks_from_header_or_body() {
    let p = pod("sg", |c| {
        c.engine = EngineKind::Sglang;
        c.dp_ranks = 2;
        c.prefill_us_per_token = 10;
    })
    .await;
    let c = client();
    let url = format!("{}/v1/chat/completions", p.url());
    let with = |extra: Value| {
        let mut v: Value = serde_json::from_str(&chat("sys", "q", 1, false)).unwrap();
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v.to_string()
    };
    let b = send(&c, "POST", &url, &with(json!({"routed_dp_rank": 1})), &[])
        .await
        .unwrap();
    assert_eq!(rank_of(&b), Some(1));
    // The header overrides the body.
    let h = send(
        &c,
        "POST",
        &url,
        &with(json!({"routed_dp_rank": 1})),
        &[("x-data-parallel-rank", "0")],
    )
    .await
    .unwrap();
    assert_eq!(rank_of(&h), Some(0));
    let bad = send(
        &c,
        "POST",
        &url,
        &with(json!({})),
        &[("x-data-parallel-rank", "zero")],
    )
    .await
    .unwrap();
    assert_eq!(bad.status, 400, "a non-integer header is a 400 in SGLang");
    let out = send(&c, "POST", &url, &with(json!({"routed_dp_rank": 5})), &[])
        .await
        .unwrap();
    assert_eq!(out.status, 400);
    assert!(out.text().contains("DP rank 5 is not active."));
    let room = send(&c, "POST", &url, &with(json!({"bootstrap_room": 3})), &[])
        .await
        .unwrap();
    assert_eq!(rank_of(&room), Some(1), "room % dp_size");
    let m = get(&c, &format!("{}/metrics", p.url())).await;
    assert!(
        m.contains("sglang:num_running_reqs{model_name=\"fake-model\",dp_rank=\"1\"}"),
        "{m}"
    );
    ailb_fakepod::metrics::parse_text(&m).unwrap();
}

#[tokio::test]
async fn a_prefill_rank_names_itself() {
    let fabric = Fabric::new();
    let p = pod("p", |c| {
        c.role = Role::Prefill;
        c.dp_ranks = 2;
        c.prefill_us_per_token = 10;
        c.pd.fabric = fabric.clone();
    })
    .await;
    let mut v: Value = serde_json::from_str(&chat("sys", "q", 1, false)).unwrap();
    v["kv_transfer_params"] = json!({"do_remote_decode": true});
    let url = format!("{}/v1/chat/completions", p.url());
    let s = send(
        &client(),
        "POST",
        &url,
        &v.to_string(),
        &[("X-data-parallel-rank", "1")],
    )
    .await
    .unwrap();
    let a: Value = serde_json::from_str(&s.text()).unwrap();
    assert_eq!(a["kv_transfer_params"]["remote_engine_id"], "p_dp1");
    assert_eq!(a["kv_transfer_params"]["remote_port"], p.addr.port() + 1);
    let st = p.state();
    assert_eq!(st.ranks[1].pd.as_ref().unwrap().pins_made, 1);
    assert_eq!(st.pd.unwrap().pins_made, 1);
}
