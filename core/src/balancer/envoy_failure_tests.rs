//! Failure memory in the plain-Envoy build, through the balancer (mock host; docs/plain-envoy.md
//! "Failure memory"): a pod Envoy retried away from is ejected at once, a pod answering 5xx
//! after `ejectAfterFailures`; picks pass over it (least request lists it last, sessions and
//! prefix matches leave it) until its ejection ends and a trial answers; with every pod out
//! the pick fails open; failed requests' held counts all come back.

use super::*;
use crate::config::Build;
use crate::host::mock::MockHost;
use serde_json::{json, Value};

const EPS: [&str; 3] = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"];

/// A plain-Envoy route of `policy` over [`EPS`] with `extra` in its `lb_config`.
fn proxy(policy: &str, extra: Value) -> (MockHost, Balancer) {
    let mut lb = json!({"endpoints": EPS, "debugHeader": "x-dbg"});
    if let (Value::Object(a), Value::Object(b)) = (&mut lb, extra) {
        a.extend(b);
    }
    let doc = json!({"lb_policy": policy, "lb_config": lb});
    let config = PluginConfig::parse_for(doc.to_string().as_bytes(), Build::Envoy).unwrap();
    let mut host = MockHost::new();
    host.now_ms = 1_000;
    let e = Balancer::configure(&mut host, config, 42, LogLevel::Trace);
    (host, e)
}

/// How the pods answer a request sent to the endpoint named: its `:status`, and the pod that
/// answered when not that one (Envoy's retry to a fallback).
type Pods<'a> = &'a dyn Fn(&str) -> (&'static str, Option<&'static str>);

/// Every pod answers 200 itself.
fn healthy(_: &str) -> (&'static str, Option<&'static str>) {
    ("200", None)
}

/// One whole request (session header `session`, `body`), answered as `pods` says; its
/// destination list (chosen first) and debug reason.
fn request(
    (host, e): (&mut MockHost, &mut Balancer),
    ctx: u32,
    (session, body): (Option<&str>, &[u8]),
    pods: Pods<'_>,
) -> (Vec<String>, String) {
    host.request_headers = session
        .map(|s| vec![("x-session-id".to_string(), s.to_string())])
        .unwrap_or_default();
    host.body = body.to_vec();
    host.live_contexts.push(ctx);
    e.on_request_headers(host, ctx, false);
    let len = host.body.len();
    assert_eq!(e.on_request_body(host, ctx, len, true), Verdict::Continue);
    let dest: Vec<String> = host
        .request_headers
        .iter()
        .find(|(k, _)| k == "x-gateway-destination-endpoint")
        .map(|(_, v)| v.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    let (status, served) = pods(dest.first().map_or("", String::as_str));
    host.response_headers = vec![(":status".into(), status.into())];
    match served {
        Some(s) => host.properties.insert("upstream.address".into(), s.into()),
        None => host.properties.remove("upstream.address"),
    };
    e.on_response_headers(host, ctx);
    host.live_contexts.retain(|&c| c != ctx);
    e.on_done(host, ctx);
    let debug = host
        .response_headers
        .iter()
        .find(|(k, _)| k == "x-dbg")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let reason = debug.rsplit("reason=").next().unwrap_or("").to_string();
    (dest, reason)
}

const PROMPT: &[u8] = br#"{"model":"m","prompt":"hi"}"#;

/// The chosen endpoint of a request without a session, answered as `pods` says.
fn pick(host: &mut MockHost, e: &mut Balancer, ctx: u32, pods: Pods<'_>) -> String {
    let (dest, _) = request((host, e), ctx, (None, PROMPT), pods);
    dest.first().cloned().unwrap_or_default()
}

/// Lines of a counts record.
type Lines = Vec<(String, u64)>;

/// The proxy's counts record: (endpoint counts, the other lines).
fn record(host: &MockHost) -> (Lines, Lines) {
    let shared = host.shared.borrow();
    shared
        .iter()
        .filter(|(k, _)| k.starts_with("ailb.glr."))
        .flat_map(|(_, (v, _))| shared::decode_counts(v))
        .partition(|(k, _)| !k.starts_with('~'))
}

fn all_zero(host: &MockHost) -> bool {
    record(host).0.iter().all(|(_, n)| *n == 0)
}

#[test]
fn a_session_pod_envoy_retried_away_from_is_ejected_then_taken_back_after_a_trial() {
    let (mut host, mut e) = proxy(
        "global_least_request",
        json!({"sessionHeader": "x-session-id", "ejectionMs": 10000}),
    );
    let turn = |host: &mut MockHost, e: &mut Balancer, ctx, pods: Pods<'_>| {
        let (dest, reason) = request((host, e), ctx, (Some("s1"), PROMPT), pods);
        (dest.first().cloned().unwrap_or_default(), reason)
    };
    let (home, reason) = turn(&mut host, &mut e, 2, &healthy);
    assert_eq!(reason, "session");
    assert_eq!(turn(&mut host, &mut e, 3, &healthy).0, home);
    assert_eq!(host.metric("ai_lb.session.pod_down"), 0);
    // Envoy's retry answered from another pod: the session's pod refused or reset.
    let other = EPS.iter().copied().find(|&p| p != home);
    turn(&mut host, &mut e, 4, &|_| ("200", other));
    assert_eq!(host.metric("ai_lb.session.pod_down"), 1);
    assert_eq!(host.metric("ai_lb.eject.ejected"), 1);
    assert_eq!(host.metric("ai_lb.eject.failures"), 1);
    // Ejected for ejectionMs: the session's next turns go on along its ring walk.
    let (moved, reason) = turn(&mut host, &mut e, 5, &healthy);
    assert_ne!(moved, home);
    assert_eq!(reason, "session_rebound");
    host.now_ms += 10_000 - 1;
    assert_eq!(turn(&mut host, &mut e, 6, &healthy).0, moved);
    // Then its trial: the session's pod again, answered, so back for good.
    host.now_ms += 1;
    for ctx in 7..10 {
        let got = turn(&mut host, &mut e, ctx, &healthy);
        assert_eq!(got, (home.clone(), "session".to_string()));
    }
    assert_eq!(host.metric("ai_lb.session.rebound"), 2);
    let (counts, lines) = record(&host);
    assert!(counts.iter().all(|(_, n)| *n == 0), "{counts:?}");
    assert!(lines.is_empty(), "healed and given back: {lines:?}");
}

