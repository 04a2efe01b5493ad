//! The engine-verified prefix index end to end (docs/redis-data-model.md §5 "Engine-verified
//! keys"): the built plugin in the emulator with Redis and fake pods that report
//! `cached_tokens`. A pod flushed by `/admin/restart` answers its conversations' next turns
//! with nothing cached; at the third unrelated conversation answered so the plugin bumps its
//! generation, so its other conversations are no longer predicted as hits on it, and the
//! conversation that found out keeps its pod. A pod that only evicts is not forgotten whole. A streamed request without `include_usage` is asked for its usage,
//! and its client never sees it.

use ailb_core::verify::flush::FLUSH_CONVERSATIONS;
use ailb_e2e::bed::FLUSH_CONVERSATIONS as CONVERSATIONS;
use ailb_e2e::bed::{busiest, restart_pod, verify_bed as bed, wait_for_zero, Bed};
use ailb_e2e::gateway::{http, Gateway, GatewaySpec};
use ailb_e2e::metrics::{metrics_check_path, wait_pages_stored};
use ailb_testkit::wait_until;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

const DEBUG: &str = "x-ai-lb-debug";

fn gateway(bed: &Bed) -> Gateway {
    bed.gateway(&spec(bed, "px-verify"))
}

/// The prefix_cache route as a user configures it, with the debug header.
fn spec(bed: &Bed, id: &str) -> GatewaySpec {
    let cfg = json!({"lb_policy": "prefix_cache", "lb_config": {
        "serviceFQDN": "redis.static", "servicePort": bed.redis.port, "timeout": 1000,
        "debugHeader": DEBUG}});
    bed.spec(id, Some(cfg))
}

/// Every conversation's first two turns, the second a hit on the first's pod: the pod of each.
fn warm(gw: &Gateway) -> BTreeMap<usize, String> {
    let mut pod_of = BTreeMap::new();
    for c in 0..CONVERSATIONS {
        pod_of.insert(c, send(gw, &chat(c, 1)).0);
    }
    for c in 0..CONVERSATIONS {
        let (pod, reason, _) = send(gw, &chat(c, 2));
        assert_eq!(
            (pod.as_str(), reason.as_str()),
            (pod_of[&c].as_str(), "prefix_hit")
        );
    }
    pod_of
}

