//! Priority classes (docs/sessions-and-queues.md "Priority classes") against the mock host: the class cap sent to
//! the acquire script (Higress build), the plain-Envoy class order under a full pool, the 429
//! with `Retry-After`, the counters, and that a shed request holds nothing.

use super::tests::{configured, deliver};
use super::*;
use crate::config::Build;
use crate::host::mock::MockHost;
use crate::redis::resp::encode_command;
use serde_json::{json, Value};

const CLUSTER: &str = "outbound|8000||llm.static";
const PRIO: &str = "x-priority";
const DEBUG: &str = "x-ai-lb-debug";

fn higress(lb: Value) -> (MockHost, Balancer) {
    let mut cfg = json!({"serviceFQDN": "redis.static", "servicePort": 6379});
    if let (Value::Object(a), Value::Object(b)) = (&mut cfg, lb) {
        a.extend(b);
    }
    let doc = json!({"lb_policy": "global_least_request", "lb_config": cfg});
    let config = PluginConfig::parse(doc.to_string().as_bytes()).unwrap();
    let host = MockHost::new()
        .with_route("chat", CLUSTER)
        .with_hosts(&[("10.0.0.1:80", "Healthy"), ("10.0.0.2:80", "Healthy")]);
    configured(host, config)
}

/// Starts a Higress request of class header `value` (None: no header); the cap it sent.
fn higress_start(host: &mut MockHost, e: &mut Balancer, ctx: u32, value: Option<&str>) -> String {
    host.request_headers = value
        .map(|v| vec![(PRIO.to_string(), v.to_string())])
        .unwrap_or_default();
    host.live_contexts.push(ctx);
    assert_eq!(e.on_request_headers(host, ctx, false), Verdict::Pause);
    assert_eq!(e.on_request_body(host, ctx, 20, true), Verdict::Pause);
    host.last_query_args()[15].clone()
}

const LB: fn() -> Value = || {
    json!({"maxRequestCount": 4, "priorityHeader": "X-Priority", "criticalHeadroom": 2,
           "priorityReserve": 1, "debugHeader": DEBUG})
};

#[test]
fn each_class_sends_its_own_cap_to_the_acquire_script() {
    let (mut host, mut e) = higress(LB());
    let cases = [
        (Some("critical"), "6"),
        (Some("CRITICAL "), "6"),
        (Some("0"), "6"),
        (Some("standard"), "4"),
        (Some("1"), "4"),
        (None, "4"),
        (Some("sheddable"), "3"),
        (Some("2"), "3"),
        // Repeated header (joined by ','): the lowest class named, never a raise.
        (Some("critical, sheddable"), "3"),
        (Some("critical,critical"), "6"),
        // Unknown, empty and out-of-range values: the default class, counted.
        (Some("vip"), "4"),
        (Some(""), "4"),
        (Some("3"), "4"),
        (Some("critical,vip"), "4"),
        (Some(&"x".repeat(10_000)), "4"),
    ];
    for (n, (value, cap)) in cases.iter().enumerate() {
        let sent = higress_start(&mut host, &mut e, 2 + n as u32, *value);
        assert_eq!(sent, *cap, "{value:?}");
    }
    assert_eq!(host.metric("ai_lb.priority.unknown_class"), 5);
}

#[test]
fn without_priority_classes_the_cap_is_max_request_count() {
    let (mut host, mut e) = higress(json!({"maxRequestCount": 4}));
    assert_eq!(higress_start(&mut host, &mut e, 2, Some("critical")), "4");
    assert_eq!(host.metric("ai_lb.priority.unknown_class"), 0);
}

#[test]
fn a_full_pool_sheds_with_429_retry_after_and_holds_nothing() {
    let (mut host, mut e) = higress(LB());
    higress_start(&mut host, &mut e, 2, Some("sheddable"));
    let token = host.next_token - 4;
    deliver(&mut host, &mut e, token, &encode_command(&["FULL", "3"]));
    assert_eq!(
        host.local_responses,
        vec![(429, "ai_lb_shed_priority".to_string())]
    );
    assert_eq!(
        host.local_response_headers,
        vec![vec![("retry-after".to_string(), "1".to_string())]]
    );
    assert_eq!(host.metric("ai_lb.priority.shed"), 1);
    assert_eq!(host.metric("ai_lb.glr.rejected_429"), 1);
    let calls = host.redis_calls.len();
    host.live_contexts.retain(|&c| c != 2);
    e.on_done(&mut host, 2);
    assert_eq!(
        host.redis_calls.len(),
        calls,
        "a shed request releases nothing"
    );
    assert_eq!(e.tracked(), (0, 0));
}

#[test]
fn a_pick_past_max_request_count_counts_the_headroom_from_the_scripts_reply() {
    let (mut host, mut e) = higress(LB());
    // The reply's last item is the chosen endpoint's load before the request.
    for (ctx, before, headroom) in [(2, "3", 0), (3, "4", 1), (4, "5", 2)] {
        higress_start(&mut host, &mut e, ctx, Some("critical"));
        let token = host.next_token - 4;
        let reply = encode_command(&["OK", "10.0.0.1:80", "0", "0", "0", before]);
        deliver(&mut host, &mut e, token, &reply);
        assert_eq!(
            host.metric("ai_lb.priority.admitted_headroom"),
            headroom,
            "load {before} before, maxRequestCount 4"
        );
    }
}