#[test]
fn least_request_lists_a_pod_envoy_retried_away_from_last_while_it_is_ejected() {
    let (mut host, mut e) = proxy(
        "global_least_request",
        json!({"ejectionMs": 10000, "maxEjectedPercent": 100}),
    );
    // Answered by the pod it chose: nothing learned. By another (Envoy's retry): the chosen
    // pod is ejected.
    let mut ctx = 2;
    let dead = loop {
        let to = pick(&mut host, &mut e, ctx, &|_| ("200", Some(EPS[0])));
        ctx += 1;
        if to != EPS[0] {
            break to;
        }
        assert_eq!(host.metric("ai_lb.glr.pod_down"), 0);
    };
    assert_eq!(host.metric("ai_lb.glr.pod_down"), 1);
    assert_eq!(host.metric("ai_lb.eject.ejected"), 1);
    // While ejected: never chosen, always the last fallback.
    for ctx in 50..80 {
        let (dest, reason) = request((&mut host, &mut e), ctx, (None, PROMPT), &healthy);
        assert_eq!(reason, "least_request");
        assert_ne!(dest[0], dead);
        assert_eq!(dest.last(), Some(&dead), "{dest:?}");
        if ctx == 60 {
            host.now_ms += 10_000 - 1;
        }
    }
    // Then a trial, answered: back in the rotation.
    host.now_ms += 1;
    let back = (90..96)
        .filter(|&ctx| pick(&mut host, &mut e, ctx, &healthy) == dead)
        .count();
    assert!(back >= 2, "taken back: {back}");
    // Every pod not reached: each ejected in turn, then the picks fail open, counted.
    let unreached = |_: &str| ("503", Some("10.9.9.9:1"));
    for (n, ep) in (1..).zip(EPS) {
        let mut ctx = 1000 * n;
        while pick(&mut host, &mut e, ctx, &unreached) != ep {
            ctx += 1;
        }
    }
    assert_eq!(host.metric("ai_lb.eject.ejected"), 4);
    let open = host.metric("ai_lb.eject.fail_open");
    assert!(open >= 1);
    let (dest, reason) = request((&mut host, &mut e), 9000, (None, PROMPT), &healthy);
    assert_eq!((dest.len(), reason.as_str()), (3, "least_request"));
    assert_eq!(host.metric("ai_lb.eject.fail_open"), open + 1);
    assert!(host.local_responses.is_empty());
    // The failed requests' counts were held (failurePenaltyMs); one update after it, all back.
    assert!(!all_zero(&host));
    host.now_ms += 1_000;
    pick(&mut host, &mut e, 9001, &healthy);
    assert!(all_zero(&host), "{:?}", record(&host));
}