/// One chat turn: (pod address, decision reason, response body).
fn send(gw: &Gateway, body: &Value) -> (String, String, String) {
    let (status, headers, body) = http(
        &gw.url,
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    )
    .unwrap();
    assert_eq!(status, 200);
    let debug = headers
        .iter()
        .find(|(k, _)| k == DEBUG)
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let field = |name: &str| {
        debug
            .split("; ")
            .find_map(|f| f.strip_prefix(name))
            .unwrap_or("")
            .to_string()
    };
    (
        field("endpoint="),
        field("reason="),
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// Conversation `c`'s body at `turns` user turns (long ones: the shortfall rule needs more
/// than a block between the prediction and a flushed pod's answer).
fn conversation(c: usize, turns: usize) -> Vec<Value> {
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
    m
}

fn chat(c: usize, turns: usize) -> Value {
    json!({"model": "fake-model", "messages": conversation(c, turns), "max_tokens": 2})
}

#[test]
fn a_flushed_pods_conversations_stop_being_hits_on_it() {
    let bed = bed();
    let gw = gateway(&bed);
    let pod_of = warm(&gw);
    let verified = gw.stat("ai_lb.prefix.verified");
    assert!(verified >= 40, "{verified} of 40 answers verified");
    assert_eq!(
        gw.stat("ai_lb.prefix.shortfall"),
        0,
        "warm pods had what was predicted"
    );
    assert!(gw.stat("ai_lb.prefix.cached_tokens") > 0);
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
    // Its next turn is still predicted as a hit there, and comes back with nothing cached; so
    // do the next turns of its other conversations, until the third such conversation on one
    // worker bumps the pod's generation (verify/flush.rs FLUSH_CONVERSATIONS; 2 workers).
    let (pod3, reason3, _) = send(&gw, &chat(first, 3));
    assert_eq!(
        (pod3.as_str(), reason3.as_str()),
        (flushed.as_str(), "prefix_hit")
    );
    let mut rest = others.iter();
    let mut bumper = 0;
    for &c in rest.by_ref() {
        bumper = c;
        let (pod, reason, _) = send(&gw, &chat(c, 3));
        assert_eq!(
            (pod.as_str(), reason.as_str()),
            (flushed.as_str(), "prefix_hit")
        );
        let bumped = wait_until(Duration::from_millis(500), || {
            gw.stat("ai_lb.prefix.generation_bumps") == 1
        });
        if bumped {
            break;
        }
    }
    let shortfalls = gw.stat("ai_lb.prefix.shortfall");
    assert_eq!(
        gw.stat("ai_lb.prefix.generation_bumps"),
        1,
        "{shortfalls} shortfalls"
    );
    let needed = FLUSH_CONVERSATIONS as i64;
    assert!(
        (needed..2 * needed).contains(&shortfalls),
        "{shortfalls} shortfalls"
    );
    // The pod's other conversations: no longer hits on it.
    let left: Vec<usize> = rest.copied().collect();
    assert!(
        !left.is_empty(),
        "every conversation was needed to find out"
    );
    for c in left {
        let (pod, reason, _) = send(&gw, &chat(c, 3));
        assert!(
            !(pod == flushed && reason == "prefix_hit"),
            "conversation {c} still predicted as a hit on the flushed pod"
        );
    }
    // The conversation whose answer bumped was re-written at the new generation: still its
    // pod's.
    let (pod4, reason4, _) = send(&gw, &chat(bumper, 4));
    assert_eq!(
        (pod4.as_str(), reason4.as_str()),
        (flushed.as_str(), "prefix_hit")
    );
    assert_eq!(gw.stat("ai_lb.prefix.generation_bumps"), 1);
    assert!(wait_for_zero(&bed, Duration::from_secs(5)).is_zero());
}

#[test]
fn a_stream_is_verified_without_its_client_seeing_the_usage() {
    let bed = bed();
    let gw = gateway(&bed);
    send(&gw, &chat(0, 1));
    let before = gw.stat("ai_lb.prefix.verified");
    let mut body = chat(0, 2);
    body["stream"] = json!(true);
    let (_, reason, text) = send(&gw, &body);
    assert_eq!(reason, "prefix_hit");
    assert!(text.contains("data: [DONE]"), "{text}");
    assert!(
        !text.contains("\"usage\""),
        "the client did not ask for usage: {text}"
    );
    assert!(
        wait_until(Duration::from_secs(5), || gw.stat("ai_lb.prefix.verified")
            == before + 1),
        "the stream's usage was read"
    );
    assert!(gw.stat("ai_lb.prefix.cached_tokens") > 0);
    let per_pod: i64 = bed
        .pod_addrs()
        .iter()
        .map(|a| gw.stat(&format!("ai_lb.prefix.verified.{a}.cached_tokens")))
        .sum();
    assert_eq!(per_pod, gw.stat("ai_lb.prefix.cached_tokens"), "per pod");
    // A client that asked for usage gets its usage event.
    body["stream_options"] = json!({"include_usage": true});
    let (_, _, text) = send(&gw, &chat_with(&body, 3));
    assert!(text.contains("\"choices\":[]"), "{text}");
    assert!(text.contains("\"cached_tokens\""), "{text}");
    assert!(wait_until(Duration::from_secs(5), || {
        gw.stat("ai_lb.prefix.verified") == before + 2
    }));
    assert_eq!(gw.stat("ai_lb.prefix.verify_no_usage"), 0);
}

/// `body` with conversation 0 at `turns` turns.
fn chat_with(body: &Value, turns: usize) -> Value {
    let mut b = body.clone();
    b["messages"] = Value::Array(conversation(0, turns));
    b
}

/// A restart seen in the host list's metrics (Higress keeps each pod's health-check body there,
/// `store_metrics`): the pod's changed `process_start_time_seconds` bumps its generation within
/// a second, before any of its conversations comes back short, so none of them is sent to it
/// as a hit (core/src/balancer/policies/prefix_cache/restarts.rs).
#[test]
fn a_restart_in_the_host_lists_metrics_drops_the_pods_prefixes_at_once() {
    let bed = bed();
    let id = "px-restart";
    let mut spec = spec(&bed, id);
    spec.health_check = Some(json!({"path": metrics_check_path(id), "interval_ms": 100,
        "timeout_ms": 2000, "unhealthy_threshold": 3, "healthy_threshold": 1,
        "store_metrics": true}));
    let gw = bed.gateway(&spec);
    assert!(wait_pages_stored(&bed.pods, &[id]));
    let pod_of = warm(&gw);
    let flushed = busiest(&pod_of);
    restart_pod(&bed, &flushed);
    assert!(wait_pages_stored(&bed.pods, &[id]));
    // Each worker reads the host list at most once a second, at a decision.
    let bumped = wait_until(Duration::from_secs(5), || {
        send(&gw, &chat(1_000, 1));
        gw.stat("ai_lb.prefix.generation_bumps") >= 1
    });
    assert!(bumped, "no bump: {:?}", gw.stats());
    for c in (0..CONVERSATIONS).filter(|c| pod_of[c] == flushed) {
        let (pod, reason, _) = send(&gw, &chat(c, 3));
        assert!(
            !(pod == flushed && reason == "prefix_hit"),
            "conversation {c} still predicted as a hit on the restarted pod"
        );
    }
    assert_eq!(
        gw.stat("ai_lb.prefix.shortfall"),
        0,
        "found out before any answer"
    );
}

/// KV of [`an_evicting_pod_keeps_its_other_conversations`]'s pod, in 16-token blocks (its prefix
/// cache lives in the same KV).
const EVICT_KV_BLOCKS: u64 = 600;

/// Chat body `content` after the system prompt, straight to `pod` (not through the plugin).
fn to_pod(pod: &str, content: &str, max_tokens: u64) {
    let body = json!({"model": "fake-model", "max_tokens": max_tokens, "messages": [
        {"role": "system", "content": "You answer questions."},
        {"role": "user", "content": content}]});
    let (status, _, _) = http(
        pod,
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    )
    .unwrap();
    assert_eq!(status, 200);
}

/// A streamed chat turn straight to the pod at `addr`, left once its first event arrives: its
/// prompt is prefilled and cached, and the client going away cancels the rest (its KV freed,
/// its answer never cached).
fn to_pod_and_leave(addr: std::net::SocketAddr, content: &str, max_tokens: u64) {
    use std::io::{Read, Write};
    let body = json!({"model": "fake-model", "max_tokens": max_tokens, "stream": true,
        "messages": [{"role": "system", "content": "You answer questions."},
                     {"role": "user", "content": content}]})
    .to_string();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: pod\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("data:") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
}

/// An evicting pod, not a flushed one (docs/redis-data-model.md §5 step 4): under memory
/// pressure (a long answer holding most of the KV, the prefix cache left the rest; LRU, a
/// prompt's first blocks the most recent: the fake pod's engine model, docs/trace-bench.md) it
/// loses the tails of five conversations and keeps their heads and two others. Each of the five
/// comes back short (under half its prediction, some of its own blocks held); the pod is not
/// forgotten whole (the old rule, three short answers in a row on a worker, bumped it), so the
/// two it kept are still hits on it, and answer so.
#[test]
fn an_evicting_pod_keeps_its_other_conversations() {
    let bed = Bed::new(1, |c| {
        c.max_running = 32;
        c.prefill_us_per_token = 1;
        c.decode_us_per_token = 100;
        c.kv_admission = true;
        c.block_tokens = 16;
        c.kv_capacity_tokens = EVICT_KV_BLOCKS * 16;
        c.cache_blocks = EVICT_KV_BLOCKS as usize;
        c.max_output_tokens = 1 << 20;
    });
    let mut spec = spec(&bed, "px-evict");
    spec.workers = 1;
    if let Some((_, cfg)) = spec.plugin.as_mut() {
        // 512-byte blocks (128 tokens): conversations of a few blocks fit a small KV.
        cfg["lb_config"]["blockChunkBytes"] = json!(512);
    }
    let gw = bed.gateway(&spec);
    let pod = bed.pods[0].url();
    let engine = bed.pods[0].engine().clone();
    let used = || engine.snapshot().cache_blocks_used as u64;
    // Conversation `c`'s first user message: `bytes` of its own words.
    let text = |c: &str, bytes: usize| {
        format!("{c} says: {}", "tell me more ".repeat(bytes / 13 + 1))[..bytes].to_string()
    };
    let body = |c: &str, bytes: usize, turns: usize| {
        let mut m = vec![
            json!({"role": "system", "content": "You answer questions."}),
            json!({"role": "user", "content": text(c, bytes)}),
        ];
        for t in 1..turns {
            m.push(json!({"role": "assistant", "content": format!("answer {t}")}));
            m.push(json!({"role": "user", "content": format!("and then {t}?")}));
        }
        json!({"model": "fake-model", "messages": m, "max_tokens": 2})
    };
    let lost = ["p1", "p2", "p3", "p4", "p5"];
    let kept = ["k1", "k2"];
    // First turns: 64 blocks each for the five, 16 for the two sent after them.
    for c in lost {
        assert_eq!(send(&gw, &body(c, 4096, 1)).1, "prefix_miss");
    }
    for c in kept {
        assert_eq!(send(&gw, &body(c, 1024, 1)).1, "prefix_miss");
    }
    // The five's first 16 blocks used again since (a shared document's opening, say): their
    // tails are now the least recently used blocks.
    for c in lost {
        to_pod(&pod, &text(c, 1024), 1);
    }
    let before = used();
    assert!((340..=380).contains(&before), "{before} blocks cached");
    // A long answer takes the KV all but `room` blocks: the cache keeps `room`, evicting
    // the five's tails but 8 blocks (48 each), and none of the two. Its prompt is one block
    // (24 tokens: 95 bytes with the system prompt); it holds that and half its output.
    let room = before + 1 - (5 * 48 - 8);
    let output = 2 * ((EVICT_KV_BLOCKS - room) * 16 - 24);
    to_pod_and_leave(bed.pods[0].addr, &format!("{:<60}", "pressure"), output);
    assert!(wait_until(Duration::from_secs(5), || engine.gauges().0 == 0));
    assert!(used() <= room + 1, "{} blocks cached, room {room}", used());
    // Their next turns: each predicted in full on the pod, each cached its head only.
    for c in lost {
        assert_eq!(send(&gw, &body(c, 4096, 2)).1, "prefix_hit");
    }
    assert!(
        wait_until(Duration::from_secs(5), || {
            gw.stat("ai_lb.prefix.shortfall") == 5
        }),
        "{:?}",
        gw.stats()
    );
    assert_eq!(
        gw.stat("ai_lb.prefix.generation_bumps"),
        0,
        "an evicting pod is not forgotten"
    );
    // The two it kept: still hits, and held.
    let cached = gw.stat("ai_lb.prefix.cached_tokens");
    for c in kept {
        assert_eq!(send(&gw, &body(c, 1024, 2)).1, "prefix_hit");
    }
    assert!(wait_until(Duration::from_secs(5), || {
        gw.stat("ai_lb.prefix.verified") == 14
    }));
    assert!(
        gw.stat("ai_lb.prefix.cached_tokens") - cached >= 2 * 256,
        "{:?}",
        gw.stats()
    );
    assert_eq!(gw.stat("ai_lb.prefix.shortfall"), 5);
    // A conversation that came back short keeps its pod, which has just recomputed it.
    assert_eq!(send(&gw, &body("p1", 4096, 3)).1, "prefix_hit");
    assert_eq!(gw.stat("ai_lb.prefix.generation_bumps"), 0);
    assert!(wait_for_zero(&bed, Duration::from_secs(5)).is_zero());
}
