//! Agent sessions in the plain-Envoy build, in real Envoy 1.40 (docs/sessions-and-queues.md
//! "Agent sessions"): without any session key, a Responses chain continues on the pod that
//! produced its previous answer — recorded in the proxy's shared data, so every worker of the
//! proxy finds it — and an agent's own session header keeps its pod on two proxies that share
//! nothing (consistent hashing). The fake pods keep responses per pod, as vLLM does: a
//! continuation sent elsewhere would be a 404.

use ailb_e2e::bed::{chat_body, Bed};
use ailb_e2e::envoy::Envoy;
use ailb_e2e::gateway::http;
use serde_json::{json, Value};
use std::collections::HashSet;

/// (status, answering pod, debug reason, the answer's id) of one request.
fn send(
    url: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, String, Option<String>) {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    let (status, hs, body) = http(url, "POST", path, &all, body).unwrap();
    let h = |n: &str| {
        hs.iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let reason = h("x-ai-lb-debug")
        .rsplit("reason=")
        .next()
        .unwrap_or_default()
        .to_string();
    let id = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v["id"].as_str().map(String::from));
    (status, h("x-pod"), reason, id)
}

#[test]
fn envoy_responses_chains_and_agent_headers_keep_their_pod() {
    let bed = Bed::new(3, |c| {
        c.max_running = 64;
        c.decode_us_per_token = 1_000;
    });
    let pods = bed.pod_addrs();
    // prefix_cache reads the body (a continuation names its previous response there).
    let plugin = json!({"lb_policy": "prefix_cache", "lb_config": {
        "endpoints": pods, "debugHeader": "x-ai-lb-debug"}});
    let envoys = [Envoy::start(&pods, &plugin), Envoy::start(&pods, &plugin)];
    let responses = |c: usize, t: usize, previous: Option<&str>| {
        let mut body = json!({"model": "fake-model", "max_output_tokens": 2,
            "input": format!("chain {c} turn {t} ").repeat(30)});
        if let Some(p) = previous {
            body["previous_response_id"] = json!(p);
        }
        body.to_string().into_bytes()
    };
    let mut firsts = HashSet::new();
    for c in 0..8 {
        let url = &envoys[c % 2].url;
        let (status, first, _, id) = send(url, "/v1/responses", &[], &responses(c, 0, None));
        assert_eq!(status, 200);
        firsts.insert(first.clone());
        let mut prev = id.expect("the answer names itself");
        for t in 1..5 {
            let (status, pod, reason, id) =
                send(url, "/v1/responses", &[], &responses(c, t, Some(&prev)));
            assert_eq!(
                (status, pod.as_str(), reason.as_str()),
                (200, first.as_str(), "continuation"),
                "chain {c} turn {t}: {}",
                envoys[c % 2].logs()
            );
            prev = id.unwrap();
        }
    }
    assert!(firsts.len() >= 2, "chains spread over the pods: {firsts:?}");
    let stat = |name: &str| envoys.iter().map(|e| e.stat(name)).sum::<i64>();
    assert_eq!(stat("ai_lb.session.response_recorded"), 40);
    assert_eq!(stat("ai_lb.session.hit"), 32);
    // Another proxy did not record it: unknown there, placed by the policy (and the pod that
    // does not know it answers 404).
    let (_, _, _, id) = send(&envoys[0].url, "/v1/responses", &[], &responses(9, 0, None));
    let (_, _, reason, _) = send(
        &envoys[1].url,
        "/v1/responses",
        &[],
        &responses(9, 1, id.as_deref()),
    );
    assert_ne!(reason, "continuation");
    assert!(stat("ai_lb.session.continuation_unknown") >= 1);
    // An agent's own header: the same pod from both proxies, without configuration.
    let h = [("x-claude-code-session-id", "cc-envoy-1")];
    let body = chat_body("hello", 2);
    let (_, home, reason, _) = send(&envoys[0].url, "/v1/chat/completions", &h, &body);
    assert_eq!(reason, "agent_session");
    for i in 0..6 {
        let (status, pod, reason, _) = send(&envoys[i % 2].url, "/v1/chat/completions", &h, &body);
        assert_eq!(
            (status, pod.as_str(), reason.as_str()),
            (200, home.as_str(), "agent_session")
        );
    }
}
