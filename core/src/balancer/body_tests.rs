//! Plain Envoy and the request body: routes that use it hold the request until its end (and
//! no longer), the body deadline bounds the hold when the host never delivers it, and a VM
//! that sees the body withheld stops holding (docs/higress-abi.md §10).

use super::body_flow::WITHHELD_GAP_MS;
use super::*;
use crate::config::Build;
use crate::host::mock::MockHost;
use crate::host::HostErrorKind;
use serde_json::json;

const DEST: &str = "x-gateway-destination-endpoint";

fn envoy(lb: serde_json::Value) -> (MockHost, Balancer) {
    let cfg = json!({"lb_policy": "global_least_request", "lb_config": lb});
    let cfg = PluginConfig::parse_for(cfg.to_string().as_bytes(), Build::Envoy).unwrap();
    let mut host = MockHost::new().with_route("chat", "outbound|80||llm");
    let b = Balancer::configure(&mut host, cfg, 7, LogLevel::Debug);
    (host, b)
}

fn bytes_cfg() -> (MockHost, Balancer) {
    envoy(json!({"endpoints": ["10.0.0.1:80", "10.0.0.2:80"], "costMode": "bytes"}))
}

fn dest(host: &MockHost) -> Option<String> {
    host.request_headers
        .iter()
        .find(|(k, _)| k == DEST)
        .map(|(_, v)| v.clone())
}

fn counts(host: &MockHost) -> String {
    let key = host
        .shared
        .borrow()
        .keys()
        .find(|k| k.starts_with("ailb.glr."))
        .cloned()
        .unwrap();
    String::from_utf8(host.shared.borrow()[&key].0.clone()).unwrap()
}

/// Request headers of a new stream `ctx` with a body to come.
fn headers(host: &mut MockHost, b: &mut Balancer, ctx: u32) -> Verdict {
    host.live_contexts.push(ctx);
    host.request_headers.clear();
    b.on_request_headers(host, ctx, false)
}

fn warned(host: &MockHost, text: &str) -> bool {
    host.logs
        .borrow()
        .iter()
        .any(|(l, m)| *l == LogLevel::Warn && m.contains(text))
}

#[test]
fn cost_by_bytes_holds_for_the_whole_body_and_counts_it() {
    let (mut host, mut b) = bytes_cfg();
    assert_eq!(host.tick_ms, Some(100), "the body deadline's tick");
    assert_eq!(headers(&mut host, &mut b, 2), Verdict::Pause);
    assert_eq!(b.on_request_body(&mut host, 2, 100, false), Verdict::Pause);
    assert_eq!(dest(&host), None, "nothing published before the end");
    assert_eq!(
        b.on_request_body(&mut host, 2, 3000, true),
        Verdict::Continue
    );
    let first = dest(&host).unwrap();
    let first = first.split(',').next().unwrap().to_string();
    assert!(
        counts(&host).contains(&format!("{first} 3000")),
        "{}",
        counts(&host)
    );
    // The next small request goes to the other pod: 3000 bytes outweigh it.
    assert_eq!(headers(&mut host, &mut b, 3), Verdict::Pause);
    assert_eq!(b.on_request_body(&mut host, 3, 40, true), Verdict::Continue);
    let second = dest(&host).unwrap();
    assert!(!second.starts_with(&first), "{second} after {first}");
    b.on_done(&mut host, 2);
    b.on_done(&mut host, 3);
    assert_eq!(counts(&host), "10.0.0.1:80 0\n10.0.0.2:80 0\n");
    assert_eq!(host.metric("ai_lb.glr.routed"), 2);
    assert_eq!(host.resumed, 0, "answered in the body callbacks");
}

#[test]
fn cost_by_requests_decides_at_the_headers_without_a_hold_or_a_tick() {
    let (mut host, mut b) = envoy(json!({"endpoints": ["10.0.0.1:80", "10.0.0.2:80"]}));
    assert_eq!(host.tick_ms, None);
    assert_eq!(headers(&mut host, &mut b, 2), Verdict::Continue);
    assert!(dest(&host).is_some());
    assert_eq!(
        b.on_request_body(&mut host, 2, 3000, true),
        Verdict::Continue
    );
    assert_eq!(host.header_writes, 1);
}