#[test]
fn a_pod_answering_5xx_is_ejected_at_its_nth_failure_retried_on_trial_and_taken_back() {
    let (mut host, mut e) = proxy("global_least_request", json!({"ejectAfterFailures": 3}));
    let bad = EPS[1];
    // `bad` answers 500; the others 404 (the client's fault: an answer all the same).
    let failing = |to: &str| (if to == bad { "500" } else { "404" }, None);
    let mut ctx = 2;
    let mut sent_to_bad = 0;
    while host.metric("ai_lb.eject.ejected") == 0 {
        let to = pick(&mut host, &mut e, ctx, &failing);
        ctx += 1;
        if to == bad {
            sent_to_bad += 1;
            // Its failed count is held: the next pick, at once, goes elsewhere.
            assert_ne!(pick(&mut host, &mut e, ctx, &failing), bad);
            ctx += 1;
        }
        host.now_ms += 400;
        assert!(ctx < 100, "never ejected");
    }
    assert_eq!(sent_to_bad, 3);
    assert_eq!(host.metric("ai_lb.eject.failures"), 3);
    // Ejected for ejectionMs (30 s): never chosen.
    for _ in 0..50 {
        assert_ne!(pick(&mut host, &mut e, ctx, &failing), bad);
        ctx += 1;
        host.now_ms += 500;
    }
    // Its trial fails: ejected again at once, for twice as long.
    host.now_ms += 5_000;
    let tried = (0..3)
        .filter(|_| {
            ctx += 1;
            pick(&mut host, &mut e, ctx, &failing) == bad
        })
        .count();
    assert_eq!(tried, 1, "one trial request");
    assert_eq!(host.metric("ai_lb.eject.ejected"), 2);
    host.now_ms += 59_000;
    assert!((0..20).all(|_| {
        ctx += 1;
        pick(&mut host, &mut e, ctx, &healthy) != bad
    }));
    // Healed: its next trial answers, and it takes its share again.
    host.now_ms += 1_000;
    let back = (0..30)
        .filter(|_| {
            ctx += 1;
            pick(&mut host, &mut e, ctx, &healthy) == bad
        })
        .count();
    assert!(back >= 5, "{back} of 30");
    assert_eq!(host.metric("ai_lb.eject.refused"), 0);
    assert!(all_zero(&host), "{:?}", record(&host));
}

#[test]
fn at_most_max_ejected_percent_of_the_pods_are_ejected_the_rest_refused_and_counted() {
    let (mut host, mut e) = proxy("global_least_request", json!({}));
    // 50% of three pods: one. Two pods stop answering (Envoy retries to the third).
    let dead = [EPS[0], EPS[1]];
    let pods = |to: &str| ("200", dead.contains(&to).then_some(EPS[2]));
    // Within the first ejection (30 s), each failed count's penalty (1 s) over at each pick.
    for ctx in 2..22 {
        pick(&mut host, &mut e, ctx, &pods);
        host.now_ms += 1_100;
    }
    assert_eq!(host.metric("ai_lb.eject.ejected"), 1);
    assert!(host.metric("ai_lb.eject.refused") >= 1);
    assert_eq!(host.metric("ai_lb.eject.fail_open"), 0);
}

