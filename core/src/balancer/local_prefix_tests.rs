//! prefix_cache without Redis (plain Envoy) against the mock host: conversations stick, two
//! proxies that share nothing agree, hot prefixes spill, a removed endpoint's prefixes move, the
//! index stays within its bounds and survives garbage, and every count taken is given back once.

use super::*;
use crate::config::{Build, PolicyConfig, RouteConfig};
use crate::host::mock::MockHost;
use crate::prefix::local_index::{Layout, Shard, HEADER_BYTES};
use serde_json::{json, Value};

const DEST: &str = "x-gateway-destination-endpoint";
const DEBUG: &str = "x-ai-lb-debug";
const SYSTEM: &str = "You are a helpful assistant. Answer briefly.";

fn endpoints(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("10.0.0.{i}:8000")).collect()
}

/// A plain-Envoy prefix_cache route (`envoy_lb` and `prefix_lb` merged into its `lb_config`),
/// its index bounded to `max_entries` (below the key's minimum in some tests).
fn config(
    endpoints: &[String],
    envoy_lb: Value,
    prefix_lb: Value,
    max_entries: usize,
) -> PluginConfig {
    let mut lb = json!({"endpoints": endpoints, "debugHeader": DEBUG});
    merge(&mut lb, envoy_lb);
    merge(&mut lb, prefix_lb);
    let cfg = json!({"lb_policy": "prefix_cache", "lb_config": lb});
    let parsed = PluginConfig::parse_for(cfg.to_string().as_bytes(), Build::Envoy).unwrap();
    let mut route: RouteConfig = (*parsed.global.unwrap()).clone();
    assert!(route.redis.is_none() && !route.decide_at_headers);
    if let PolicyConfig::PrefixCache(s) = &mut route.policy {
        s.index_max_entries = max_entries;
    }
    PluginConfig {
        global: Some(Rc::new(route)),
        rules: Vec::new(),
    }
}

fn merge(into: &mut Value, from: Value) {
    if let (Value::Object(a), Value::Object(b)) = (into, from) {
        a.extend(b);
    }
}

fn proxy(config: PluginConfig) -> (MockHost, Balancer) {
    let mut host = MockHost::new();
    let e = Balancer::configure(&mut host, config, 42, LogLevel::Trace);
    (host, e)
}

fn proxy_on(n: usize) -> (MockHost, Balancer) {
    proxy(config(&endpoints(n), json!({}), json!({}), 65_536))
}

/// A chat body: the system prompt, `turns` earlier (user, assistant) exchanges, then `next`.
fn chat(topic: &str, turns: usize) -> Vec<u8> {
    let mut messages = vec![json!({"role": "system", "content": SYSTEM})];
    for t in 0..turns {
        messages.push(json!({"role": "user", "content": format!("{topic}: question {t}")}));
        messages.push(json!({"role": "assistant", "content": format!("{topic}: answer {t}")}));
    }
    let next = format!("{topic}: question {turns}");
    messages.push(json!({"role": "user", "content": next}));
    json!({"model": "m", "messages": messages})
        .to_string()
        .into_bytes()
}

/// What one request was given: its destination header (choice first) and the debug reason.
#[derive(Debug, Clone, PartialEq)]
struct Routed {
    to: String,
    fallbacks: Vec<String>,
    reason: String,
}

/// Headers and the whole body of request `ctx`; the stream stays open until [`end`].
fn send(host: &mut MockHost, e: &mut Balancer, ctx: u32, body: &[u8]) -> Routed {
    host.request_headers = vec![(DEST.into(), "10.9.9.9:1".into())]; // a client's attempt
    host.response_headers = vec![(":status".into(), "200".into())];
    host.body = body.to_vec();
    host.live_contexts.push(ctx);
    assert_eq!(e.on_request_headers(host, ctx, false), Verdict::Pause);
    let verdict = e.on_request_body(host, ctx, body.len(), true);
    e.on_response_headers(host, ctx);
    let debug = header(&host.response_headers, DEBUG).unwrap_or_default();
    let reason = debug.rsplit("reason=").next().unwrap_or("").to_string();
    let dest = header(&host.request_headers, DEST).unwrap_or_default();
    if host.local_responses.is_empty() {
        assert_eq!(verdict, Verdict::Continue);
        assert_ne!(
            dest, "10.9.9.9:1",
            "a client-sent destination is never kept"
        );
    }
    let mut list = dest.split(',').map(str::to_string);
    Routed {
        to: list.next().unwrap_or_default(),
        fallbacks: list.collect(),
        reason,
    }
}

