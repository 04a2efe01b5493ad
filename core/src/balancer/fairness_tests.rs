//! The pool cap and tenant fairness (docs/sessions-and-queues.md "Tenant fairness") against the mock host: the
//! strict keys, the tenant of a header value, what the Higress build sends to the acquire
//! script and how it answers a refusal, and the plain-Envoy counts record deciding alone.

use super::tests::{configured, deliver};
use super::*;
use crate::config::{Build, Fairness};
use crate::host::mock::MockHost;
use crate::redis::resp::encode_command;
use serde_json::{json, Value};

const CLUSTER: &str = "outbound|8000||llm.static";
const TENANT: &str = "x-gateway-inference-fairness-id";
const DEBUG: &str = "x-ai-lb-debug";

fn parse(build: Build, lb: Value) -> Result<PluginConfig, crate::config::ConfigError> {
    let mut cfg = match build {
        Build::Higress => json!({"serviceFQDN": "redis.static", "servicePort": 6379}),
        Build::Envoy => json!({"endpoints": ["10.0.0.1:8000", "10.0.0.2:8000"]}),
    };
    if let (Value::Object(a), Value::Object(b)) = (&mut cfg, lb) {
        a.extend(b);
    }
    let policy = cfg
        .as_object_mut()
        .and_then(|m| m.remove("policy"))
        .unwrap_or(json!("global_least_request"));
    let doc = json!({"lb_policy": policy, "lb_config": cfg});
    PluginConfig::parse_for(doc.to_string().as_bytes(), build)
}

#[test]
fn fairness_keys_are_checked_strictly() {
    let bad = [
        (json!({"maxPoolRequests": 0}), "maxPoolRequests"),
        (json!({"maxPoolRequests": -3}), "maxPoolRequests"),
        (json!({"maxPoolRequests": "8"}), "maxPoolRequests"),
        (json!({"tenantShares": {"a": 0.5}}), "tenantShares"),
        (json!({"tenantWindow": 1000}), "tenantWindow"),
        (json!({"defaultTenantShare": 0.5}), "defaultTenantShare"),
        (json!({"tenantHeader": TENANT}), "tenantHeader"),
        (
            json!({"maxPoolRequests": 8, "tenantHeader": "bad header"}),
            "tenantHeader",
        ),
        (
            json!({"maxPoolRequests": 8, "tenantHeader": TENANT, "defaultTenantShare": 0}),
            "defaultTenantShare",
        ),
        (
            json!({"maxPoolRequests": 8, "tenantHeader": TENANT, "defaultTenantShare": 1.5}),
            "defaultTenantShare",
        ),
        (
            json!({"maxPoolRequests": 8, "tenantHeader": TENANT, "tenantShares": {"a": -0.1}}),
            "tenantShares.a",
        ),
        (
            json!({"maxPoolRequests": 8, "tenantHeader": TENANT, "tenantShares": {"": 0.5}}),
            "tenantShares",
        ),
        (
            json!({"maxPoolRequests": 8, "tenantHeader": TENANT, "tenantShares": ["a"]}),
            "tenantShares",
        ),
        (
            json!({"maxPoolRequests": 8, "tenantHeader": TENANT, "tenantWindow": 5}),
            "tenantWindow",
        ),
        (
            json!({"maxPoolRequests": 2, "priorityHeader": "x-p", "priorityReserve": 2}),
            "priorityReserve",
        ),
        (
            json!({"policy": "endpoint_metrics", "maxPoolRequests": 8}),
            "maxPoolRequests",
        ),
    ];
    for build in [Build::Higress, Build::Envoy] {
        for (lb, key) in &bad {
            let err = parse(build, lb.clone())
                .err()
                .unwrap_or_else(|| panic!("{lb} must be refused"));
            assert!(err.to_string().contains(key), "{lb}: {err}");
        }
    }
    let cfg = parse(
        Build::Higress,
        json!({"maxRequestCount": 3, "tenantHeader": "X-Tenant",
               "tenantShares": {"gold": 0.9, "Free": 0.1}, "tenantWindow": 500}),
    )
    .unwrap();
    let common = &cfg.global.as_ref().unwrap().common;
    let f = common.fairness.as_ref().unwrap();
    assert_eq!(f.header, "x-tenant");
    assert_eq!((f.default_share, f.window_ms), (0.5, 500));
    assert_eq!(common.max_pool, 0);
    // Priority classes may stand on the pool cap alone.
    let cfg = parse(
        Build::Envoy,
        json!({"maxPoolRequests": 6, "priorityHeader": "x-p", "priorityReserve": 2,
               "policy": "prefix_cache"}),
    )
    .unwrap();
    assert_eq!(cfg.global.unwrap().common.max_pool, 6);
}