#[test]
fn prefix_cache_leaves_an_ejected_pod_for_its_matches_and_its_sessions() {
    let (mut host, mut e) = proxy("prefix_cache", json!({"sessionHeader": "x-session-id"}));
    let chat = |turns: usize| {
        let mut messages = vec![json!({"role": "system", "content": "Be brief."})];
        for t in 0..turns {
            messages.push(json!({"role": "user", "content": format!("question {t}")}));
            messages.push(json!({"role": "assistant", "content": format!("answer {t}")}));
        }
        messages.push(json!({"role": "user", "content": format!("question {turns}")}));
        json!({"model": "m", "messages": messages}).to_string()
    };
    let send = |host: &mut MockHost,
                e: &mut Balancer,
                ctx: u32,
                session: Option<&str>,
                turns: usize,
                pods: Pods<'_>| {
        let body = chat(turns);
        let (dest, reason) = request((host, e), ctx, (session, body.as_bytes()), pods);
        (dest.first().cloned().unwrap_or_default(), reason)
    };
    let (home, _) = send(&mut host, &mut e, 2, None, 0, &healthy);
    assert_eq!(
        send(&mut host, &mut e, 3, None, 1, &healthy),
        (home.clone(), "prefix_hit".to_string())
    );
    // Its pod stops answering: the next turn, answered by Envoy's retry elsewhere, ejects it.
    let other = EPS.iter().copied().find(|&p| p != home);
    send(&mut host, &mut e, 4, None, 2, &|_| ("200", other));
    assert_eq!(host.metric("ai_lb.glr.pod_down"), 1);
    assert_eq!(host.metric("ai_lb.eject.ejected"), 1);
    let (to, reason) = send(&mut host, &mut e, 5, None, 3, &healthy);
    assert_ne!(to, home);
    assert_eq!(reason, "prefix_spill");
    // A session whose pod is ejected leaves it too.
    let mut left = 0;
    for s in 0..12 {
        let sid = format!("s{s}");
        let (to, reason) = send(&mut host, &mut e, 100 + s, Some(&sid), 0, &healthy);
        assert_ne!(to, home, "{sid}");
        left += usize::from(reason == "session_rebound");
    }
    assert!(left >= 1, "some session's pod was the ejected one");
    host.now_ms += 1_000;
    send(&mut host, &mut e, 200, None, 0, &healthy);
    assert!(all_zero(&host), "{:?}", record(&host));
}

#[test]
fn with_failure_memory_off_nothing_is_watched_learned_or_held() {
    let (mut host, mut e) = proxy("global_least_request", json!({"ejectAfterFailures": 0}));
    for ctx in 2..20 {
        pick(&mut host, &mut e, ctx, &|_| ("503", Some("10.9.9.9:1")));
    }
    assert_eq!(host.metric("ai_lb.glr.pod_down"), 0);
    assert_eq!(host.metric("ai_lb.eject.failures"), 0);
    assert_eq!(host.metric("ai_lb.eject.ejected"), 0);
    let (counts, lines) = record(&host);
    assert!(counts.iter().all(|(_, n)| *n == 0), "{counts:?}");
    assert!(lines.is_empty(), "{lines:?}");
}

/// Envoy's retry answered from another pod: the count moves there for the rest of the stream
/// (one update at the response headers), the chosen pod's failure is learned and its count held
/// `failurePenaltyMs`; the stream end gives the moved count back with the answer's lesson.
#[test]
fn a_request_served_elsewhere_moves_its_count_to_the_pod_that_answered() {
    let (mut host, mut e) = proxy("global_least_request", json!({}));
    host.live_contexts.push(2);
    host.body = PROMPT.to_vec();
    e.on_request_headers(&mut host, 2, false);
    assert_eq!(
        e.on_request_body(&mut host, 2, PROMPT.len(), true),
        Verdict::Continue
    );
    let chosen = host
        .request_headers
        .iter()
        .find(|(k, _)| k == "x-gateway-destination-endpoint")
        .and_then(|(_, v)| v.split(',').next().map(str::to_string))
        .unwrap();
    let served = EPS.iter().copied().find(|&p| p != chosen).unwrap();
    host.response_headers = vec![(":status".into(), "200".into())];
    host.properties
        .insert("upstream.address".into(), served.as_bytes().to_vec());
    e.on_response_headers(&mut host, 2);
    let load = |host: &MockHost, ep: &str| {
        record(host)
            .0
            .iter()
            .find(|(k, _)| k == ep)
            .map_or(0, |(_, n)| *n)
    };
    assert_eq!(load(&host, served), 1, "the count moved");
    assert_eq!(load(&host, &chosen), 1, "held failurePenaltyMs");
    assert_eq!(
        host.metric("ai_lb.eject.ejected"),
        1,
        "not reached: ejected"
    );
    host.live_contexts.clear();
    e.on_done(&mut host, 2);
    assert_eq!(load(&host, served), 0, "given back where it was moved");
    assert_eq!(host.metric("ai_lb.eject.failures"), 1, "one failure, once");
    host.now_ms += 1_000;
    pick(&mut host, &mut e, 3, &healthy);
    assert!(all_zero(&host), "{:?}", record(&host));
}