#[test]
fn the_body_deadline_balances_a_held_request_without_its_body_and_resumes_it() {
    let (mut host, mut b) = bytes_cfg();
    let t0 = host.now_ms;
    assert_eq!(headers(&mut host, &mut b, 2), Verdict::Pause);
    host.now_ms = t0 + 999;
    b.on_tick(&mut host);
    assert_eq!((host.resumed, dest(&host)), (0, None), "not yet due");
    host.now_ms = t0 + 1000;
    b.on_tick(&mut host);
    assert_eq!(host.effective_context, Some(2));
    assert_eq!(host.resumed, 1);
    assert!(dest(&host).is_some(), "balanced without the body");
    assert_eq!(host.metric("ai_lb.fallback.body_timeout"), 1);
    assert_eq!(host.metric("ai_lb.glr.routed"), 1);
    assert!(warned(&host, "allow_on_headers_stop_iteration"));
    // Released once: later ticks leave it alone.
    host.now_ms += 5000;
    b.on_tick(&mut host);
    assert_eq!(host.resumed, 1);
    // Its body, arriving late from a slow client, changes nothing and writes no header
    // (Envoy refuses a header write after routing: status 2).
    host.set_header_status = Some(HostErrorKind::BadArgument);
    let writes = host.header_writes;
    assert_eq!(b.on_request_body(&mut host, 2, 30, true), Verdict::Continue);
    assert_eq!(host.header_writes, writes);
    assert_eq!(
        host.metric("ai_lb.body.withheld_detected"),
        0,
        "late, not withheld"
    );
    b.on_done(&mut host, 2);
    assert_eq!(b.tracked(), (0, 0));
    // A gone context is not resumed (its on_done comes).
    host.set_header_status = None;
    assert_eq!(headers(&mut host, &mut b, 3), Verdict::Pause);
    host.live_contexts.retain(|&c| c != 3);
    host.now_ms += 1000;
    b.on_tick(&mut host);
    assert_eq!(host.resumed, 1);
}

#[test]
fn a_body_delivered_right_at_the_release_means_envoy_withholds_it() {
    let (mut host, mut b) = bytes_cfg();
    assert_eq!(headers(&mut host, &mut b, 2), Verdict::Pause);
    assert_eq!(headers(&mut host, &mut b, 3), Verdict::Pause);
    host.now_ms += 1000;
    b.on_tick(&mut host);
    assert_eq!(host.resumed, 2);
    // Envoy delivers the buffered body as soon as the filter resumes the stream.
    assert_eq!(
        b.on_request_body(&mut host, 2, 500, true),
        Verdict::Continue
    );
    assert_eq!(host.metric("ai_lb.body.withheld_detected"), 1);
    assert!(warned(
        &host,
        "lacks `allow_on_headers_stop_iteration: true`"
    ));
    assert_eq!(
        b.on_request_body(&mut host, 3, 500, true),
        Verdict::Continue
    );
    assert_eq!(
        host.metric("ai_lb.body.withheld_detected"),
        1,
        "once per VM"
    );
    // From now on: decided at the headers, no hold, counted.
    let writes = host.header_writes;
    assert_eq!(headers(&mut host, &mut b, 4), Verdict::Continue);
    assert!(dest(&host).is_some());
    assert_eq!(host.header_writes, writes + 1);
    assert_eq!(host.metric("ai_lb.fallback.body_withheld"), 1);
    assert_eq!(
        b.on_request_body(&mut host, 4, 500, true),
        Verdict::Continue
    );
    assert_eq!(host.header_writes, writes + 1, "no write after the release");
    // A request without a body is decided at the headers as always, not counted.
    host.live_contexts.push(5);
    assert_eq!(b.on_request_headers(&mut host, 5, true), Verdict::Continue);
    assert_eq!(host.metric("ai_lb.fallback.body_withheld"), 1);
    assert_eq!(host.resumed, 2);
}

#[test]
fn requests_held_when_the_body_is_found_withheld_are_released_at_the_next_tick() {
    let (mut host, mut b) = bytes_cfg();
    assert_eq!(headers(&mut host, &mut b, 2), Verdict::Pause);
    host.now_ms += 600;
    assert_eq!(headers(&mut host, &mut b, 3), Verdict::Pause);
    host.now_ms += 400;
    b.on_tick(&mut host);
    assert_eq!(host.resumed, 1, "only the first is due");
    b.on_request_body(&mut host, 2, 10, true);
    assert_eq!(host.metric("ai_lb.body.withheld_detected"), 1);
    host.now_ms += 100;
    b.on_tick(&mut host);
    assert_eq!(
        host.resumed, 2,
        "the second no longer waits for its deadline"
    );
    assert_eq!(host.effective_context, Some(3));
}

#[test]
fn a_body_seen_while_held_proves_delivery_and_later_timeouts_are_slow_clients() {
    let (mut host, mut b) = bytes_cfg();
    assert_eq!(headers(&mut host, &mut b, 2), Verdict::Pause);
    assert_eq!(b.on_request_body(&mut host, 2, 10, true), Verdict::Continue);
    assert_eq!(headers(&mut host, &mut b, 3), Verdict::Pause);
    host.now_ms += 1000;
    b.on_tick(&mut host);
    assert_eq!(b.on_request_body(&mut host, 3, 10, true), Verdict::Continue);
    assert_eq!(host.metric("ai_lb.body.withheld_detected"), 0);
    assert_eq!(host.metric("ai_lb.fallback.body_timeout"), 1);
    assert_eq!(headers(&mut host, &mut b, 4), Verdict::Pause, "still holds");
}

