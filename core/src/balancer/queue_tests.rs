//! The waiting queue (docs/sessions-and-queues.md "Waiting queue") against the mock host: a request refused for want
//! of room waits (held) instead, is admitted on a tick or a local release, highest class then
//! arrival first, one acquire per chance; its deadline answers the 429 it would have got; a
//! client gone while waiting leaves nothing; the Redis waiter entry comes and goes.

use super::tests::{configured, deliver};
use super::*;
use crate::config::Build;
use crate::host::mock::MockHost;
use crate::redis::resp::encode_command;
use crate::redis::scripts::Scripts;
use serde_json::{json, Value};

const CLUSTER: &str = "outbound|8000||llm.static";
const PRIO: &str = "x-priority";
const DEBUG: &str = "x-ai-lb-debug";
const WAIT_KEY: &str = "ailb:{chat|outbound|8000||llm.static}:wait";

fn higress(lb: Value) -> (MockHost, Balancer) {
    let mut cfg = json!({"serviceFQDN": "redis.static", "servicePort": 6379,
                         "maxRequestCount": 1, "priorityHeader": PRIO, "debugHeader": DEBUG,
                         "queueTimeoutMs": 1000});
    if let (Value::Object(a), Value::Object(b)) = (&mut cfg, lb) {
        a.extend(b);
    }
    let doc = json!({"lb_policy": "global_least_request", "lb_config": cfg});
    let config = PluginConfig::parse(doc.to_string().as_bytes()).unwrap();
    let mut host = MockHost::new()
        .with_route("chat", CLUSTER)
        .with_hosts(&[("10.0.0.1:80", "Healthy"), ("10.0.0.2:80", "Healthy")]);
    host.now_ms = 1_000_000;
    configured(host, config)
}

fn words(q: &[u8]) -> Vec<String> {
    match crate::redis::resp::decode_exact(q).unwrap() {
        crate::redis::resp::Value::Array(Some(items)) => items
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect(),
        other => panic!("{other:?}"),
    }
}

/// The acquire calls sent since `from`: (token, request id, wait rank argument).
fn acquires(host: &MockHost, from: usize, first_token: u32) -> Vec<(u32, String, String)> {
    host.redis_calls
        .iter()
        .enumerate()
        .skip(from)
        .filter_map(|(n, (_, q))| {
            let w = words(q);
            (w[0] == "EVALSHA" || w[0] == "EVAL").then(|| {
                let keys: usize = w[2].parse().unwrap();
                let argv = |i: usize| w[2 + keys + i].clone();
                (first_token + 4 * (n - from) as u32, argv(3), argv(16))
            })
        })
        .collect()
}

/// The request id (ARGV[3]) of an acquire call.
fn rid_of(q: &[u8]) -> String {
    let w = words(q);
    let keys: usize = w[2].parse().unwrap();
    w[3 + keys + 2].clone()
}

/// The plain commands (ZADD / ZREM) sent to the wait set.
fn waiter_calls(host: &MockHost) -> Vec<Vec<String>> {
    host.redis_calls
        .iter()
        .map(|(_, q)| words(q))
        .filter(|w| w.get(1).map(String::as_str) == Some(WAIT_KEY))
        .collect()
}

/// Starts a Higress request of `class` whose acquire Redis answers FULL: it waits.
/// Returns its request id.
fn queued(host: &mut MockHost, e: &mut Balancer, ctx: u32, class: &str) -> String {
    host.request_headers = vec![(PRIO.to_string(), class.to_string())];
    host.live_contexts.push(ctx);
    assert_eq!(e.on_request_headers(host, ctx, false), Verdict::Pause);
    let from = host.redis_calls.len();
    let token = host.next_token;
    assert_eq!(e.on_request_body(host, ctx, 20, true), Verdict::Pause);
    let sent = acquires(host, from, token);
    assert_eq!(sent.len(), 1);
    deliver(host, e, token, &encode_command(&["FULL", "1"]));
    assert!(host.local_responses.is_empty(), "it waits instead of a 429");
    sent[0].1.clone()
}

fn picked(endpoint: &str) -> Vec<u8> {
    encode_command(&["OK", endpoint, "0", "0", "0", "0"])
}