// ---- plain Envoy: the per-proxy counts in shared data ----

fn envoy(lb: Value) -> (MockHost, Balancer) {
    let mut cfg = json!({"endpoints": ["10.0.0.1:8000", "10.0.0.2:8000"], "debugHeader": DEBUG});
    if let (Value::Object(a), Value::Object(b)) = (&mut cfg, lb) {
        a.extend(b);
    }
    let doc = json!({"lb_policy": "global_least_request", "lb_config": cfg});
    let config = PluginConfig::parse_for(doc.to_string().as_bytes(), Build::Envoy).unwrap();
    let mut host = MockHost::new();
    let e = Balancer::configure(&mut host, config, 42, LogLevel::Trace);
    (host, e)
}

/// Sends request `ctx` of class `value` and leaves it open: whether it was admitted, and the
/// debug reason.
fn envoy_send(host: &mut MockHost, e: &mut Balancer, ctx: u32, value: &str) -> (bool, String) {
    envoy_send_with(host, e, ctx, value, &[])
}

/// [`envoy_send`] with `more` request headers.
fn envoy_send_with(
    host: &mut MockHost,
    e: &mut Balancer,
    ctx: u32,
    value: &str,
    more: &[(&str, &str)],
) -> (bool, String) {
    host.request_headers = vec![(PRIO.into(), value.into())];
    host.request_headers
        .extend(more.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    host.response_headers = vec![(":status".into(), "200".into())];
    host.body = br#"{"model":"m","prompt":"hi"}"#.to_vec();
    let before = host.local_responses.len();
    host.live_contexts.push(ctx);
    e.on_request_headers(host, ctx, false);
    let len = host.body.len();
    e.on_request_body(host, ctx, len, true);
    e.on_response_headers(host, ctx);
    let admitted = host.local_responses.len() == before;
    let reason = host
        .response_headers
        .iter()
        .find(|(k, _)| k == DEBUG)
        .map(|(_, v)| v.rsplit("reason=").next().unwrap_or("").to_string())
        .unwrap_or_default();
    (admitted, reason)
}

fn in_flight(host: &MockHost) -> u64 {
    let shared = host.shared.borrow();
    shared
        .iter()
        .filter(|(k, _)| k.starts_with("ailb.glr."))
        .map(|(_, (v, _))| shared::decode_counts(v).values().sum::<u64>())
        .sum()
}

#[test]
fn under_a_full_pool_lower_classes_are_refused_first_and_critical_uses_the_headroom() {
    // 2 endpoints, cap 4: sheddable admitted up to load 3 per endpoint (6 in all), standard up
    // to 4 (8), critical up to 6 (12).
    let (mut host, mut e) = envoy(LB());
    let mut ctx = 2;
    let mut admitted = |host: &mut MockHost, e: &mut Balancer, class: &str| {
        ctx += 1;
        envoy_send(host, e, ctx, class)
    };
    for n in 0..6 {
        assert!(admitted(&mut host, &mut e, "sheddable").0, "sheddable {n}");
    }
    let (ok, reason) = admitted(&mut host, &mut e, "sheddable");
    assert!(!ok);
    assert_eq!(reason, "shed_priority");
    assert_eq!(
        host.local_response_headers.last().unwrap()[0].0,
        "retry-after"
    );
    assert!(admitted(&mut host, &mut e, "standard").0);
    assert!(admitted(&mut host, &mut e, "standard").0);
    assert!(
        !admitted(&mut host, &mut e, "standard").0,
        "standard stops at the cap"
    );
    assert!(!admitted(&mut host, &mut e, "sheddable").0);
    assert_eq!(host.metric("ai_lb.priority.admitted_headroom"), 0);
    for n in 0..4 {
        assert!(admitted(&mut host, &mut e, "critical").0, "critical {n}");
    }
    assert_eq!(host.metric("ai_lb.priority.admitted_headroom"), 4);
    assert!(
        !admitted(&mut host, &mut e, "critical").0,
        "critical stops at cap + headroom"
    );
    assert_eq!(host.metric("ai_lb.priority.shed"), 4);
    assert_eq!(in_flight(&host), 12, "shed requests hold no count");
    // Every admitted request gives its count back once; shed ones give back nothing.
    for c in 3..=ctx {
        host.live_contexts.retain(|&x| x != c);
        e.on_done(&mut host, c);
    }
    assert_eq!(in_flight(&host), 0);
}

#[test]
fn priority_keys_are_checked() {
    let bad = [
        (json!({"priorityClasses": ["a", "b"]}), "priorityClasses"),
        (json!({"criticalHeadroom": 2}), "criticalHeadroom"),
        (json!({"priorityHeader": "x-p"}), "priorityHeader"),
        (
            json!({"maxRequestCount": 2, "priorityHeader": "bad header"}),
            "priorityHeader",
        ),
        (
            json!({"maxRequestCount": 2, "priorityHeader": "x-p", "priorityClasses": ["a"]}),
            "priorityClasses",
        ),
        (
            json!({"maxRequestCount": 2, "priorityHeader": "x-p", "priorityClasses": ["a", "A"]}),
            "priorityClasses[1]",
        ),
        (
            json!({"maxRequestCount": 2, "priorityHeader": "x-p", "priorityClasses": ["a", "7"]}),
            "priorityClasses[1]",
        ),
        (
            json!({"maxRequestCount": 2, "priorityHeader": "x-p", "priorityClasses": ["a", ""]}),
            "priorityClasses[1]",
        ),
        (
            json!({"maxRequestCount": 2, "priorityHeader": "x-p", "defaultPriorityClass": "gold"}),
            "defaultPriorityClass",
        ),
        (
            json!({"maxRequestCount": 2, "priorityHeader": "x-p", "priorityReserve": 2}),
            "priorityReserve",
        ),
        (
            json!({"maxRequestCount": 2, "priorityHeader": "x-p", "criticalHeadroom": -1}),
            "criticalHeadroom",
        ),
        (
            json!({"maxRequestCount": 2, "priorityHeader": "x-p", "criticalHeadroom": "1"}),
            "criticalHeadroom",
        ),
    ];
    for (lb, key) in bad {
        let doc = json!({"lb_policy": "global_least_request",
                         "lb_config": {"serviceFQDN": "redis.static", "servicePort": 6379}});
        let mut doc = doc;
        if let (Some(Value::Object(a)), Value::Object(b)) = (doc.get_mut("lb_config"), lb.clone()) {
            a.extend(b);
        }
        let err = PluginConfig::parse(doc.to_string().as_bytes())
            .err()
            .unwrap_or_else(|| panic!("{lb} must be refused"));
        assert!(err.to_string().contains(key), "{lb}: {err}");
    }
    let doc = json!({"lb_policy": "global_least_request", "lb_config": {
        "serviceFQDN": "redis.static", "servicePort": 6379, "maxRequestCount": 5,
        "priorityHeader": "X-P", "priorityClasses": ["Gold", "silver", "bronze", "lead"],
        "defaultPriorityClass": "bronze"}});
    let cfg = PluginConfig::parse(doc.to_string().as_bytes()).unwrap();
    let p = cfg.global.unwrap().common.priority.clone().unwrap();
    assert_eq!(p.header, "x-p");
    assert_eq!(p.classes, ["gold", "silver", "bronze", "lead"]);
    assert_eq!(p.default_rank, 2);
    assert_eq!((p.critical_headroom, p.reserve), (0, 0));
    assert_eq!(
        [p.cap_for(0, 5), p.cap_for(1, 5), p.cap_for(3, 5)],
        [5, 5, 5]
    );
    // Without "standard" in the list the default is the lowest class.
    let doc = json!({"lb_policy": "global_least_request", "lb_config": {
        "serviceFQDN": "redis.static", "servicePort": 6379, "maxRequestCount": 5,
        "priorityHeader": "x-p", "priorityClasses": ["hi", "lo"]}});
    let cfg = PluginConfig::parse(doc.to_string().as_bytes()).unwrap();
    assert_eq!(
        cfg.global
            .unwrap()
            .common
            .priority
            .as_ref()
            .unwrap()
            .default_rank,
        1
    );
}

#[test]
fn sticky_requests_are_held_to_their_class_cap_too() {
    // The same pool as above, every request of one session: the session's pod fills first,
    // then the ring walk, and each class still stops at its own cap.
    let mut lb = LB();
    lb["sessionHeader"] = json!("x-session-id");
    let (mut host, mut e) = envoy(lb);
    let mut ctx = 2;
    let mut send = |host: &mut MockHost, e: &mut Balancer, class: &str| {
        ctx += 1;
        let (ok, reason) = envoy_send_with(host, e, ctx, class, &[("x-session-id", "s1")]);
        (ok, reason, ctx)
    };
    for n in 0..6 {
        let (ok, reason, _) = send(&mut host, &mut e, "sheddable");
        assert!(ok, "sheddable {n}");
        assert!(reason.starts_with("session"), "{reason}");
    }
    assert_eq!(send(&mut host, &mut e, "sheddable").1, "shed_priority");
    assert!(send(&mut host, &mut e, "standard").0);
    assert!(send(&mut host, &mut e, "standard").0);
    assert!(
        !send(&mut host, &mut e, "standard").0,
        "standard stops at the cap"
    );
    for n in 0..4 {
        assert!(send(&mut host, &mut e, "critical").0, "critical {n}");
    }
    assert_eq!(host.metric("ai_lb.priority.admitted_headroom"), 4);
    let (ok, _, last) = send(&mut host, &mut e, "critical");
    assert!(!ok, "critical stops at cap + headroom");
    assert_eq!(host.metric("ai_lb.priority.shed"), 3);
    assert_eq!(in_flight(&host), 12, "shed requests hold no count");
    for c in 3..=last {
        host.live_contexts.retain(|&x| x != c);
        e.on_done(&mut host, c);
    }
    assert_eq!(in_flight(&host), 0);
}