#[test]
fn a_late_first_chunk_after_the_release_is_a_slow_client_not_a_withheld_body() {
    let (mut host, mut b) = bytes_cfg();
    assert_eq!(headers(&mut host, &mut b, 2), Verdict::Pause);
    host.now_ms += 1000;
    b.on_tick(&mut host);
    host.now_ms += WITHHELD_GAP_MS + 1;
    assert_eq!(
        b.on_request_body(&mut host, 2, 10, false),
        Verdict::Continue
    );
    assert_eq!(host.metric("ai_lb.body.withheld_detected"), 0);
    assert_eq!(headers(&mut host, &mut b, 3), Verdict::Pause);
}

#[test]
fn an_oversized_body_is_balanced_at_once_without_waiting_for_its_end() {
    let (mut host, mut b) = envoy(json!({"endpoints": ["10.0.0.1:80", "10.0.0.2:80"],
        "costMode": "tokens", "maxBodyBytes": 1000}));
    assert_eq!(headers(&mut host, &mut b, 2), Verdict::Pause);
    assert_eq!(
        b.on_request_body(&mut host, 2, 1001, false),
        Verdict::Continue
    );
    assert!(dest(&host).is_some());
    assert_eq!(host.metric("ai_lb.fallback.body_too_large"), 1);
    assert_eq!(
        b.on_request_body(&mut host, 2, 5000, true),
        Verdict::Continue
    );
    assert_eq!(host.header_writes, 1);
    host.now_ms += 2000;
    b.on_tick(&mut host);
    assert_eq!(host.resumed, 0);
    assert_eq!(host.metric("ai_lb.fallback.body_timeout"), 0);
}

#[test]
fn the_tick_scrapes_on_the_root_before_it_resumes_held_requests() {
    let cfg = json!({"lb_policy": "endpoint_metrics", "lb_config": {
        "endpoints": ["10.0.0.1:80", "10.0.0.2:80"], "scrapeCluster": "scrape"}});
    let cfg = PluginConfig::parse_for(cfg.to_string().as_bytes(), Build::Envoy).unwrap();
    let mut host = MockHost::new().with_route("chat", "outbound|80||llm");
    let mut b = Balancer::configure(&mut host, cfg, 7, LogLevel::Debug);
    assert_eq!(headers(&mut host, &mut b, 2), Verdict::Pause);
    host.now_ms += 1000;
    b.on_tick(&mut host);
    assert_eq!(host.resumed, 1);
    assert_eq!(host.effective_context, Some(2));
    assert_eq!(
        host.http_call_contexts,
        vec![None, None],
        "scraped as the root"
    );
}

/// Plain Envoy: a session is consistent-hashed onto the endpoints' ring, so two proxies that
/// share nothing send it to the same pod; a pod over the guard is walked past (rebound).
#[test]
fn envoy_sessions_hash_to_one_pod_across_proxies_and_move_past_a_busy_one() {
    let lb = json!({"endpoints": ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"],
        "sessionHeader": "x-session-id", "maxRequestCount": 2});
    let route = |host: &mut MockHost, b: &mut Balancer, ctx: u32, sid: &str| {
        host.live_contexts.push(ctx);
        host.request_headers = vec![("x-session-id".into(), sid.into())];
        b.on_request_headers(host, ctx, false);
        dest(host).unwrap()
    };
    let (mut h1, mut b1) = envoy(lb.clone());
    let (mut h2, mut b2) = envoy(lb);
    let mut homes = std::collections::HashSet::new();
    for s in 0..12 {
        let sid = format!("conv-{s}");
        let one = route(&mut h1, &mut b1, 10 + s, &sid);
        b1.on_done(&mut h1, 10 + s);
        let two = route(&mut h2, &mut b2, 10 + s, &sid);
        b2.on_done(&mut h2, 10 + s);
        assert_eq!(one, two, "replicas agree on {sid}");
        homes.insert(one);
    }
    assert!(homes.len() >= 2, "sessions spread: {homes:?}");
    assert_eq!(h1.metric("ai_lb.session.hit"), 12);
    // Two turns of one session held on its pod fill it to maxRequestCount: the third moves.
    let home = route(&mut h1, &mut b1, 40, "hot");
    assert_eq!(route(&mut h1, &mut b1, 41, "hot"), home);
    let moved = route(&mut h1, &mut b1, 42, "hot");
    assert_ne!(moved, home);
    assert_eq!(h1.metric("ai_lb.session.rebound"), 1);
    for ctx in 40..=42 {
        b1.on_done(&mut h1, ctx);
    }
    assert!(
        counts(&h1).lines().all(|l| l.ends_with(" 0")),
        "{}",
        counts(&h1)
    );
    // Freed: back home. Without a session header: plain least request.
    assert_eq!(route(&mut h1, &mut b1, 43, "hot"), home);
    b1.on_done(&mut h1, 43);
    route(&mut h1, &mut b1, 44, "");
    assert_eq!(
        h1.metric("ai_lb.session.hit"),
        15,
        "the header-less request is no session"
    );
}
