//! The engine-verified prefix index in real Envoy 1.40 (plain-Envoy build, per-proxy index;
//! docs/redis-data-model.md §9): Envoy's own body buffers take the `include_usage` the plugin
//! adds to a stream's request and lose the usage event on the way back, and a pod flushed by
//! `/admin/restart` gets a new generation in shared data, which both workers read.

use ailb_core::verify::flush::FLUSH_CONVERSATIONS;
use ailb_e2e::bed::FLUSH_CONVERSATIONS as CONVERSATIONS;
use ailb_e2e::bed::{busiest, restart_pod, verify_bed as bed, Bed};
use ailb_e2e::envoy::Envoy;
use ailb_e2e::gateway::http;
use ailb_testkit::wait_until;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

fn envoy(bed: &Bed) -> Envoy {
    let pods = bed.pod_addrs();
    let cfg = json!({"lb_policy": "prefix_cache", "lb_config": {
        "endpoints": pods, "debugHeader": "x-ai-lb-debug"}});
    Envoy::start(&pods, &cfg)
}

/// (answering pod, decision reason, body).
fn send(url: &str, body: &Value) -> (String, String, String) {
    let headers = [("content-type", "application/json")];
    let (status, hs, body) = http(
        url,
        "POST",
        "/v1/chat/completions",
        &headers,
        body.to_string().as_bytes(),
    )
    .unwrap();
    let h = |n: &str| {
        hs.iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let text = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(status, 200, "{text}");
    let debug = h("x-ai-lb-debug");
    let reason = debug.rsplit("reason=").next().unwrap_or("").to_string();
    (h("x-pod"), reason, text)
}

fn chat(c: usize, turns: usize) -> Value {
    let mut m = vec![json!({"role": "system", "content": "You answer questions. ".repeat(10)})];
    for t in 0..turns {
        if t > 0 {
            m.push(json!({"role": "assistant", "content": format!("answer {c}.{t}")}));
        }
        let q = format!(
            "conversation {c} question {t}: {}",
            "tell me more ".repeat(20)
        );
        m.push(json!({"role": "user", "content": q}));
    }
    json!({"model": "m", "messages": m, "max_tokens": 2})
}

#[test]
fn envoy_a_stream_is_verified_without_its_client_seeing_the_usage() {
    let bed = bed();
    let envoy = envoy(&bed);
    send(&envoy.url, &chat(0, 1));
    let mut body = chat(0, 2);
    body["stream"] = json!(true);
    let (_, reason, text) = send(&envoy.url, &body);
    assert_eq!(reason, "prefix_hit");
    assert!(text.contains("data: [DONE]"), "{text}");
    assert!(!text.contains("\"usage\""), "{text}");
    assert!(
        wait_until(Duration::from_secs(5), || envoy
            .stat("ai_lb.prefix.verified")
            == 2),
        "both answers verified: {}",
        envoy.stats_text()
    );
    assert!(envoy.stat("ai_lb.prefix.cached_tokens") > 0);
    assert_eq!(envoy.stat("ai_lb.prefix.shortfall"), 0);
    // The per-pod pair, named after the pod's address: the one that served the conversation.
    let per_pod: Vec<i64> = bed
        .pod_addrs()
        .iter()
        .map(|a| envoy.stat(&format!("ai_lb.prefix.verified.{a}.prompt_tokens")))
        .collect();
    assert_eq!(per_pod.iter().filter(|&&n| n > 0).count(), 1, "{per_pod:?}");
    assert_eq!(
        per_pod.iter().sum::<i64>(),
        envoy.stat("ai_lb.prefix.prompt_tokens")
    );
}

#[test]
fn envoy_a_flushed_pods_conversations_stop_being_hits_on_it() {
    let bed = bed();
    let envoy = envoy(&bed);
    let mut pod_of = BTreeMap::new();
    for c in 0..CONVERSATIONS {
        pod_of.insert(c, send(&envoy.url, &chat(c, 1)).0);
    }
    for c in 0..CONVERSATIONS {
        let (pod, reason, _) = send(&envoy.url, &chat(c, 2));
        assert_eq!(
            (&pod, reason.as_str()),
            (&pod_of[&c], "prefix_hit"),
            "conversation {c}"
        );
    }
    // Flush the pod holding the most conversations (at least half of them).
    let flushed = busiest(&pod_of);
    let mut on_it = (0..CONVERSATIONS).filter(|c| pod_of[c] == flushed);
    let first = on_it.next().unwrap();
    let others: Vec<usize> = on_it.collect();
    assert!(
        others.len() >= 2 * FLUSH_CONVERSATIONS,
        "too few other conversations on {flushed}: {pod_of:?}"
    );
    restart_pod(&bed, &flushed);
    // Turns predicted as hits there come back with nothing cached until the third unrelated on
    // one worker bumps the pod's generation (verify/flush.rs FLUSH_CONVERSATIONS; 2 workers).
    let (pod3, reason3, _) = send(&envoy.url, &chat(first, 3));
    assert_eq!((&pod3, reason3.as_str()), (&flushed, "prefix_hit"));
    let mut rest = others.iter();
    let mut bumper = 0;
    for &c in rest.by_ref() {
        bumper = c;
        let (pod, reason, _) = send(&envoy.url, &chat(c, 3));
        assert_eq!((&pod, reason.as_str()), (&flushed, "prefix_hit"));
        let bumped = wait_until(Duration::from_millis(500), || {
            envoy.stat("ai_lb.prefix.generation_bumps") == 1
        });
        if bumped {
            break;
        }
    }
    assert_eq!(envoy.stat("ai_lb.prefix.generation_bumps"), 1);
    let left: Vec<usize> = rest.copied().collect();
    assert!(
        !left.is_empty(),
        "every conversation was needed to find out"
    );
    for c in left {
        let (pod, reason, _) = send(&envoy.url, &chat(c, 3));
        assert!(
            !(pod == flushed && reason == "prefix_hit"),
            "conversation {c} still predicted as a hit on the flushed pod"
        );
    }
    // The conversation whose answer bumped was re-recorded at the new generation.
    let (pod4, reason4, _) = send(&envoy.url, &chat(bumper, 4));
    assert_eq!((&pod4, reason4.as_str()), (&flushed, "prefix_hit"));
}