#[test]
fn the_tenant_of_a_header_value() {
    let f = Fairness {
        header: TENANT.into(),
        shares: [("gold".to_string(), 0.9)].into_iter().collect(),
        default_share: 0.25,
        window_ms: 1000,
    };
    let t = |v: &[u8]| f.tenant_of(Some(v));
    assert_eq!(f.tenant_of(None), None);
    assert_eq!(t(b""), None, "empty: no tenant");
    assert_eq!(t(b" , x"), None, "an empty first value: no tenant");
    let gold = t(b"gold").unwrap();
    assert_eq!(gold.share, 0.9);
    assert_eq!(gold.id.len(), 16);
    assert!(gold.id.bytes().all(|b| b.is_ascii_hexdigit()));
    // A repeated header is its first value's tenant, never another one's share.
    assert_eq!(t(b"gold, free"), Some(gold.clone()));
    assert_eq!(t(b" gold "), Some(gold.clone()));
    assert_eq!(t(b"free, gold").unwrap().share, 0.25);
    assert_ne!(t(b"Gold").unwrap().id, gold.id, "names are exact");
    let huge = vec![b'x'; 10 * 1024];
    let h = t(&huge).unwrap();
    assert_eq!((h.id.len(), h.share), (16, 0.25));
    let uni = t("\u{79df}\u{6237}-\u{1F600}".as_bytes()).unwrap();
    assert_eq!(uni.id.len(), 16);
    assert_ne!(
        t(&[0xff, 0xfe]).unwrap().id,
        uni.id,
        "not UTF-8: still a tenant"
    );
    assert_eq!(Fairness::limit(0.5, 8), 4);
    assert_eq!(Fairness::limit(0.1, 4), 1, "every tenant may hold one");
}

// ---- Higress build: the acquire carries the pool cap and the tenant ----

fn higress(lb: Value) -> (MockHost, Balancer) {
    let config = parse(Build::Higress, lb).unwrap();
    let host = MockHost::new()
        .with_route("chat", CLUSTER)
        .with_hosts(&[("10.0.0.1:80", "Healthy"), ("10.0.0.2:80", "Healthy")]);
    configured(host, config)
}

/// Starts request `ctx` with `headers`; the acquire's arguments from the pool cap on
/// (pool cap, tenant id, tenant limit, window) and its token.
fn start(host: &mut MockHost, e: &mut Balancer, ctx: u32, headers: &[(&str, &str)]) -> Vec<String> {
    host.request_headers = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    host.live_contexts.push(ctx);
    assert_eq!(e.on_request_headers(host, ctx, false), Verdict::Pause);
    assert_eq!(e.on_request_body(host, ctx, 20, true), Verdict::Pause);
    let args = host.last_query_args();
    let numkeys: usize = args[2].parse().unwrap();
    assert_eq!(
        args[3 + numkeys - 2],
        "ailb:{chat|outbound|8000||llm.static}:tenants"
    );
    args[3 + numkeys + 11..3 + numkeys + 15].to_vec()
}