fn debug_header(host: &MockHost) -> String {
    host.response_headers
        .iter()
        .find(|(k, _)| k == DEBUG)
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

#[test]
fn a_full_pool_queues_and_a_tick_admits_with_queued_ms() {
    let (mut host, mut e) = higress(json!({}));
    queued(&mut host, &mut e, 2, "sheddable");
    assert_eq!(host.metric("ai_lb.queue.queued"), 1);
    assert_eq!(e.queued(), 1);
    assert_eq!(host.resumed, 0);
    // The waiter is in the route's wait set, scored by class and deadline.
    let w = waiter_calls(&host);
    assert_eq!(w.len(), 1);
    assert_eq!(w[0][0], "ZADD");
    assert_eq!(w[0][2], (2 * WAIT_RANK + 1_001_000).to_string());
    let member = w[0][3].clone();
    assert_eq!(host.tick_ms, Some(50), "the queue ticks");

    host.now_ms += 120;
    let from = host.redis_calls.len();
    let token = host.next_token;
    e.on_tick(&mut host);
    let retry = acquires(&host, from, token);
    assert_eq!(retry.len(), 1, "one acquire per tick");
    assert_eq!(retry[0].2, "2", "the retry carries its class rank");
    deliver(&mut host, &mut e, token, &picked("10.0.0.2:80"));
    assert_eq!(host.resumed, 1, "admitted: the held request goes on");
    assert_eq!(host.override_host.as_deref(), Some("10.0.0.2:80"));
    assert_eq!(host.metric("ai_lb.queue.admitted"), 1);
    assert_eq!(host.metric("ai_lb.glr.routed"), 1);
    assert_eq!(e.queued(), 0);
    let w = waiter_calls(&host);
    assert_eq!(w.last().unwrap(), &["ZREM", WAIT_KEY, member.as_str()]);

    host.response_headers = vec![(":status".into(), "200".into())];
    e.on_response_headers(&mut host, 2);
    assert_eq!(
        debug_header(&host),
        "endpoint=10.0.0.2:80; reason=least_request; queued_ms=120"
    );
    host.live_contexts.clear();
    e.on_done(&mut host, 2);
    assert_eq!(
        e.tracked(),
        (0, 3),
        "in flight: the waiter's ZADD and ZREM, the release"
    );
}

#[test]
fn the_deadline_answers_429_with_retry_after_and_holds_nothing() {
    let (mut host, mut e) = higress(json!({}));
    queued(&mut host, &mut e, 2, "standard");
    host.now_ms += 999;
    let from = host.redis_calls.len();
    let token = host.next_token;
    e.on_tick(&mut host);
    // Still in time: the head retries and finds no room again.
    assert_eq!(acquires(&host, from, token).len(), 1);
    deliver(&mut host, &mut e, token, &encode_command(&["FULL", "1"]));
    assert!(host.local_responses.is_empty());
    host.now_ms += 1;
    e.on_tick(&mut host);
    assert_eq!(
        host.local_responses,
        vec![(429, "ai_lb_shed_priority".to_string())]
    );
    assert_eq!(
        host.local_response_headers,
        vec![vec![("retry-after".to_string(), "1".to_string())]]
    );
    assert_eq!(host.metric("ai_lb.queue.timeout"), 1);
    assert_eq!(host.metric("ai_lb.queue.admitted"), 0);
    assert_eq!(host.metric("ai_lb.priority.shed"), 1);
    assert_eq!(host.resumed, 0);
    assert_eq!(waiter_calls(&host).last().unwrap()[0], "ZREM");
    let calls = host.redis_calls.len();
    host.live_contexts.clear();
    e.on_done(&mut host, 2);
    assert_eq!(host.redis_calls.len(), calls, "nothing to release");
    assert_eq!(
        (e.tracked(), e.queued()),
        ((0, 2), 0),
        "in flight: ZADD, ZREM"
    );
    assert_eq!(host.metric("ai_lb.queue.abandoned"), 0);
}

#[test]
fn a_retry_that_finds_no_room_after_the_deadline_times_out() {
    let (mut host, mut e) = higress(json!({}));
    queued(&mut host, &mut e, 2, "standard");
    host.now_ms += 990;
    let token = host.next_token;
    e.on_tick(&mut host);
    host.now_ms += 20;
    deliver(&mut host, &mut e, token, &encode_command(&["FULL", "1"]));
    assert_eq!(host.local_responses.len(), 1);
    assert_eq!(host.metric("ai_lb.queue.timeout"), 1);
    assert_eq!(e.queued(), 0);
}

#[test]
fn a_client_gone_while_waiting_leaks_nothing() {
    let (mut host, mut e) = higress(json!({}));
    // Gone while waiting.
    queued(&mut host, &mut e, 2, "standard");
    host.live_contexts.retain(|&c| c != 2);
    e.on_done(&mut host, 2);
    assert_eq!(host.metric("ai_lb.queue.abandoned"), 1);
    assert_eq!(waiter_calls(&host).last().unwrap()[0], "ZREM");
    assert_eq!((e.tracked().0, e.queued()), (0, 0));

    // Gone while its retry is in flight: the retry's lease is undone when Redis answers.
    let rid = queued(&mut host, &mut e, 3, "standard");
    let token = host.next_token;
    e.on_tick(&mut host);
    host.live_contexts.retain(|&c| c != 3);
    e.on_done(&mut host, 3);
    assert_eq!(host.metric("ai_lb.queue.abandoned"), 2);
    assert_eq!(e.queued(), 0);
    deliver(&mut host, &mut e, token, &picked("10.0.0.1:80"));
    let last = words(&host.redis_calls.last().unwrap().1);
    assert!(
        last.contains(&format!("{rid}|10.0.0.1:80|1")),
        "the orphaned retry's lease is released: {last:?}"
    );
    assert_eq!(host.metric("ai_lb.queue.admitted"), 0);
    assert_eq!(host.resumed, 0);
}

#[test]
fn the_highest_class_then_the_earliest_is_admitted_first() {
    let (mut host, mut e) = higress(json!({}));
    let ids = [
        (2, queued(&mut host, &mut e, 2, "sheddable")),
        (3, queued(&mut host, &mut e, 3, "standard")),
        (4, queued(&mut host, &mut e, 4, "critical")),
        (5, queued(&mut host, &mut e, 5, "critical")),
        (6, queued(&mut host, &mut e, 6, "standard")),
    ];
    let ctx_of = |rid: &str| ids.iter().find(|(_, r)| r == rid).unwrap().0;
    assert_eq!(e.queued(), 5);
    // A tick tries the head once; no room: it stays the head.
    let token = host.next_token;
    let from = host.redis_calls.len();
    e.on_tick(&mut host);
    let a = acquires(&host, from, token);
    assert_eq!((a.len(), ctx_of(&a[0].1), a[0].2.as_str()), (1, 4, "0"));
    deliver(&mut host, &mut e, token, &encode_command(&["FULL", "1"]));
    let mut order = Vec::new();
    // Room frees: each admission lets the next one try (one acquire each) until one finds
    // none.
    let token = host.next_token;
    let from = host.redis_calls.len();
    e.on_tick(&mut host);
    let mut next = acquires(&host, from, token);
    while let Some((token, rid, _)) = next.pop() {
        order.push(ctx_of(&rid));
        let from = host.redis_calls.len();
        let after = host.next_token;
        let reply = if order.len() < 4 {
            picked("10.0.0.1:80")
        } else {
            encode_command(&["FULL", "1"])
        };
        deliver(&mut host, &mut e, token, &reply);
        next = acquires(&host, from, after);
        assert!(next.len() <= 1, "one acquire at a time");
    }
    assert_eq!(order, [4, 5, 3, 6]);
    assert_eq!(host.metric("ai_lb.queue.admitted"), 3);
    assert_eq!(e.queued(), 2, "6 and 2 still wait");
    assert_eq!(host.resumed, 3);
}

#[test]
fn over_max_queued_the_429_comes_at_once() {
    let (mut host, mut e) = higress(json!({"maxQueued": 1}));
    queued(&mut host, &mut e, 2, "standard");
    host.request_headers = vec![(PRIO.to_string(), "critical".to_string())];
    host.live_contexts.push(3);
    e.on_request_headers(&mut host, 3, false);
    let token = host.next_token;
    e.on_request_body(&mut host, 3, 20, true);
    deliver(&mut host, &mut e, token, &encode_command(&["FULL", "1"]));
    assert_eq!(
        host.local_responses,
        vec![(429, "ai_lb_shed_priority".to_string())]
    );
    assert_eq!(host.metric("ai_lb.queue.queued"), 1);
    assert_eq!(e.queued(), 1);
}

#[test]
fn redis_down_while_waiting_falls_back_as_usual() {
    let (mut host, mut e) = higress(json!({}));
    queued(&mut host, &mut e, 2, "standard");
    host.redis_call_status = Some(crate::host::HostErrorKind::BadArgument);
    e.on_tick(&mut host);
    assert_eq!(host.resumed, 1, "released to the cluster's own balancing");
    assert_eq!(host.metric("ai_lb.fallback.redis_unavailable"), 1);
    assert_eq!(host.metric("ai_lb.queue.admitted"), 0);
    assert_eq!(e.queued(), 0);
    assert!(host.local_responses.is_empty());
}

#[test]
fn without_a_queue_the_acquire_carries_no_wait_check() {
    let (mut host, mut e) = higress(json!({"queueTimeoutMs": 0}));
    host.request_headers = vec![(PRIO.to_string(), "standard".to_string())];
    host.live_contexts.push(2);
    e.on_request_headers(&mut host, 2, false);
    let token = host.next_token;
    e.on_request_body(&mut host, 2, 20, true);
    let a = acquires(&host, 0, token);
    assert_eq!(a[0].2, "-1");
    // The wait key always rides in the call (the scripts find their last keys from the end),
    // but nothing is written to it.
    let w = words(&host.redis_calls[0].1);
    let keys: usize = w[2].parse().unwrap();
    assert_eq!(w[3 + keys - 3], WAIT_KEY);
    assert!(waiter_calls(&host).is_empty());
    deliver(&mut host, &mut e, token, &encode_command(&["FULL", "1"]));
    assert_eq!(host.local_responses.len(), 1, "refused at once");
    assert_eq!(host.metric("ai_lb.queue.queued"), 0);
}

// ---- plain Envoy: the per-proxy counts; a local release admits the head at once ----

fn envoy(lb: Value) -> (MockHost, Balancer) {
    let mut cfg = json!({"endpoints": ["10.0.0.1:8000", "10.0.0.2:8000"], "debugHeader": DEBUG,
                         "maxRequestCount": 1, "priorityHeader": PRIO, "queueTimeoutMs": 1000});
    if let (Value::Object(a), Value::Object(b)) = (&mut cfg, lb) {
        a.extend(b);
    }
    let doc = json!({"lb_policy": "global_least_request", "lb_config": cfg});
    let config = PluginConfig::parse_for(doc.to_string().as_bytes(), Build::Envoy).unwrap();
    let mut host = MockHost::new();
    host.now_ms = 5_000;
    let e = Balancer::configure(&mut host, config, 42, LogLevel::Trace);
    (host, e)
}

/// Sends request `ctx` of `class`: whether it was routed at once (not held).
fn envoy_send(host: &mut MockHost, e: &mut Balancer, ctx: u32, class: &str) -> bool {
    host.request_headers = vec![(PRIO.into(), class.into())];
    host.body = br#"{"model":"m","prompt":"hi"}"#.to_vec();
    host.live_contexts.push(ctx);
    e.on_request_headers(host, ctx, false);
    let len = host.body.len();
    e.on_request_body(host, ctx, len, true) == Verdict::Continue
}

fn done(host: &mut MockHost, e: &mut Balancer, ctx: u32) {
    host.live_contexts.retain(|&c| c != ctx);
    e.on_done(host, ctx);
}

#[test]
fn envoy_a_local_release_admits_the_highest_class_waiting() {
    let (mut host, mut e) = envoy(json!({}));
    assert!(envoy_send(&mut host, &mut e, 2, "standard"));
    assert!(envoy_send(&mut host, &mut e, 3, "standard"));
    assert!(!envoy_send(&mut host, &mut e, 4, "sheddable"), "waits");
    assert!(!envoy_send(&mut host, &mut e, 5, "critical"), "waits");
    assert!(host.local_responses.is_empty());
    assert_eq!((host.metric("ai_lb.queue.queued"), e.queued()), (2, 2));
    // A tick finds no room: nothing admitted, nobody refused.
    e.on_tick(&mut host);
    assert_eq!(host.resumed, 0);
    host.now_ms += 30;
    done(&mut host, &mut e, 2);
    assert_eq!(host.resumed, 1);
    assert_eq!(e.queued(), 1);
    // (The mock's request headers are the last request's; the ticket keeps each class.)
    host.response_headers = vec![(":status".into(), "200".into())];
    e.on_response_headers(&mut host, 5);
    assert!(
        debug_header(&host).ends_with("; queued_ms=30"),
        "critical first: {}",
        debug_header(&host)
    );
    done(&mut host, &mut e, 3);
    assert_eq!(host.effective_context, Some(4));
    assert_eq!(host.metric("ai_lb.queue.admitted"), 2);
    for c in [4, 5] {
        done(&mut host, &mut e, c);
    }
    assert_eq!((e.tracked(), e.queued()), ((0, 0), 0));
    let shared = host.shared.borrow();
    let left: u64 = shared
        .iter()
        .filter(|(k, _)| k.starts_with("ailb.glr."))
        .map(|(_, (v, _))| shared::decode_counts(v).values().sum::<u64>())
        .sum();
    assert_eq!(left, 0, "every count came back");
}

#[test]
fn envoy_timeout_and_abandon() {
    let (mut host, mut e) = envoy(json!({}));
    assert!(envoy_send(&mut host, &mut e, 2, "standard"));
    assert!(envoy_send(&mut host, &mut e, 3, "standard"));
    assert!(!envoy_send(&mut host, &mut e, 4, "standard"));
    assert!(!envoy_send(&mut host, &mut e, 5, "standard"));
    done(&mut host, &mut e, 5);
    assert_eq!(host.metric("ai_lb.queue.abandoned"), 1);
    host.now_ms += 1000;
    e.on_tick(&mut host);
    assert_eq!(
        host.local_responses,
        vec![(429, "ai_lb_shed_priority".into())]
    );
    assert_eq!(host.metric("ai_lb.queue.timeout"), 1);
    assert_eq!(e.queued(), 0);
}

#[test]
fn queue_keys_are_checked() {
    let bad = [
        (json!({"maxQueued": 4}), "maxQueued"),
        (json!({"queueTimeoutMs": 300_001}), "queueTimeoutMs"),
        (json!({"queueTimeoutMs": -1}), "queueTimeoutMs"),
        (json!({"queueTimeoutMs": "1s"}), "queueTimeoutMs"),
        (json!({"queueTimeoutMs": 10, "maxQueued": 0}), "maxQueued"),
        (
            json!({"queueTimeoutMs": 10, "maxQueued": 100_001}),
            "maxQueued",
        ),
    ];
    for (lb, key) in bad {
        let mut cfg = json!({"serviceFQDN": "redis.static", "servicePort": 6379,
                             "maxRequestCount": 2});
        if let (Value::Object(a), Value::Object(b)) = (&mut cfg, lb.clone()) {
            a.extend(b);
        }
        let doc = json!({"lb_policy": "global_least_request", "lb_config": cfg});
        let err = PluginConfig::parse(doc.to_string().as_bytes())
            .err()
            .unwrap_or_else(|| panic!("{lb} must be refused"));
        assert!(err.to_string().contains(key), "{lb}: {err}");
    }
    let doc = json!({"lb_policy": "prefix_cache", "lb_config": {
        "serviceFQDN": "redis.static", "servicePort": 6379, "maxRequestCount": 2,
        "queueTimeoutMs": 0}});
    let cfg = PluginConfig::parse(doc.to_string().as_bytes()).unwrap();
    assert_eq!(cfg.global.unwrap().common.queue, None, "0: no queue");
    let doc = json!({"lb_policy": "prefix_cache", "lb_config": {
        "serviceFQDN": "redis.static", "servicePort": 6379, "queueTimeoutMs": 2000}});
    let cfg = PluginConfig::parse(doc.to_string().as_bytes()).unwrap();
    assert_eq!(
        cfg.global.unwrap().common.queue,
        Some(crate::config::Queue {
            timeout_ms: 2000,
            max_queued: crate::config::DEFAULT_MAX_QUEUED
        })
    );
}

#[test]
fn envoy_a_worker_leaves_the_room_to_a_higher_class_waiting_on_another() {
    // Two worker VMs of one proxy: their own queues, the shared data in common.
    let (mut hx, mut x) = envoy(json!({}));
    let (mut hy, mut y) = envoy(json!({}));
    hy.shared = hx.shared.clone();
    assert!(envoy_send(&mut hy, &mut y, 2, "standard"));
    assert!(envoy_send(&mut hy, &mut y, 3, "standard"));
    assert!(!envoy_send(&mut hx, &mut x, 2, "critical"), "waits on X");
    assert!(!envoy_send(&mut hy, &mut y, 4, "standard"), "waits on Y");
    // Room frees on Y: Y's own head is a standard request, and X's critical one waits.
    done(&mut hy, &mut y, 2);
    assert_eq!(hy.resumed, 0, "Y leaves the room to X's critical request");
    assert_eq!(y.queued(), 1);
    x.on_tick(&mut hx);
    assert_eq!(hx.resumed, 1, "X's tick admits it");
    assert_eq!(hx.metric("ai_lb.queue.admitted"), 1);
    // The next room is Y's standard request's: no higher class waits any more.
    done(&mut hy, &mut y, 3);
    assert_eq!(hy.resumed, 1);
    for (h, e, c) in [(&mut hx, &mut x, 2), (&mut hy, &mut y, 4)] {
        done(h, e, c);
        assert_eq!(e.queued(), 0);
    }
    let shared = hx.shared.borrow();
    let waiting: Vec<&String> = shared
        .iter()
        .filter(|(k, (v, _))| k.starts_with("ailb.wait.") && !v.is_empty())
        .map(|(k, _)| k)
        .collect();
    assert!(
        waiting.is_empty(),
        "the wait set is empty again: {waiting:?}"
    );
}

/// Random interleavings of arrivals, replies (room, no room, lost), ticks, deadlines and
/// clients going away: every lease taken is released exactly once, every waiter entry written
/// is removed exactly once, and the queue ends empty.
#[test]
fn random_orders_leak_nothing() {
    let sha = Scripts::new();
    let (acquire_sha, release_sha) = (sha.acquire.sha.clone(), sha.release.sha.clone());
    // Over all rounds, every way out of the queue was taken.
    let mut ways = [0i64; 4];
    for round in 0..200u64 {
        let (mut host, mut e) = higress(json!({"maxQueued": 3}));
        let mut rng = crate::hash::SplitMix64(round);
        let mut seen = 0; // redis calls looked at
        let mut pending: Vec<u32> = Vec::new(); // acquire tokens not answered yet
        let mut acquired: Vec<String> = Vec::new();
        let mut next_ctx = 2;
        let scan = |host: &MockHost, seen: &mut usize, pending: &mut Vec<u32>| {
            for (n, (_, q)) in host.redis_calls.iter().enumerate().skip(*seen) {
                let w = words(q);
                if w[0] == "EVALSHA" && w[1] == acquire_sha {
                    pending.push(7 + 4 * (n as u32 + Scripts::new().all().len() as u32));
                }
            }
            *seen = host.redis_calls.len();
        };
        for _ in 0..80 {
            match rng.next_u64() % 10 {
                0..=2 => {
                    let class =
                        ["critical", "standard", "sheddable"][(rng.next_u64() % 3) as usize];
                    host.request_headers = vec![(PRIO.to_string(), class.to_string())];
                    host.live_contexts.push(next_ctx);
                    e.on_request_headers(&mut host, next_ctx, false);
                    e.on_request_body(&mut host, next_ctx, 20, true);
                    next_ctx += 1;
                }
                3..=5 if !pending.is_empty() => {
                    let token = pending.remove((rng.next_u64() % pending.len() as u64) as usize);
                    let q = &host.redis_calls[((token - 7) / 4) as usize - 3].1;
                    let rid = rid_of(q);
                    match rng.next_u64() % 4 {
                        0 => {
                            acquired.push(format!("{rid}|10.0.0.1:80|1"));
                            deliver(&mut host, &mut e, token, &picked("10.0.0.1:80"));
                        }
                        1 => e.on_redis_reply(&mut host, token, CallStatus::Failed, 0),
                        _ => deliver(&mut host, &mut e, token, &encode_command(&["FULL", "1"])),
                    }
                }
                6 | 7 => {
                    host.now_ms += rng.next_u64() % 400;
                    e.on_tick(&mut host);
                }
                8 if !host.live_contexts.is_empty() => {
                    let i = (rng.next_u64() % host.live_contexts.len() as u64) as usize;
                    let ctx = host.live_contexts.remove(i);
                    e.on_done(&mut host, ctx);
                }
                _ => {}
            }
            scan(&host, &mut seen, &mut pending);
        }
        for ctx in std::mem::take(&mut host.live_contexts) {
            e.on_done(&mut host, ctx);
        }
        scan(&host, &mut seen, &mut pending);
        // Replies of streams already gone: their picks are undone.
        for token in std::mem::take(&mut pending) {
            let q = &host.redis_calls[((token - 7) / 4) as usize - 3].1;
            let rid = rid_of(q);
            acquired.push(format!("{rid}|10.0.0.1:80|1"));
            deliver(&mut host, &mut e, token, &picked("10.0.0.1:80"));
        }
        let calls: Vec<Vec<String>> = host.redis_calls.iter().map(|(_, q)| words(q)).collect();
        for member in &acquired {
            let releases = calls
                .iter()
                .filter(|w| w[0] == "EVALSHA" && w[1] == release_sha && w.contains(member))
                .count();
            assert_eq!(
                releases, 1,
                "round {round}: {member} released {releases} times"
            );
        }
        let added: Vec<&String> = calls
            .iter()
            .filter(|w| w[0] == "ZADD")
            .map(|w| &w[3])
            .collect();
        let mut removed: Vec<&String> = calls
            .iter()
            .filter(|w| w[0] == "ZREM")
            .map(|w| &w[2])
            .collect();
        removed.sort();
        let mut added_sorted = added.clone();
        added_sorted.sort();
        assert_eq!(
            added_sorted, removed,
            "round {round}: every waiter entry removed once"
        );
        assert_eq!((e.queued(), e.tracked().0), (0, 0), "round {round}");
        let left = host.metric("ai_lb.queue.admitted")
            + host.metric("ai_lb.queue.timeout")
            + host.metric("ai_lb.queue.abandoned");
        assert!(left <= host.metric("ai_lb.queue.queued"), "round {round}");
        assert_eq!(host.metric("ai_lb.queue.queued"), added.len() as i64);
        for (n, name) in ["admitted", "timeout", "abandoned"].iter().enumerate() {
            ways[n] += host.metric(&format!("ai_lb.queue.{name}"));
        }
        ways[3] += acquired.len() as i64;
    }
    assert!(
        ways.iter().all(|&n| n > 20),
        "admitted, timeout, abandoned, leases: {ways:?}"
    );
}

// ---- maxPoolRequests and tenant fairness (docs/sessions-and-queues.md "Tenant fairness") with the queue ----

/// The acquire's `ARGV[i]`.
fn argv(q: &[u8], i: usize) -> String {
    let w = words(q);
    let keys: usize = w[2].parse().unwrap();
    w[2 + keys + i].clone()
}

#[test]
fn a_full_pool_waits_and_a_tenant_over_its_share_does_not() {
    let (mut host, mut e) = higress(json!({"maxPoolRequests": 2, "tenantHeader": "x-tenant"}));
    host.request_headers = vec![
        (PRIO.to_string(), "standard".to_string()),
        ("x-tenant".to_string(), "a".to_string()),
    ];
    host.live_contexts.push(2);
    assert_eq!(e.on_request_headers(&mut host, 2, false), Verdict::Pause);
    let token = host.next_token;
    assert_eq!(e.on_request_body(&mut host, 2, 20, true), Verdict::Pause);
    let q = host.redis_calls.last().unwrap().1.clone();
    assert_eq!(argv(&q, 12), "2", "the standard class's pool cap");
    assert_eq!(argv(&q, 13).len(), 16, "the tenant id");
    assert_eq!(argv(&q, 16), "1", "the class rank for the wait set");
    deliver(&mut host, &mut e, token, &encode_command(&["POOL", "2"]));
    assert!(host.local_responses.is_empty(), "a full pool waits");
    assert_eq!(host.metric("ai_lb.pool.full"), 1);
    assert_eq!((host.metric("ai_lb.queue.queued"), e.queued()), (1, 1));
    assert_eq!(waiter_calls(&host).len(), 1, "its waiter entry");

    // The retry finds the tenant over its share now: 429 shed_tenant, out of the queue.
    host.now_ms += 100;
    let from = host.redis_calls.len();
    let token = host.next_token;
    e.on_tick(&mut host);
    let retry = acquires(&host, from, token);
    assert_eq!(retry.len(), 1);
    assert_eq!(
        argv(&host.redis_calls[from].1, 13),
        argv(&q, 13),
        "same tenant"
    );
    deliver(&mut host, &mut e, token, &encode_command(&["TENANT", "1"]));
    assert_eq!(
        host.local_responses,
        vec![(429, "ai_lb_shed_tenant".to_string())]
    );
    assert_eq!(host.metric("ai_lb.tenant.shed"), 1);
    assert_eq!(e.queued(), 0);
    assert_eq!(waiter_calls(&host).last().unwrap()[0], "ZREM");
    assert_eq!(host.metric("ai_lb.queue.admitted"), 0);
    assert_eq!(host.metric("ai_lb.queue.timeout"), 0);

    // A tenant over its share at once: 429 at once, never queued.
    host.request_headers = vec![
        (PRIO.to_string(), "critical".to_string()),
        ("x-tenant".to_string(), "b".to_string()),
    ];
    host.live_contexts.push(3);
    e.on_request_headers(&mut host, 3, false);
    let token = host.next_token;
    e.on_request_body(&mut host, 3, 20, true);
    deliver(&mut host, &mut e, token, &encode_command(&["TENANT", "1"]));
    assert_eq!(host.local_responses.len(), 2);
    assert_eq!(host.local_responses[1].1, "ai_lb_shed_tenant");
    assert_eq!((host.metric("ai_lb.queue.queued"), e.queued()), (1, 0));
}

#[test]
fn envoy_a_full_pool_is_left_to_a_higher_class_waiting_on_another_worker() {
    // No endpoint cap: only maxPoolRequests (2) bounds the room.
    let cfg = json!({"maxRequestCount": 0, "maxPoolRequests": 2, "criticalHeadroom": 0});
    let (mut hx, mut x) = envoy(cfg.clone());
    let (mut hy, mut y) = envoy(cfg);
    hy.shared = hx.shared.clone();
    assert!(envoy_send(&mut hy, &mut y, 2, "standard"));
    assert!(envoy_send(&mut hy, &mut y, 3, "standard"));
    assert!(
        !envoy_send(&mut hx, &mut x, 2, "critical"),
        "the pool is full: waits on X"
    );
    assert_eq!(hx.metric("ai_lb.pool.full"), 1);
    assert!(!envoy_send(&mut hy, &mut y, 4, "standard"), "waits on Y");
    assert!(hx.local_responses.is_empty() && hy.local_responses.is_empty());
    // One slot frees on Y: it is the pool's last, and X's critical request waits for it.
    done(&mut hy, &mut y, 2);
    assert_eq!(
        hy.resumed, 0,
        "Y leaves the pool's room to X's critical request"
    );
    x.on_tick(&mut hx);
    assert_eq!(hx.resumed, 1, "X's tick admits it");
    done(&mut hy, &mut y, 3);
    assert_eq!(hy.resumed, 1, "then Y's standard request");
    for (h, e, c) in [(&mut hx, &mut x, 2), (&mut hy, &mut y, 4)] {
        done(h, e, c);
        assert_eq!((e.tracked(), e.queued()), ((0, 0), 0));
    }
    let shared = hx.shared.borrow();
    let left: u64 = shared
        .iter()
        .filter(|(k, _)| k.starts_with("ailb.glr."))
        .map(|(_, (v, _))| shared::decode_counts(v).values().sum::<u64>())
        .sum();
    assert_eq!(left, 0, "every count came back");
}

/// Plain Envoy, a session read from the body (`sessionBodyField`): a turn that waited for room
/// is routed by its session when admitted, though its held body cannot be read again then.
#[test]
fn envoy_a_session_turn_that_waited_keeps_its_session() {
    // The body is read (costMode), each request costing its bytes: 27, 27, then 44 (> 50).
    let (mut host, mut e) =
        envoy(json!({"sessionBodyField": "user", "costMode": "bytes", "maxRequestCount": 50}));
    assert!(envoy_send(&mut host, &mut e, 2, "standard"));
    assert!(envoy_send(&mut host, &mut e, 3, "standard"));
    host.body = br#"{"model":"m","prompt":"hi","user":"alice"}"#.to_vec();
    host.live_contexts.push(4);
    e.on_request_headers(&mut host, 4, false);
    let len = host.body.len();
    assert_ne!(
        e.on_request_body(&mut host, 4, len, true),
        Verdict::Continue,
        "waits"
    );
    assert_eq!(e.queued(), 1);
    host.body.clear();
    host.now_ms += 10;
    done(&mut host, &mut e, 2);
    assert_eq!((host.resumed, e.queued()), (1, 0));
    host.response_headers = vec![(":status".into(), "200".into())];
    e.on_response_headers(&mut host, 4);
    let debug = debug_header(&host);
    assert!(debug.contains("reason=session"), "{debug}");
    let sticky = host.metric("ai_lb.session.hit") + host.metric("ai_lb.session.rebound");
    assert_eq!(sticky, 1);
    for c in [3, 4] {
        done(&mut host, &mut e, c);
    }
    assert_eq!((e.tracked(), e.queued()), ((0, 0), 0));
}