fn end(host: &mut MockHost, e: &mut Balancer, ctx: u32) {
    host.live_contexts.retain(|&c| c != ctx);
    e.on_done(host, ctx);
}

/// A whole request: sent and finished.
fn request(host: &mut MockHost, e: &mut Balancer, ctx: u32, body: &[u8]) -> Routed {
    let r = send(host, e, ctx, body);
    end(host, e, ctx);
    r
}

fn header(list: &[(String, String)], name: &str) -> Option<String> {
    list.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

/// This proxy's in-flight counts (the local least-request record), summed.
fn in_flight(host: &MockHost) -> u64 {
    let shared = host.shared.borrow();
    shared
        .iter()
        .filter(|(k, _)| k.starts_with("ailb.glr."))
        .map(|(_, (v, _))| shared::decode_counts(v).values().sum::<u64>())
        .sum()
}

/// Every prefix-index record in shared data: (entries, bytes).
fn index_records(host: &MockHost) -> Vec<(usize, usize)> {
    let shared = host.shared.borrow();
    shared
        .iter()
        .filter(|(k, _)| k.starts_with("ailb.px."))
        .map(|(k, (v, _))| {
            let s = Shard::decode(Some(v)).unwrap_or_else(|_| panic!("{k} does not decode"));
            (s.len(), v.len())
        })
        .collect()
}

#[test]
fn a_multi_turn_conversation_sticks_to_its_pod() {
    let (mut host, mut e) = proxy_on(8);
    let first = request(&mut host, &mut e, 1, &chat("billing", 0));
    assert_eq!(first.reason, "prefix_miss");
    assert_eq!(
        first.fallbacks.len(),
        2,
        "fallbackCount 2: the next endpoints of the ring"
    );
    assert!(!first.fallbacks.contains(&first.to));
    for turn in 1..6 {
        let r = request(&mut host, &mut e, 1 + turn as u32, &chat("billing", turn));
        assert_eq!(
            (r.to.as_str(), r.reason.as_str()),
            (first.to.as_str(), "prefix_hit")
        );
        assert_eq!(
            r.fallbacks, first.fallbacks,
            "the same ring walk: retries agree too"
        );
    }
    assert_eq!(host.metric("ai_lb.prefix.hit"), 5);
    assert_eq!(host.metric("ai_lb.prefix.routed"), 6);
    // The same first turn again (a regenerate) is known too.
    assert_eq!(
        request(&mut host, &mut e, 9, &chat("billing", 0)).reason,
        "prefix_hit"
    );
    assert_eq!(in_flight(&host), 0);
    assert_eq!(e.tracked(), (0, 0));
}

#[test]
fn two_proxies_that_share_nothing_send_a_conversation_to_the_same_pod() {
    let (mut a, mut pa) = proxy_on(16);
    let (mut b, mut pb) = proxy_on(16);
    let mut pods = std::collections::HashSet::new();
    for c in 0..60u32 {
        let topic = format!("conversation {c}");
        // Same system prompt, different first questions: each conversation on its own key.
        let ra = request(&mut a, &mut pa, c + 1, &chat(&topic, 0));
        assert_eq!(ra.reason, "prefix_miss");
        pods.insert(ra.to.clone());
        // The other proxy sees the same first turn, or (odd c) only the next turn.
        let turns = (c % 2) as usize;
        let rb = request(&mut b, &mut pb, c + 1, &chat(&topic, turns));
        assert_eq!(rb.to, ra.to, "{topic}, turn {}", turns + 1);
        assert_eq!(rb.reason, "prefix_miss", "the other proxy knew nothing");
        assert_eq!(rb.fallbacks, ra.fallbacks);
    }
    assert!(
        pods.len() >= 12,
        "conversations spread over the pods: {pods:?}"
    );
    assert!(a.shared.borrow().keys().any(|k| k.starts_with("ailb.px.")));
}

#[test]
fn a_hot_prefix_spills_when_its_pod_is_over_the_guard() {
    // Guard: leave when load - min > 2 and load > 1.5 × min.
    let cfg = config(
        &endpoints(4),
        json!({}),
        json!({"affinityMaxImbalance": 2}),
        65_536,
    );
    let (mut host, mut e) = proxy(cfg);
    let body = chat("hot", 2);
    let home = send(&mut host, &mut e, 1, &body);
    assert_eq!(home.reason, "prefix_miss");
    // Loads before each request on the home pod: 1, 2 → hits; 3 - 0 > 2 → spill.
    for ctx in 2..=3 {
        let r = send(&mut host, &mut e, ctx, &body);
        assert_eq!(
            (r.to.as_str(), r.reason.as_str()),
            (home.to.as_str(), "prefix_hit")
        );
    }
    let spilled = send(&mut host, &mut e, 4, &body);
    assert_eq!(spilled.reason, "prefix_spill");
    assert_ne!(spilled.to, home.to);
    assert_eq!(host.metric("ai_lb.prefix.spill"), 1);
    // The spill went along the ring: the first fallback of the home choice.
    assert_eq!(spilled.to, home.fallbacks[0]);
    // Once the load is gone, the prefix is served from its pod again (the spill did not move
    // the matched key).
    for ctx in 1..=4 {
        end(&mut host, &mut e, ctx);
    }
    let back = request(&mut host, &mut e, 5, &body);
    assert_eq!(
        (back.to.as_str(), back.reason.as_str()),
        (home.to.as_str(), "prefix_hit")
    );
    assert_eq!(in_flight(&host), 0);
}

#[test]
fn after_a_spill_the_conversation_follows_its_newest_pod() {
    // Guard at its tightest: any load above the least-loaded pod's spills.
    let guard = json!({"affinityMaxImbalance": 0, "affinityMaxImbalanceRatio": 1.0});
    let (mut host, mut e) = proxy(config(&endpoints(4), json!({}), guard, 65_536));
    let home = request(&mut host, &mut e, 1, &chat("s", 0)).to;
    let busy = send(&mut host, &mut e, 2, &chat("s", 0));
    assert_eq!(
        (busy.to.as_str(), busy.reason.as_str()),
        (home.as_str(), "prefix_hit")
    );
    let moved = request(&mut host, &mut e, 3, &chat("s", 1));
    assert_eq!(moved.reason, "prefix_spill");
    assert_ne!(moved.to, home);
    end(&mut host, &mut e, 2);
    // Its newer keys name the new pod; the first turn's key still names the old one.
    let next = request(&mut host, &mut e, 4, &chat("s", 2));
    assert_eq!(
        (next.to.as_str(), next.reason.as_str()),
        (moved.to.as_str(), "prefix_hit")
    );
    let regenerate = request(&mut host, &mut e, 5, &chat("s", 0));
    assert_eq!(
        (regenerate.to.as_str(), regenerate.reason.as_str()),
        (home.as_str(), "prefix_hit")
    );
}

#[test]
fn prefixes_expire_after_the_ttl_unless_hit() {
    let (mut host, mut e) = proxy(config(
        &endpoints(4),
        json!({}),
        json!({"redisKeyTTL": 60}),
        65_536,
    ));
    let t0 = host.now_ms;
    assert_eq!(
        request(&mut host, &mut e, 1, &chat("t", 0)).reason,
        "prefix_miss"
    );
    host.now_ms = t0 + 50_000;
    assert_eq!(
        request(&mut host, &mut e, 2, &chat("t", 1)).reason,
        "prefix_hit"
    );
    // The hit at 50 s extended the first turn's key to 110 s.
    host.now_ms = t0 + 100_000;
    assert_eq!(
        request(&mut host, &mut e, 3, &chat("t", 0)).reason,
        "prefix_hit"
    );
    host.now_ms = t0 + 161_000;
    assert_eq!(
        request(&mut host, &mut e, 4, &chat("t", 0)).reason,
        "prefix_miss"
    );
    assert_eq!(
        request(&mut host, &mut e, 5, &chat("t", 0)).reason,
        "prefix_hit"
    );
}

#[test]
fn a_removed_endpoints_prefixes_move_and_the_others_stay() {
    let five = endpoints(5);
    let (mut host, mut e) = proxy(config(&five, json!({}), json!({}), 65_536));
    let topics: Vec<String> = (0..40).map(|c| format!("topic {c}")).collect();
    let before: Vec<String> = topics
        .iter()
        .zip(1u32..)
        .map(|(t, ctx)| request(&mut host, &mut e, ctx, &chat(t, 0)).to)
        .collect();
    let gone = five[2].clone();
    assert!(
        before.contains(&gone),
        "the test needs conversations on the removed pod"
    );
    // Reconfigured without it; the proxy's shared data (the index) stays.
    let four: Vec<String> = five.iter().filter(|a| **a != gone).cloned().collect();
    let mut e = Balancer::configure(
        &mut host,
        config(&four, json!({}), json!({}), 65_536),
        7,
        LogLevel::Trace,
    );
    let (mut fresh_host, mut fresh) = proxy(config(&four, json!({}), json!({}), 65_536));
    for ((t, was), ctx) in topics.iter().zip(&before).zip(100u32..) {
        let now = request(&mut host, &mut e, ctx, &chat(t, 1));
        if *was == gone {
            assert_eq!(
                now.reason, "prefix_miss",
                "{t}: an entry naming a removed pod is skipped"
            );
            // Where any proxy with the new list puts it.
            let elsewhere = request(&mut fresh_host, &mut fresh, ctx, &chat(t, 1));
            assert_eq!(now.to, elsewhere.to, "{t}");
        } else {
            assert_eq!(
                (&now.to, now.reason.as_str()),
                (was, "prefix_hit"),
                "{t} stays"
            );
        }
    }
}

#[test]
fn the_index_never_exceeds_its_bounds() {
    let max = 512;
    let layout = Layout::new(max);
    let (mut host, mut e) = proxy(config(&endpoints(6), json!({}), json!({}), max));
    let mut rng = crate::hash::SplitMix64(5);
    for ctx in 1..=1_500u32 {
        let topic = format!("t{}", rng.next_u64() % 400);
        let turns = (rng.next_u64() % 4) as usize;
        request(&mut host, &mut e, ctx, &chat(&topic, turns));
        if ctx % 100 == 0 {
            let records = index_records(&host);
            assert!(records.len() <= layout.shards() as usize);
            let entries: usize = records.iter().map(|r| r.0).sum();
            let bytes: usize = records.iter().map(|r| r.1).sum();
            assert!(entries <= layout.max_entries(), "{entries} at {ctx}");
            assert!(bytes <= layout.max_bytes(), "{bytes} at {ctx}");
        }
    }
    let entries: usize = index_records(&host).iter().map(|r| r.0).sum();
    assert!(entries > max * 3 / 4, "the index filled up: {entries}");
    // What was just recorded survives (the least recently used entries go first).
    request(&mut host, &mut e, 9_999, &chat("recent", 0));
    let next = request(&mut host, &mut e, 10_000, &chat("recent", 1));
    assert_eq!(next.reason, "prefix_hit");
    assert_eq!(in_flight(&host), 0);
}

#[test]
fn garbage_in_the_index_is_reset_and_counted() {
    let (mut host, mut e) = proxy_on(4);
    let first = request(&mut host, &mut e, 1, &chat("g", 0));
    let names: Vec<String> = {
        let shared = host.shared.borrow();
        shared
            .keys()
            .filter(|k| k.starts_with("ailb.px."))
            .cloned()
            .collect()
    };
    assert!(!names.is_empty());
    for (i, name) in names.iter().enumerate() {
        let junk: &[u8] = if i % 2 == 0 {
            b"10.0.0.1:8000 3\n"
        } else {
            &[1, 0, 9, 0, 1]
        };
        host.shared_set(name, junk, 0).unwrap();
    }
    // The garbage is passed over (CHWBL puts the conversation where it was), then rewritten.
    let again = request(&mut host, &mut e, 2, &chat("g", 1));
    assert_eq!(
        (again.to.as_str(), again.reason.as_str()),
        (first.to.as_str(), "prefix_miss")
    );
    assert!(host.metric("ai_lb.prefix.index_reset") >= 1);
    assert_eq!(host.metric("ai_lb.prefix.index_failed"), 0);
    for (entries, bytes) in index_records(&host) {
        assert_eq!(
            bytes,
            HEADER_BYTES + entries * crate::prefix::local_index::ENTRY_BYTES
        );
    }
    assert_eq!(
        request(&mut host, &mut e, 3, &chat("g", 2)).reason,
        "prefix_hit"
    );
}

#[test]
fn every_count_taken_is_given_back_once() {
    let cfg = config(
        &endpoints(3),
        json!({"maxRequestCount": 2, "maxBodyBytes": 4096}),
        json!({}),
        65_536,
    );
    let (mut host, mut e) = proxy(cfg);
    let mut live = Vec::new();
    let mut rng = crate::hash::SplitMix64(9);
    for ctx in 1..=400u32 {
        let body = match rng.next_u64() % 5 {
            0 => b"{not json".to_vec(),
            1 => chat(&"x".repeat(5_000), 0), // over maxBodyBytes: decided unread
            _ => chat(
                &format!("c{}", rng.next_u64() % 7),
                (rng.next_u64() % 3) as usize,
            ),
        };
        host.local_responses.clear();
        let r = send(&mut host, &mut e, ctx, &body);
        if host.local_responses.is_empty() {
            live.push(ctx);
            assert!(!r.to.is_empty());
        } else {
            assert_eq!(host.local_responses[0].0, 429, "only when all 3 are at 2");
            assert_eq!(in_flight(&host), 6);
            end(&mut host, &mut e, ctx);
        }
        if rng.next_u64().is_multiple_of(2) && !live.is_empty() {
            let done = live.swap_remove((rng.next_u64() % live.len() as u64) as usize);
            end(&mut host, &mut e, done);
            e.on_done(&mut host, done); // the on_log backstop gives nothing back twice
        }
        assert_eq!(in_flight(&host), live.len() as u64, "after request {ctx}");
    }
    for ctx in live {
        end(&mut host, &mut e, ctx);
    }
    assert_eq!(in_flight(&host), 0);
    assert!(host.metric("ai_lb.fallback.bad_request") > 0);
    assert!(host.metric("ai_lb.fallback.body_too_large") > 0);
    assert!(host.metric("ai_lb.prefix.rejected_429") > 0);
    assert_eq!(e.tracked(), (0, 0));
}

#[test]
fn an_unusable_body_gets_a_least_request_pick() {
    let (mut host, mut e) = proxy_on(3);
    let busy = send(&mut host, &mut e, 1, &chat("a", 0));
    let r = send(&mut host, &mut e, 2, br#"{"model":"m","messages":[]}"#);
    assert_eq!(r.reason, "least_request");
    assert_ne!(r.to, busy.to, "the least-loaded pod");
    assert_eq!(host.metric("ai_lb.fallback.bad_request"), 1);
    assert_eq!(in_flight(&host), 2);
}

#[test]
fn shared_data_trouble_falls_back_without_holding_a_count() {
    let (mut host, mut e) = proxy_on(3);
    host.shared_set_status = Some(crate::host::HostErrorKind::InternalFailure);
    let r = send(&mut host, &mut e, 1, &chat("a", 0));
    assert_eq!((r.to.as_str(), r.reason.as_str()), ("", "shared_data"));
    assert_eq!(host.metric("ai_lb.fallback.shared_data"), 1);
    end(&mut host, &mut e, 1);
    host.shared_set_status = None;
    assert_eq!(in_flight(&host), 0);
}