#[test]
fn the_acquire_carries_the_class_pool_cap_and_the_tenant_limit() {
    let (mut host, mut e) = higress(json!({"maxPoolRequests": 10, "priorityHeader": "x-p",
        "criticalHeadroom": 3, "priorityReserve": 4, "tenantHeader": TENANT,
        "tenantShares": {"gold": 0.8}, "tenantWindow": 2000}));
    let gold = crate::config::tenant_id(b"gold");
    let free = crate::config::tenant_id(b"free");
    type Case<'a> = (&'a [(&'a str, &'a str)], [&'a str; 4]);
    let cases: [Case; 4] = [
        (&[], ["10", "", "0", "1"]),
        (
            &[("x-p", "critical"), (TENANT, "gold")],
            ["13", &gold, "8", "2000"],
        ),
        (
            &[("x-p", "sheddable"), (TENANT, "free")],
            ["6", &free, "5", "2000"],
        ),
        (&[(TENANT, "")], ["10", "", "0", "1"]),
    ];
    for (n, (headers, want)) in cases.iter().enumerate() {
        assert_eq!(
            start(&mut host, &mut e, 2 + n as u32, headers),
            want,
            "{headers:?}"
        );
    }
    // Without maxPoolRequests, shares are of endpoints × maxRequestCount (2 × 3).
    let (mut host, mut e) = higress(json!({"maxRequestCount": 3, "tenantHeader": TENANT}));
    let args = start(&mut host, &mut e, 2, &[(TENANT, "a")]);
    assert_eq!((args[0].as_str(), args[2].as_str()), ("0", "3"));
}

#[test]
fn a_tenant_refusal_is_a_429_with_retry_after_and_holds_nothing() {
    let (mut host, mut e) = higress(json!({"maxPoolRequests": 4, "tenantHeader": TENANT,
        "debugHeader": DEBUG}));
    start(&mut host, &mut e, 2, &[(TENANT, "flood")]);
    let token = host.next_token - 4;
    deliver(&mut host, &mut e, token, &encode_command(&["TENANT", "2"]));
    assert_eq!(
        host.local_responses,
        vec![(429, "ai_lb_shed_tenant".to_string())]
    );
    assert_eq!(
        host.local_response_headers,
        vec![vec![("retry-after".to_string(), "1".to_string())]]
    );
    assert_eq!(host.metric("ai_lb.tenant.shed"), 1);
    assert_eq!(host.metric("ai_lb.glr.rejected_429"), 1);
    // A full pool answers as a full set of endpoints does, counted apart.
    start(&mut host, &mut e, 3, &[(TENANT, "flood")]);
    let token = host.next_token - 4;
    deliver(&mut host, &mut e, token, &encode_command(&["POOL", "4"]));
    assert_eq!(
        host.local_responses.last(),
        Some(&(429, "ai_lb_max_request_count".to_string()))
    );
    assert_eq!(host.metric("ai_lb.pool.full"), 1);
    let calls = host.redis_calls.len();
    for c in [2, 3] {
        host.live_contexts.retain(|&x| x != c);
        e.on_done(&mut host, c);
    }
    assert_eq!(host.redis_calls.len(), calls, "a refusal releases nothing");
    assert_eq!(e.tracked(), (0, 0));
}

#[test]
fn the_lease_carries_the_tenant_and_redis_trouble_is_counted() {
    let (mut host, mut e) = higress(json!({"maxPoolRequests": 4, "tenantHeader": TENANT}));
    start(&mut host, &mut e, 2, &[(TENANT, "t1")]);
    let rid = host.last_query_args()[13].clone();
    let token = host.next_token - 4;
    let reply = encode_command(&["OK", "10.0.0.2:80", "0", "0", "0", "0"]);
    deliver(&mut host, &mut e, token, &reply);
    host.live_contexts.retain(|&x| x != 2);
    e.on_done(&mut host, 2);
    let rel = host.last_query_args();
    let id = crate::config::tenant_id(b"t1");
    assert_eq!(rel[5], "ailb:{chat|outbound|8000||llm.static}:tenants");
    assert_eq!(rel[15], format!("{rid}~{id}|10.0.0.2:80|1"));
    // Redis down: the tenant's request falls back unheld to its share, counted.
    start(&mut host, &mut e, 3, &[(TENANT, "t1")]);
    let token = host.next_token - 4;
    e.on_redis_reply(&mut host, token, CallStatus::Failed, 0);
    assert_eq!(host.metric("ai_lb.tenant.fallback"), 1);
    // A request without a tenant falling back is not a tenant's.
    start(&mut host, &mut e, 4, &[]);
    let token = host.next_token - 4;
    e.on_redis_reply(&mut host, token, CallStatus::Failed, 0);
    assert_eq!(host.metric("ai_lb.tenant.fallback"), 1);
}

// ---- plain Envoy: the counts record decides alone ----

fn envoy(lb: Value) -> (MockHost, Balancer) {
    let mut lb = lb;
    lb["debugHeader"] = json!(DEBUG);
    let config = parse(Build::Envoy, lb).unwrap();
    let mut host = MockHost::new();
    let e = Balancer::configure(&mut host, config, 42, LogLevel::Trace);
    (host, e)
}

/// Sends request `ctx` of `tenant` (None: no header) and leaves it open: admitted?, reason.
fn send(host: &mut MockHost, e: &mut Balancer, ctx: u32, tenant: Option<&str>) -> (bool, String) {
    host.request_headers = tenant
        .map(|t| vec![(TENANT.to_string(), t.to_string())])
        .unwrap_or_default();
    host.response_headers = vec![(":status".into(), "200".into())];
    let before = host.local_responses.len();
    host.live_contexts.push(ctx);
    e.on_request_headers(host, ctx, true);
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

fn record(host: &MockHost) -> std::collections::HashMap<String, u64> {
    let shared = host.shared.borrow();
    let (_, (v, _)) = shared
        .iter()
        .find(|(k, _)| k.starts_with("ailb.glr."))
        .expect("the counts record");
    shared::decode_counts(v)
}

fn in_flight(host: &MockHost) -> u64 {
    record(host)
        .iter()
        .filter(|(k, _)| !k.starts_with('~'))
        .map(|(_, v)| v)
        .sum()
}

fn done(host: &mut MockHost, e: &mut Balancer, ctx: u32) {
    host.live_contexts.retain(|&x| x != ctx);
    e.on_done(host, ctx);
}

#[test]
fn plain_envoy_holds_a_flooding_tenant_to_its_share_and_lets_a_lone_one_use_it_all() {
    let (mut host, mut e) = envoy(json!({"maxPoolRequests": 6, "tenantHeader": TENANT,
        "tenantWindow": 1000}));
    let mut ctx = 1;
    let mut go = |host: &mut MockHost, e: &mut Balancer, t: Option<&str>| {
        ctx += 1;
        let (ok, reason) = send(host, e, ctx, t);
        (ok, reason, ctx)
    };
    // Alone: the whole pool, then the pool cap (429 without classes).
    for n in 0..6 {
        assert!(go(&mut host, &mut e, Some("flood")).0, "alone {n}");
    }
    let (ok, reason, _) = go(&mut host, &mut e, Some("flood"));
    assert!(!ok);
    assert_eq!(reason, "rejected_429");
    assert_eq!(host.metric("ai_lb.pool.full"), 1);
    // The quiet tenant asks at a full pool: refused, but now active; the flood's freed room
    // is not the flood's again above its share of 3.
    assert!(!go(&mut host, &mut e, Some("quiet")).0);
    done(&mut host, &mut e, 2);
    done(&mut host, &mut e, 3);
    let (ok, reason, _) = go(&mut host, &mut e, Some("flood"));
    assert!(!ok);
    assert_eq!(reason, "shed_tenant");
    assert_eq!(host.metric("ai_lb.tenant.shed"), 1);
    assert_eq!(
        host.local_response_headers.last().unwrap()[0].0,
        "retry-after"
    );
    let (ok1, _, q1) = go(&mut host, &mut e, Some("quiet"));
    let (ok2, _, q2) = go(&mut host, &mut e, Some("quiet"));
    assert!(ok1 && ok2);
    // Requests without a tenant are only held to the pool cap.
    assert!(!go(&mut host, &mut e, None).0);
    // The quiet tenant leaves and its window passes: the flood has the pool again.
    done(&mut host, &mut e, q1);
    done(&mut host, &mut e, q2);
    host.now_ms += 1001;
    assert!(go(&mut host, &mut e, Some("flood")).0);
    let (ok, _, last) = go(&mut host, &mut e, Some("flood"));
    assert!(ok);
    assert_eq!(in_flight(&host), 6);
    for c in 2..=last {
        done(&mut host, &mut e, c);
    }
    assert_eq!(
        in_flight(&host),
        0,
        "every admitted request gave its count back"
    );
    assert!(
        record(&host).keys().all(|k| !k.starts_with("~t")),
        "tenant counts at 0 are dropped: {:?}",
        record(&host)
    );
}

#[test]
fn plain_envoy_pool_cap_follows_the_class() {
    let (mut host, mut e) = envoy(json!({"maxPoolRequests": 3, "priorityHeader": "x-p",
        "criticalHeadroom": 1, "priorityReserve": 1}));
    let admitted = |host: &mut MockHost, e: &mut Balancer, ctx: u32, class: &str| {
        host.request_headers = vec![("x-p".into(), class.into())];
        let before = host.local_responses.len();
        host.live_contexts.push(ctx);
        e.on_request_headers(host, ctx, true);
        host.local_responses.len() == before
    };
    assert!(admitted(&mut host, &mut e, 2, "sheddable"));
    assert!(admitted(&mut host, &mut e, 3, "sheddable"));
    assert!(
        !admitted(&mut host, &mut e, 4, "sheddable"),
        "3 - 1 reserve"
    );
    assert!(admitted(&mut host, &mut e, 5, "standard"));
    assert!(!admitted(&mut host, &mut e, 6, "standard"));
    assert!(admitted(&mut host, &mut e, 7, "critical"), "3 + 1 headroom");
    assert!(!admitted(&mut host, &mut e, 8, "critical"));
    assert_eq!(
        host.local_responses.last(),
        Some(&(429, "ai_lb_shed_priority".to_string()))
    );
    assert_eq!(host.metric("ai_lb.pool.full"), 3);
    assert_eq!(in_flight(&host), 4);
    for c in 2..=8 {
        done(&mut host, &mut e, c);
    }
    assert_eq!(in_flight(&host), 0);
}
