//! prefix_cache without Redis (plain Envoy) against the mock host: conversations stick, two
//! proxies that share nothing agree, hot prefixes spill, a removed endpoint's prefixes move, the
//! index stays within its bounds and survives garbage, and every count taken is given back once.

use super::*;
use crate::config::{Build, PolicyConfig, RouteConfig};
use crate::host::mock::MockHost;
use crate::prefix::local_index::{Layout, Shard, HEADER_BYTES};
use serde_json::{json, Value};
use std::rc::Rc;

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
    send_with(host, e, ctx, body, &[])
}

/// [`send`] with these request headers besides the client's destination attempt.
fn send_with(
    host: &mut MockHost,
    e: &mut Balancer,
    ctx: u32,
    body: &[u8],
    headers: &[(&str, &str)],
) -> Routed {
    host.request_headers = vec![(DEST.into(), "10.9.9.9:1".into())]; // a client's attempt
    host.request_headers
        .extend(headers.iter().map(|(k, v)| (k.to_string(), v.to_string())));
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
    count_lines(host, |line| !line.starts_with('~'))
}

/// Prefill tokens booked and not given back (least_request/prefill.rs).
fn booked(host: &MockHost) -> u64 {
    count_lines(host, |line| line.starts_with("~p"))
}

fn count_lines(host: &MockHost, which: impl Fn(&str) -> bool) -> u64 {
    let shared = host.shared.borrow();
    shared
        .iter()
        .filter(|(k, _)| k.starts_with("ailb.glr."))
        .flat_map(|(_, (v, _))| shared::decode_counts(v))
        .filter(|(line, _)| which(line))
        .map(|(_, n)| n)
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
    assert_eq!(booked(&host), 0, "every booking given back with its count");
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
    assert!(
        host.logs
            .borrow()
            .iter()
            .any(|(l, m)| *l == LogLevel::Warn && m.contains("(bad_request)")),
        "warned like a fallback: {:?}",
        host.logs.borrow()
    );
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

/// A chat with a long shared system prompt (cut into several blocks), then `user`'s own
/// conversation: `turns` earlier exchanges and the next question.
fn shared_prompt_chat(user: &str, turns: usize) -> Vec<u8> {
    let system = format!("{SYSTEM} {}", "Follow the style guide. ".repeat(400));
    let mut messages = vec![json!({"role": "system", "content": system})];
    for t in 0..turns {
        messages.push(json!({"role": "user", "content": format!("{user}: question {t}")}));
        messages.push(json!({"role": "assistant", "content": format!("{user}: answer {t}")}));
    }
    messages.push(json!({"role": "user", "content": format!("{user}: question {turns}")}));
    json!({"model": "m", "messages": messages})
        .to_string()
        .into_bytes()
}

#[test]
fn with_the_preamble_anchor_a_shared_system_prompt_lands_together_on_both_proxies() {
    let preamble = || {
        proxy(config(
            &endpoints(16),
            json!({}),
            json!({"prefixAnchor": "preamble"}),
            65_536,
        ))
    };
    let (mut a, mut pa) = preamble();
    let (mut b, mut pb) = preamble();
    let mut landed = std::collections::BTreeSet::new();
    for u in 0..20u32 {
        // Even users through one proxy, odd ones through the other: neither saw the other's.
        let (host, p) = if u.is_multiple_of(2) {
            (&mut a, &mut pa)
        } else {
            (&mut b, &mut pb)
        };
        let r = request(host, p, u + 1, &shared_prompt_chat(&format!("user {u}"), 0));
        assert!(u < 2 || r.reason == "prefix_hit", "user {u}: {r:?}");
        landed.insert(r.to);
    }
    assert_eq!(landed.len(), 1, "{landed:?}");
    let home = landed.into_iter().next().unwrap();
    // Later turns stay there, through either proxy.
    for t in 1..4 {
        for u in 0..4u32 {
            let (host, p) = if (u + t as u32).is_multiple_of(2) {
                (&mut a, &mut pa)
            } else {
                (&mut b, &mut pb)
            };
            let r = request(
                host,
                p,
                100 + u,
                &shared_prompt_chat(&format!("user {u}"), t),
            );
            assert_eq!(r.to, home, "user {u} turn {t}");
        }
    }
    // Under load the bounded-load guard spills the prompt to one next pod (the same ring walk
    // on every proxy): 9 in flight at home (the 9th is 8 above the idle pods), then the next.
    let mut by_pod = std::collections::BTreeMap::<String, usize>::new();
    for u in 0..12u32 {
        let r = send(
            &mut a,
            &mut pa,
            200 + u,
            &shared_prompt_chat(&format!("burst {u}"), 0),
        );
        *by_pod.entry(r.to).or_default() += 1;
    }
    assert_eq!(by_pod.get(&home), Some(&9), "{by_pod:?}");
    assert_eq!(by_pod.len(), 2, "{by_pod:?}");
    for u in 0..12u32 {
        end(&mut a, &mut pa, 200 + u);
    }
    assert_eq!(in_flight(&a), 0);
    // The default anchor is the conversation: the same prompt spreads.
    let (mut c, mut pc) = proxy_on(16);
    let spread: std::collections::BTreeSet<String> = (0..20u32)
        .map(|u| {
            request(
                &mut c,
                &mut pc,
                u + 1,
                &shared_prompt_chat(&format!("user {u}"), 0),
            )
            .to
        })
        .collect();
    assert!(spread.len() >= 8, "{spread:?}");
}

#[test]
fn the_prefix_anchor_key_is_checked_in_both_builds() {
    let parse = |build, anchor: Value| {
        let cfg = json!({"lb_policy": "prefix_cache", "lb_config": {
            "endpoints": endpoints(2), "prefixAnchor": anchor,
            "serviceFQDN": "redis.static", "servicePort": 6379}});
        let mut cfg = cfg;
        if build == Build::Envoy {
            let lb = cfg["lb_config"].as_object_mut().unwrap();
            lb.remove("serviceFQDN");
            lb.remove("servicePort");
        } else {
            cfg["lb_config"]
                .as_object_mut()
                .unwrap()
                .remove("endpoints");
        }
        PluginConfig::parse_for(cfg.to_string().as_bytes(), build)
    };
    let anchor_of = |c: PluginConfig| match &c.global.unwrap().policy {
        PolicyConfig::PrefixCache(s) => s.anchor,
        _ => unreachable!(),
    };
    use crate::prefix::Anchor;
    assert_eq!(
        anchor_of(parse(Build::Envoy, json!("preamble")).unwrap()),
        Anchor::Preamble
    );
    assert_eq!(
        anchor_of(parse(Build::Envoy, json!("conversation")).unwrap()),
        Anchor::Conversation
    );
    let e = parse(Build::Envoy, json!("system"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("prefixAnchor") && e.contains("conversation, preamble"),
        "{e}"
    );
    let e = parse(Build::Envoy, json!(1)).unwrap_err().to_string();
    assert!(e.contains("prefixAnchor"), "{e}");
    // Both builds read it: the Redis build matches keys from the same block on.
    assert_eq!(
        anchor_of(parse(Build::Higress, json!("preamble")).unwrap()),
        Anchor::Preamble
    );
}

/// A plain-Envoy prefix_cache route over 3 pods whose guard also reads scraped metrics.
fn guarded(extra: Value) -> (MockHost, Balancer) {
    let mut lb = json!({"scrapeCluster": "scrape", "scrapeIntervalMs": 1000,
        "metricsMaxAgeMs": 3000});
    merge(&mut lb, extra);
    proxy(config(&endpoints(3), json!({}), lb, 65_536))
}

/// One scrape round answering each pod with (waiting, kv) as a vLLM page.
fn scrape(host: &mut MockHost, e: &mut Balancer, pods: &[(String, u32, f64)]) {
    use super::policies::endpoint_metrics::tests::{scrape_round, vllm};
    host.now_ms += 1000;
    let texts: Vec<(&str, Option<u16>, String)> = pods
        .iter()
        .map(|(a, waiting, kv)| (a.as_str(), Some(200), vllm(*waiting, 4, *kv)))
        .collect();
    scrape_round(host, e, &texts);
}

#[test]
fn a_pod_whose_scraped_queue_is_full_is_left_and_taken_back_when_it_recovers() {
    let (mut host, mut e) = guarded(json!({"queueThresholdCritical": 5}));
    let pods = endpoints(3);
    let idle: Vec<(String, u32, f64)> = pods.iter().map(|p| (p.clone(), 0, 0.1)).collect();
    scrape(&mut host, &mut e, &idle);
    assert_eq!(host.http_calls.len(), 3, "the guard's pods are scraped");
    let home = request(&mut host, &mut e, 1, &chat("q", 0));
    assert_eq!(
        request(&mut host, &mut e, 2, &chat("q", 1)).to,
        home.to,
        "a hit"
    );
    // Its pod reports a full queue (6 > 5): the known prefix spills, and the next turn with it.
    let full: Vec<(String, u32, f64)> = pods
        .iter()
        .map(|p| (p.clone(), if *p == home.to { 6 } else { 0 }, 0.1))
        .collect();
    scrape(&mut host, &mut e, &full);
    let spilled = request(&mut host, &mut e, 3, &chat("q", 1));
    assert_eq!(spilled.reason, "prefix_spill");
    assert_ne!(spilled.to, home.to);
    // New conversations avoid it too, whatever their ring says.
    assert_eq!(host.metric("ai_lb.prefix.saturated"), 1);
    // A proxy without the guard shows where each new conversation hashes.
    let (mut plain, mut pp) = proxy_on(3);
    let mut passed_by = 0;
    for c in 0..12u32 {
        let body = chat(&format!("new {c}"), 0);
        let r = request(&mut host, &mut e, 10 + c, &body);
        assert_ne!(r.to, home.to, "conversation {c}");
        passed_by += usize::from(request(&mut plain, &mut pp, 1 + c, &body).to == home.to);
    }
    // Those that hash to the saturated pod were counted as passing it by.
    assert!(
        passed_by >= 1,
        "some new conversation hashes to the saturated pod"
    );
    assert_eq!(host.metric("ai_lb.prefix.saturated"), 1 + passed_by as i64);
    // A full KV cache is saturation too (kvCacheThreshold 0.8).
    let kv: Vec<(String, u32, f64)> = pods
        .iter()
        .map(|p| (p.clone(), 0, if *p == home.to { 0.95 } else { 0.1 }))
        .collect();
    scrape(&mut host, &mut e, &kv);
    assert_ne!(request(&mut host, &mut e, 30, &chat("q", 1)).to, home.to);
    // Recovered: the prefix's own pod again (the first turn's key still names it).
    scrape(&mut host, &mut e, &idle);
    let back = request(&mut host, &mut e, 31, &chat("q", 0));
    assert_eq!(
        (back.to.as_str(), back.reason.as_str()),
        (home.to.as_str(), "prefix_hit")
    );
    // Every pod saturated: the metrics cannot steer, the loads decide (the hit stays).
    let all: Vec<(String, u32, f64)> = pods.iter().map(|p| (p.clone(), 9, 0.1)).collect();
    scrape(&mut host, &mut e, &all);
    assert_eq!(request(&mut host, &mut e, 32, &chat("q", 0)).to, home.to);
    // Stale metrics (no scrape for longer than metricsMaxAgeMs) are unknown, never saturated.
    scrape(&mut host, &mut e, &full);
    host.now_ms += 5_000;
    assert_eq!(request(&mut host, &mut e, 33, &chat("q", 0)).to, home.to);
    assert_eq!(in_flight(&host), 0);
}

#[test]
fn the_metrics_guard_keys_are_checked_and_plain_envoy_only() {
    let envoy = |lb: Value| {
        let mut all = json!({"endpoints": endpoints(2)});
        merge(&mut all, lb);
        let cfg = json!({"lb_policy": "prefix_cache", "lb_config": all});
        PluginConfig::parse_for(cfg.to_string().as_bytes(), Build::Envoy)
    };
    let guard = |c: PluginConfig| match &c.global.unwrap().policy {
        PolicyConfig::PrefixCache(s) => s.guard.clone(),
        _ => unreachable!(),
    };
    assert!(guard(envoy(json!({})).unwrap()).is_none());
    let g = guard(envoy(json!({"scrapeCluster": "s", "kvCacheThreshold": 0.5})).unwrap()).unwrap();
    assert_eq!(g.scrape.as_ref().unwrap().cluster, "s");
    assert_eq!(g.scheduler.kv_cache_threshold, 0.5);
    assert_eq!(g.scheduler.queue_threshold_critical, 5.0);
    // A threshold without a scrape cluster has nothing to read.
    let e = envoy(json!({"queueThresholdCritical": 3}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("scrapeCluster"), "{e}");
    let e = envoy(json!({"scrapeCluster": "s", "kvCacheThreshold": 2}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("kvCacheThreshold"), "{e}");
    // endpoint_metrics-only keys are not read by prefix_cache (a warning, not a guard).
    let c = envoy(json!({"weights": {"queue": 1}})).unwrap();
    assert!(guard(c).is_none());
    let cfg = json!({"lb_policy": "prefix_cache", "lb_config": {
        "serviceFQDN": "redis.static", "servicePort": 6379, "scrapeCluster": "s"}});
    let e = PluginConfig::parse_for(cfg.to_string().as_bytes(), Build::Higress)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("scrapeCluster") && e.contains("plain-Envoy"),
        "{e}"
    );
}

#[test]
fn the_prefix_load_is_counted_in_cost_mode_units_like_least_request() {
    let (mut host, mut e) = proxy(config(
        &endpoints(4),
        json!({"costMode": "bytes"}),
        json!({}),
        65_536,
    ));
    let body = chat("cost", 0);
    let r = send(&mut host, &mut e, 1, &body);
    let load = |host: &MockHost, ep: &str| {
        let shared = host.shared.borrow();
        shared
            .iter()
            .filter(|(k, _)| k.starts_with("ailb.glr."))
            .map(|(_, (v, _))| shared::decode_counts(v).get(ep).copied().unwrap_or(0))
            .sum::<u64>()
    };
    assert_eq!(load(&host, &r.to), body.len() as u64, "the body's bytes");
    let tokens = (body.len() as u64 / 4).max(1);
    end(&mut host, &mut e, 1);
    assert_eq!(in_flight(&host), 0, "given back in full");
    // Tokens: body bytes / 4, as least request counts them.
    let (mut host, mut e) = proxy(config(
        &endpoints(4),
        json!({"costMode": "tokens"}),
        json!({}),
        65_536,
    ));
    let r = send(&mut host, &mut e, 1, &body);
    assert_eq!(load(&host, &r.to), tokens);
    // A costly request still goes where its key hashes when that pod is idle, and stays with
    // its prefix while the imbalance (in bytes here) is within the guard.
    let (mut host, mut e) = proxy(config(
        &endpoints(4),
        json!({"costMode": "bytes"}),
        json!({"affinityMaxImbalance": 4 * body.len()}),
        65_536,
    ));
    let first = send(&mut host, &mut e, 1, &body);
    assert_eq!(first.reason, "prefix_miss");
    for ctx in 2..=5 {
        let r = send(&mut host, &mut e, ctx, &body);
        assert_eq!(
            (r.to.as_str(), r.reason.as_str()),
            (first.to.as_str(), "prefix_hit")
        );
    }
    // 5 bodies in flight there, 0 elsewhere: 5 × len > 4 × len → spill.
    let spilled = send(&mut host, &mut e, 6, &body);
    assert_eq!(spilled.reason, "prefix_spill");
    for ctx in 1..=6 {
        end(&mut host, &mut e, ctx);
    }
    assert_eq!(in_flight(&host), 0);
}

/// A plain-Envoy prefix_cache route over 4 pods with sessions from `x-session-id` or the body's
/// `metadata.conv`; `extra` merged into its `lb_config`.
fn sticky(extra: Value) -> (MockHost, Balancer) {
    let mut lb = json!({"sessionHeader": "x-session-id", "sessionBodyField": "metadata.conv"});
    merge(&mut lb, extra);
    proxy(config(&endpoints(4), json!({}), lb, 65_536))
}

fn in_session(host: &mut MockHost, e: &mut Balancer, ctx: u32, body: &[u8], sid: &str) -> Routed {
    send_with(host, e, ctx, body, &[("x-session-id", sid)])
}

/// A session id whose pod is not `avoid` (ids tried in order; 4 pods, so one comes soon).
fn session_not_on(avoid: &str) -> (String, String) {
    let (mut host, mut e) = sticky(json!({}));
    for i in 0..64u32 {
        let sid = format!("sess-{i}");
        let r = in_session(&mut host, &mut e, i, &chat(&sid, 0), &sid);
        end(&mut host, &mut e, i);
        assert_eq!(r.reason, "session");
        if r.to != avoid {
            return (sid, r.to);
        }
    }
    panic!("every session hashes to {avoid}");
}

#[test]
fn a_session_wins_over_a_prefix_match_on_every_proxy() {
    let (mut host, mut e) = sticky(json!({}));
    let body = chat("shared", 2);
    let prefix_pod = request(&mut host, &mut e, 1, &body).to;
    assert_eq!(request(&mut host, &mut e, 2, &body).reason, "prefix_hit");
    let (sid, pod) = session_not_on(&prefix_pod);
    // The known prefix names another pod: the session's pod wins, on this proxy and on one
    // that shares nothing with it.
    let (mut other, mut oe) = sticky(json!({}));
    for ctx in 3..=6 {
        let r = in_session(&mut host, &mut e, ctx, &body, &sid);
        assert_eq!(
            (r.to.as_str(), r.reason.as_str()),
            (pod.as_str(), "session")
        );
        end(&mut host, &mut e, ctx);
        let r = in_session(&mut other, &mut oe, ctx, &chat("elsewhere", 1), &sid);
        assert_eq!(r.to, pod);
        end(&mut other, &mut oe, ctx);
    }
    // The body field names the session when the header does not.
    let meta = json!({"model": "m", "metadata": {"conv": sid},
        "messages": [{"role": "user", "content": "hi"}]});
    let r = request(&mut host, &mut e, 7, meta.to_string().as_bytes());
    assert_eq!(
        (r.to.as_str(), r.reason.as_str()),
        (pod.as_str(), "session")
    );
    assert_eq!(host.metric("ai_lb.session.hit"), 5);
    assert_eq!(host.metric("ai_lb.session.rebound"), 0);
    // Without a session the prefix still routes.
    assert_eq!(request(&mut host, &mut e, 8, &body).to, prefix_pod);
    assert_eq!(in_flight(&host), 0);
}

#[test]
fn a_session_is_rebound_past_its_pod_over_the_cap_or_the_imbalance_guard() {
    // maxRequestCount 2: the session's two open turns fill its pod; the third is rebound.
    let (mut host, mut e) = sticky(json!({"maxRequestCount": 2}));
    let body = chat("capped", 0);
    let first = in_session(&mut host, &mut e, 1, &body, "cap-1");
    assert_eq!(first.reason, "session");
    assert_eq!(
        in_session(&mut host, &mut e, 2, &body, "cap-1").to,
        first.to
    );
    let moved = in_session(&mut host, &mut e, 3, &body, "cap-1");
    assert_eq!(moved.reason, "session_rebound");
    assert_ne!(moved.to, first.to);
    assert_eq!(host.metric("ai_lb.session.rebound"), 1);
    for ctx in 1..=3 {
        end(&mut host, &mut e, ctx);
    }
    let back = request_in(&mut host, &mut e, 4, &body, "cap-1");
    assert_eq!(
        (back.to.as_str(), back.reason.as_str()),
        (first.to.as_str(), "session")
    );
    // The imbalance guard (load - min > 2 and > 1.5 × min): three open turns on one pod.
    let (mut host, mut e) = sticky(json!({"affinityMaxImbalance": 2}));
    let home = in_session(&mut host, &mut e, 1, &body, "hot").to;
    for ctx in 2..=3 {
        assert_eq!(
            in_session(&mut host, &mut e, ctx, &body, "hot").reason,
            "session"
        );
    }
    let r = in_session(&mut host, &mut e, 4, &body, "hot");
    assert_eq!(r.reason, "session_rebound");
    assert_ne!(r.to, home);
    for ctx in 1..=4 {
        end(&mut host, &mut e, ctx);
    }
    assert_eq!(in_flight(&host), 0);
}

fn request_in(host: &mut MockHost, e: &mut Balancer, ctx: u32, body: &[u8], sid: &str) -> Routed {
    let r = in_session(host, e, ctx, body, sid);
    end(host, e, ctx);
    r
}

#[test]
fn a_session_leaves_a_pod_its_scraped_metrics_call_saturated_and_comes_back() {
    let lb = json!({"scrapeCluster": "scrape", "scrapeIntervalMs": 1000,
        "metricsMaxAgeMs": 3000, "sessionHeader": "x-session-id"});
    let (mut host, mut e) = proxy(config(&endpoints(3), json!({}), lb, 65_536));
    let pods = endpoints(3);
    let idle: Vec<(String, u32, f64)> = pods.iter().map(|p| (p.clone(), 0, 0.1)).collect();
    scrape(&mut host, &mut e, &idle);
    let body = chat("metrics", 1);
    let home = request_in(&mut host, &mut e, 1, &body, "m-1");
    assert_eq!(home.reason, "session");
    for (waiting, kv) in [(6, 0.1), (0, 0.95)] {
        let hot: Vec<(String, u32, f64)> = pods
            .iter()
            .map(|p| {
                if *p == home.to {
                    (p.clone(), waiting, kv)
                } else {
                    (p.clone(), 0, 0.1)
                }
            })
            .collect();
        scrape(&mut host, &mut e, &hot);
        let r = request_in(&mut host, &mut e, 2, &body, "m-1");
        assert_eq!(r.reason, "session_rebound");
        assert_ne!(r.to, home.to);
    }
    assert_eq!(host.metric("ai_lb.session.rebound"), 2);
    assert_eq!(host.metric("ai_lb.prefix.saturated"), 2);
    scrape(&mut host, &mut e, &idle);
    let back = request_in(&mut host, &mut e, 3, &body, "m-1");
    assert_eq!(
        (back.to.as_str(), back.reason.as_str()),
        (home.to.as_str(), "session")
    );
    assert_eq!(in_flight(&host), 0);
}

#[test]
fn long_unicode_and_empty_session_ids_on_plain_envoy_prefix() {
    let (mut host, mut e) = sticky(json!({}));
    let (mut other, mut oe) = sticky(json!({}));
    let long = "x".repeat(10 * 1024);
    let unicode = "\u{7528}\u{6237}-\u{1F600}".to_string();
    for (i, sid) in [long, unicode].iter().enumerate() {
        let ctx = 10 * i as u32;
        // Through the body field: a header value must be visible ASCII on the wire.
        let meta = |turn: usize| {
            json!({"model": "m", "metadata": {"conv": sid},
                "messages": [{"role": "user", "content": format!("turn {turn}")}]})
            .to_string()
        };
        let first = request(&mut host, &mut e, ctx, meta(0).as_bytes());
        assert_eq!(first.reason, "session");
        for turn in 1..=3 {
            let r = request(&mut host, &mut e, ctx + turn as u32, meta(turn).as_bytes());
            assert_eq!(
                (r.to.as_str(), r.reason.as_str()),
                (first.to.as_str(), "session")
            );
        }
        assert_eq!(
            request(&mut other, &mut oe, ctx, meta(9).as_bytes()).to,
            first.to
        );
    }
    let long_header = "y".repeat(10 * 1024);
    let r = request_in(&mut host, &mut e, 40, &chat("h", 0), &long_header);
    assert_eq!(r.reason, "session");
    // An empty header and an empty body field name no session: the prefix decides.
    let empty = json!({"model": "m", "metadata": {"conv": ""},
        "messages": [{"role": "user", "content": "plain"}]});
    let r = request_in(&mut host, &mut e, 41, empty.to_string().as_bytes(), "");
    assert_eq!(r.reason, "prefix_miss");
    assert_eq!(host.metric("ai_lb.session.hit"), 9);
    assert_eq!(in_flight(&host), 0);
}

#[test]
fn a_turn_that_waited_for_room_is_still_routed_by_its_prefix() {
    let lb = json!({"maxPoolRequests": 2, "queueTimeoutMs": 1000});
    let (mut host, mut e) = proxy(config(&endpoints(3), lb, json!({}), 65_536));
    let first = request(&mut host, &mut e, 2, &chat("alpha", 0));
    // Two other conversations fill the pool.
    send(&mut host, &mut e, 3, &chat("beta", 0));
    send(&mut host, &mut e, 4, &chat("gamma", 0));
    // alpha's next turn waits for room, headers and body held.
    host.body = chat("alpha", 1);
    host.live_contexts.push(5);
    assert_eq!(e.on_request_headers(&mut host, 5, false), Verdict::Pause);
    let len = host.body.len();
    assert_eq!(e.on_request_body(&mut host, 5, len, true), Verdict::Pause);
    assert_eq!((e.queued(), host.local_responses.len()), (1, 0));
    // The body is unreadable once its callback returned: the retry must not need it.
    host.body = b"not json".to_vec();
    end(&mut host, &mut e, 3);
    assert_eq!(e.queued(), 0, "admitted by the release");
    let dest = header(&host.request_headers, DEST).unwrap_or_default();
    host.response_headers = vec![(":status".into(), "200".into())];
    e.on_response_headers(&mut host, 5);
    let debug = header(&host.response_headers, DEBUG).unwrap_or_default();
    assert!(dest.starts_with(&first.to), "{dest} after waiting");
    assert!(debug.contains("reason=prefix_hit"), "{debug}");
    for ctx in [4, 5] {
        end(&mut host, &mut e, ctx);
    }
    assert_eq!((in_flight(&host), e.tracked()), (0, (0, 0)));
}

/// Sets this proxy's booked prefill tokens of `endpoint` (the counts record's `~p` line).
fn set_booked(host: &mut MockHost, endpoint: &str, tokens: u64) {
    let mut shared = host.shared.borrow_mut();
    for (key, (v, _)) in shared.iter_mut() {
        if key.starts_with("ailb.glr.") {
            let mut counts = shared::decode_counts(v);
            counts.insert(format!("~p{endpoint}"), tokens);
            *v = shared::encode_counts(&counts);
        }
    }
}

/// The token gate per proxy (docs/redis-data-model.md §13): a pick books its uncached tokens
/// with its count, its first bytes give them back, and a warm pod whose booked prefill would
/// make the request wait longer than a cold pod by more than the penalty is left for the
/// fastest cold one.
#[test]
fn the_token_gate_leaves_a_warm_pod_with_a_long_prefill_queue() {
    let gate = json!({"peakPrefillThroughput": 1_000, "maxTTFTPenaltyMs": 500});
    let (mut host, mut e) = proxy(config(&endpoints(3), json!({}), gate, 65_536));
    let doc = |turn: &str| {
        json!({"model": "m", "stream": true, "messages": [
            {"role": "user", "content": format!("a long document {}", "text ".repeat(1_600))},
            {"role": "assistant", "content": "read it"},
            {"role": "user", "content": turn}]})
        .to_string()
        .into_bytes()
    };
    let first = send(&mut host, &mut e, 1, &doc("question 1"));
    let all = booked(&host);
    assert!(all >= 2_000, "the whole prompt is booked: {all}");
    // Its first bytes give the booking back; the count stays until stream end.
    assert!(e.wants_response_body(1));
    e.on_response_body(&mut host, 1, 10, false);
    assert_eq!((booked(&host), in_flight(&host)), (0, 1));
    e.on_response_body(&mut host, 1, 10, false);
    assert_eq!((booked(&host), in_flight(&host)), (0, 1), "given back once");
    end(&mut host, &mut e, 1);
    // The next turn: the warm pod has nothing booked, a few tokens to prefill: kept.
    let next = send(&mut host, &mut e, 2, &doc("question 2"));
    assert_eq!(
        (next.to.as_str(), next.reason.as_str()),
        (first.to.as_str(), "prefix_hit")
    );
    assert!(
        booked(&host) < 100,
        "only the new turn's tokens: {}",
        booked(&host)
    );
    end(&mut host, &mut e, 2);
    // 30,000 tokens queued on it: 30 s against the cold pods' ~2 s: left.
    set_booked(&mut host, &first.to, 30_000);
    let spilled = send(&mut host, &mut e, 3, &doc("question 3"));
    assert_eq!(spilled.reason, "prefix_spill");
    assert_ne!(spilled.to, first.to);
    // Stream end before any first bytes gives the cold pod's booking back with its count.
    end(&mut host, &mut e, 3);
    assert_eq!((booked(&host), in_flight(&host)), (30_000, 0));
}
