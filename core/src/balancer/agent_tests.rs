//! Agent sessions and Responses continuations through the balancer (mock host), Higress build
//! with Redis (docs/sessions-and-queues.md "Agent sessions"): which identity names a request's
//! session without configuration, what the acquire call carries, how each reply reads, how a
//! Responses answer's id is recorded as soon as the answer names itself, and bad input.

use super::tests::{configured, deliver};
use super::*;
use crate::host::mock::MockHost;
use crate::host::HostErrorKind;
use crate::redis::bind::response_key;
use crate::redis::resp::encode_command;
use crate::redis::scripts::session_key;
use serde_json::json;

const CLUSTER: &str = "outbound|8000||llm.static";
const NS: &str = "ailb:{chat|outbound|8000||llm.static}";

fn route(policy: &str, extra: serde_json::Value) -> (MockHost, Balancer) {
    let mut lb =
        json!({"serviceFQDN": "redis.static", "servicePort": 6379, "debugHeader": "x-dbg"});
    if let (Some(a), serde_json::Value::Object(b)) = (lb.as_object_mut(), extra) {
        a.extend(b);
    }
    let cfg = json!({"lb_policy": policy, "lb_config": lb}).to_string();
    let host = MockHost::new()
        .with_route("chat", CLUSTER)
        .with_hosts(&[("10.0.0.1:80", "Healthy"), ("10.0.0.2:80", "Healthy")]);
    configured(host, PluginConfig::parse(cfg.as_bytes()).unwrap())
}

fn glr(extra: serde_json::Value) -> (MockHost, Balancer) {
    route("global_least_request", extra)
}

/// Sends a request with `headers` and `body` as `ctx`; the acquire's args and its token.
fn send(
    host: &mut MockHost,
    e: &mut Balancer,
    ctx: u32,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (Vec<String>, u32) {
    host.live_contexts.push(ctx);
    host.body = body.to_vec();
    host.request_headers = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(e.on_request_headers(host, ctx, false), Verdict::Pause);
    let before = host.redis_calls.len();
    assert_eq!(
        e.on_request_body(host, ctx, body.len(), true),
        Verdict::Pause
    );
    assert_eq!(
        host.redis_calls.len(),
        before + 1,
        "one round trip per pick"
    );
    (host.last_query_args(), host.next_token - 4)
}

/// The session (or response) key the acquire carried: the key before health, ejected, wait,
/// tenants, seen.
fn session_of(args: &[String]) -> Option<String> {
    let numkeys: usize = args[2].parse().unwrap();
    (numkeys == 9).then(|| args[3 + 3].clone())
}

/// Redis answers a least-request pick on `endpoint` with session `state`.
fn picked(host: &mut MockHost, e: &mut Balancer, token: u32, endpoint: &str, state: &str) {
    let reply = encode_command(&["OK", endpoint, "0", "0", state, "0"]);
    deliver(host, e, token, &reply);
}

fn debug(host: &MockHost) -> String {
    host.response_headers
        .iter()
        .find(|(k, _)| k == "x-dbg")
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

/// The response (`status`, body `chunks`) to `ctx`, then its stream end; the debug header.
fn respond(
    host: &mut MockHost,
    e: &mut Balancer,
    ctx: u32,
    status: &str,
    chunks: &[&str],
) -> String {
    host.response_headers = vec![(":status".into(), status.into())];
    let mut wants = e.on_response_headers(host, ctx);
    let dbg = debug(host);
    for (i, c) in chunks.iter().enumerate() {
        host.response_body = c.as_bytes().to_vec();
        if wants {
            wants = e.on_response_body(host, ctx, c.len(), i + 1 == chunks.len());
        }
    }
    host.live_contexts.retain(|&c| c != ctx);
    e.on_done(host, ctx);
    dbg
}

const RESPONSES: (&str, &str) = (":path", "/v1/responses");

/// Every `SET` sent so far (a response's pod recorded), as its words.
fn sets(host: &MockHost) -> Vec<Vec<String>> {
    (0..host.redis_calls.len())
        .map(|i| host.query_args(i))
        .filter(|a| a[0] == "SET")
        .collect()
}

fn responses_body(previous: Option<serde_json::Value>) -> Vec<u8> {
    let mut b = json!({"model": "m", "input": "hi"});
    if let Some(p) = previous {
        b["previous_response_id"] = p;
    }
    b.to_string().into_bytes()
}

#[test]
fn an_agent_header_names_the_session_without_configuration() {
    let (mut host, mut e) = glr(json!({}));
    let (args, t) = send(
        &mut host,
        &mut e,
        2,
        &[("x-session-affinity", "ses_1")],
        b"{}",
    );
    assert_eq!(session_of(&args), Some(session_key(NS, b"ses_1")));
    // ARGV[9..11]: agentSessionTTL (default 1800 s) and the guard's bounds.
    assert_eq!(&args[12 + 8..12 + 11], ["1800", "8", "1.5"]);
    picked(&mut host, &mut e, t, "10.0.0.2:80", "1");
    let dbg = respond(&mut host, &mut e, 2, "200", &[]);
    assert_eq!(dbg, "endpoint=10.0.0.2:80; reason=agent_session");
    assert_eq!(host.metric("ai_lb.session.hit"), 1);
    assert_eq!(host.metric("ai_lb.session.agent"), 1);
    // Each header of the list, alone, names it; and the TTL follows agentSessionTTL.
    let (mut host, mut e) = glr(json!({"agentSessionTTL": 90}));
    for (ctx, name) in (3..).zip(crate::agents::HEADERS) {
        let (args, _) = send(&mut host, &mut e, ctx, &[(name, "id-7")], b"{}");
        assert_eq!(session_of(&args), Some(session_key(NS, b"id-7")), "{name}");
        assert_eq!(args[12 + 8], "90");
    }
}

#[test]
fn configured_sources_come_first_then_the_agent_headers_in_their_order() {
    let (mut host, mut e) = glr(json!({"sessionHeader": "x-conv", "sessionTTL": 60}));
    let both = [("x-conv", "mine"), ("x-session-affinity", "agent")];
    let (args, t) = send(&mut host, &mut e, 2, &both, b"{}");
    assert_eq!(session_of(&args), Some(session_key(NS, b"mine")));
    assert_eq!(args[12 + 8], "60", "a configured session keeps sessionTTL");
    picked(&mut host, &mut e, t, "10.0.0.1:80", "1");
    assert!(respond(&mut host, &mut e, 2, "200", &[]).ends_with("reason=session"));
    assert_eq!(host.metric("ai_lb.session.agent"), 0);
    // Without the configured header, the agent's own; agentSessionTTL defaults to sessionTTL.
    let (args, _) = send(&mut host, &mut e, 3, &both[1..], b"{}");
    assert_eq!(session_of(&args), Some(session_key(NS, b"agent")));
    assert_eq!(args[12 + 8], "60");
    // Among agent headers the list's order decides; an empty one is none.
    let headers = [
        ("x-session-id", "late"),
        ("session_id", "early"),
        ("x-session-affinity", ""),
    ];
    let (args, _) = send(&mut host, &mut e, 4, &headers, b"{}");
    assert_eq!(session_of(&args), Some(session_key(NS, b"early")));
}

#[test]
fn a_route_can_turn_agent_sessions_off() {
    let (mut host, mut e) = glr(json!({"agentSessions": false}));
    let body = responses_body(Some(json!("resp_1")));
    let (args, t) = send(
        &mut host,
        &mut e,
        2,
        &[("x-session-affinity", "s"), RESPONSES],
        &body,
    );
    assert_eq!(session_of(&args), None);
    assert_eq!(args[11 + 8], "0", "no session");
    picked(&mut host, &mut e, t, "10.0.0.1:80", "0");
    respond(&mut host, &mut e, 2, "200", &[r#"{"id":"resp_2"}"#]);
    assert!(sets(&host).is_empty(), "nothing recorded");
    assert_eq!(host.metric("ai_lb.session.agent"), 0);
    assert_eq!(host.metric("ai_lb.session.response_recorded"), 0);
}

#[test]
fn a_responses_answer_is_recorded_and_continued_on_its_pod() {
    let (mut host, mut e) = glr(json!({}));
    let (args, t) = send(&mut host, &mut e, 2, &[RESPONSES], &responses_body(None));
    assert_eq!(session_of(&args), None, "a first turn names no session");
    let rid = args[13].clone();
    picked(&mut host, &mut e, t, "10.0.0.2:80", "0");
    let answer = r#"{"id":"resp_abc","object":"response","output":[{"id":"msg_1"}]}"#;
    respond(&mut host, &mut e, 2, "200", &[&answer[..20], &answer[20..]]);
    // The response's pod is recorded (agentSessionTTL), then the lease released.
    let key = response_key(NS, b"resp_abc");
    assert_eq!(
        sets(&host),
        [["SET", &key, "10.0.0.2:80", "EX", "1800"].map(String::from)]
    );
    let rel = host.last_query_args();
    assert_eq!(rel[2], "5", "load, leases, tenants, health, ejected");
    assert_eq!(
        rel[8], "s",
        "the wrapped lease learns its answer (failure memory)"
    );
    assert_eq!(rel[15..], [format!("{rid}|10.0.0.2:80|1")]);
    assert_eq!(host.metric("ai_lb.session.response_recorded"), 1);
    // The continuation: its previous response's key rides in the acquire's session slot.
    let body = responses_body(Some(json!("resp_abc")));
    let (args, t) = send(&mut host, &mut e, 3, &[RESPONSES], &body);
    assert_eq!(session_of(&args), Some(response_key(NS, b"resp_abc")));
    picked(&mut host, &mut e, t, "10.0.0.2:80", "1");
    let dbg = respond(&mut host, &mut e, 3, "200", &[r#"{"id":"resp_def"}"#]);
    assert_eq!(dbg, "endpoint=10.0.0.2:80; reason=continuation");
    assert_eq!(host.metric("ai_lb.session.hit"), 1);
    assert_eq!(host.metric("ai_lb.session.agent"), 1);
    assert_eq!(sets(&host)[1][1], response_key(NS, b"resp_def"));
    // An unknown one: placed by the policy, counted.
    let body = responses_body(Some(json!("resp_gone")));
    let (_, t) = send(&mut host, &mut e, 4, &[RESPONSES], &body);
    picked(&mut host, &mut e, t, "10.0.0.1:80", "2");
    let dbg = respond(&mut host, &mut e, 4, "200", &[]);
    assert_eq!(dbg, "endpoint=10.0.0.1:80; reason=least_request");
    assert_eq!(host.metric("ai_lb.session.continuation_unknown"), 1);
    assert_eq!(host.metric("ai_lb.session.bound"), 1);
    // Its answer had no id: nothing recorded.
    assert_eq!(sets(&host).len(), 2);
}

#[test]
fn a_stream_is_recorded_from_its_first_event() {
    let (mut host, mut e) = route("prefix_cache", json!({}));
    let body = json!({"model": "m", "input": "x".repeat(300), "stream": true}).to_string();
    let (_, t) = send(&mut host, &mut e, 2, &[RESPONSES], body.as_bytes());
    let reply = encode_command(&["OK", "10.0.0.1:80", "0", "0", "0", "0", "0", "0"]);
    deliver(&mut host, &mut e, t, &reply);
    let created = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_s\",\"output\":[]}}\n\n";
    let delta = "event: response.output_text.delta\ndata: {\"delta\":\"hi\"}\n\n";
    host.response_headers = vec![
        (":status".into(), "200".into()),
        ("content-type".into(), "text/event-stream".into()),
    ];
    assert!(e.on_response_headers(&mut host, 2), "its body is read");
    // Recorded with the first event, before the client has it and long before the end.
    host.response_body = created.as_bytes().to_vec();
    assert!(e.on_response_body(&mut host, 2, created.len(), false));
    assert_eq!(sets(&host).len(), 1);
    assert_eq!(sets(&host)[0][1], response_key(NS, b"resp_s"));
    assert_eq!(host.response_body, created.as_bytes(), "passed as it is");
    for (i, chunk) in [delta, delta].iter().enumerate() {
        host.response_body = chunk.as_bytes().to_vec();
        e.on_response_body(&mut host, 2, chunk.len(), i == 1);
    }
    host.live_contexts.retain(|&c| c != 2);
    e.on_done(&mut host, 2);
    assert_eq!(sets(&host).len(), 1, "once");
    assert_eq!(host.metric("ai_lb.session.response_recorded"), 1);
    // An id cut across two chunks is recorded when its second half arrives.
    let (_, t) = send(&mut host, &mut e, 3, &[RESPONSES], body.as_bytes());
    deliver(&mut host, &mut e, t, &reply);
    respond(
        &mut host,
        &mut e,
        3,
        "200",
        &[&created[..70], &created[70..], delta],
    );
    assert_eq!(sets(&host)[1][1], response_key(NS, b"resp_s"));
}

#[test]
fn errors_unstored_and_other_apis_record_nothing() {
    let (mut host, mut e) = glr(json!({}));
    type Case<'a> = (&'a [(&'a str, &'a str)], Vec<u8>, &'a str);
    let cases: [Case; 4] = [
        (&[RESPONSES], responses_body(None), "500"),
        (
            &[RESPONSES],
            br#"{"input":"hi","store":false}"#.to_vec(),
            "200",
        ),
        (&[(":path", "/v1/chat/completions")], b"{}".to_vec(), "200"),
        (
            &[(":path", "/v1/responses/resp_1/cancel")],
            b"{}".to_vec(),
            "200",
        ),
    ];
    for (ctx, (headers, body, status)) in (2..).zip(cases) {
        let (_, t) = send(&mut host, &mut e, ctx, headers, &body);
        picked(&mut host, &mut e, t, "10.0.0.1:80", "0");
        respond(&mut host, &mut e, ctx, status, &[r#"{"id":"resp_x"}"#]);
        assert!(sets(&host).is_empty(), "case {ctx}");
    }
    assert_eq!(host.metric("ai_lb.session.response_recorded"), 0);
}

#[test]
fn body_identities_come_after_the_headers() {
    let (mut host, mut e) = glr(json!({}));
    // A header wins over the body's previous response and conversation.
    let body = json!({"previous_response_id": "resp_1", "conversation": "conv_1"}).to_string();
    let (args, _) = send(
        &mut host,
        &mut e,
        2,
        &[RESPONSES, ("session_id", "codex-1")],
        body.as_bytes(),
    );
    assert_eq!(session_of(&args), Some(session_key(NS, b"codex-1")));
    // Then the previous response, then the conversation.
    let (args, _) = send(&mut host, &mut e, 3, &[RESPONSES], body.as_bytes());
    assert_eq!(session_of(&args), Some(response_key(NS, b"resp_1")));
    let body = json!({"conversation": {"id": "conv_2"}, "prompt_cache_key": "k"}).to_string();
    let (args, t) = send(&mut host, &mut e, 4, &[RESPONSES], body.as_bytes());
    assert_eq!(session_of(&args), Some(session_key(NS, b"conv_2")));
    picked(&mut host, &mut e, t, "10.0.0.1:80", "1");
    assert!(respond(&mut host, &mut e, 4, "200", &[]).ends_with("reason=agent_session"));
    // Anthropic Messages: the metadata's user.
    let body = br#"{"messages":[],"metadata":{"user_id":"user_1_session_2"}}"#;
    let (args, _) = send(&mut host, &mut e, 5, &[(":path", "/v1/messages")], body);
    assert_eq!(
        session_of(&args),
        Some(session_key(NS, b"user_1_session_2"))
    );
    // Chat bodies name nothing of their own.
    let body = br#"{"messages":[],"prompt_cache_key":"k","metadata":{"user_id":"u"}}"#;
    let (args, _) = send(
        &mut host,
        &mut e,
        6,
        &[(":path", "/v1/chat/completions")],
        body,
    );
    assert_eq!(session_of(&args), None);
}

#[test]
fn forged_huge_and_garbage_identities_are_hashed_or_ignored() {
    let (mut host, mut e) = glr(json!({}));
    let huge = "h".repeat(10 * 1024);
    let uni = "\u{4f1a}\u{8bdd}-\u{1F600}";
    for (ctx, id) in [(2, huge.as_str()), (3, uni)] {
        let (args, _) = send(
            &mut host,
            &mut e,
            ctx,
            &[("x-claude-code-session-id", id)],
            b"{}",
        );
        let key = session_of(&args).unwrap();
        assert_eq!(key, session_key(NS, id.as_bytes()));
        assert!(key.len() < 100, "a fixed-size key");
    }
    // A repeated header reads as the host gives it (the mock: the first).
    let (args, _) = send(
        &mut host,
        &mut e,
        4,
        &[("session-id", "a"), ("session-id", "b")],
        b"{}",
    );
    assert_eq!(session_of(&args), Some(session_key(NS, b"a")));
    // Garbage previous response ids name nothing: counted, and the body's conversation names
    // the session instead.
    let long = "r".repeat(100_000);
    for (ctx, garbage) in (5..).zip([json!(7), json!({"id": "resp_1"}), json!(""), json!(long)]) {
        let before = host.metric("ai_lb.session.continuation_unknown");
        let body = json!({"previous_response_id": garbage, "conversation": "c"}).to_string();
        let (args, _) = send(&mut host, &mut e, ctx, &[RESPONSES], body.as_bytes());
        assert_eq!(session_of(&args), Some(session_key(NS, b"c")), "{ctx}");
        assert_eq!(
            host.metric("ai_lb.session.continuation_unknown"),
            before + 1
        );
    }
    // A body that is not JSON names nothing and fails nothing.
    let (args, _) = send(&mut host, &mut e, 9, &[RESPONSES], b"\xff\xfe not json");
    assert_eq!(session_of(&args), None);
}

#[test]
fn redis_down_falls_back_and_holds_nothing() {
    let (mut host, mut e) = glr(json!({}));
    let body = responses_body(Some(json!("resp_1")));
    let (_, t) = send(&mut host, &mut e, 2, &[RESPONSES], &body);
    e.on_redis_reply(&mut host, t, CallStatus::Failed, 0);
    assert_eq!(host.metric("ai_lb.session.fallback"), 1);
    assert_eq!(host.metric("ai_lb.glr.fallback"), 1);
    let calls = host.redis_calls.len();
    respond(&mut host, &mut e, 2, "200", &[r#"{"id":"resp_2"}"#]);
    assert_eq!(host.redis_calls.len(), calls, "a fallback records nothing");
    // The call cannot even be sent: nothing held, nothing recorded.
    host.redis_call_status = Some(HostErrorKind::NotFound);
    host.live_contexts.push(3);
    host.request_headers = vec![(RESPONSES.0.into(), RESPONSES.1.into())];
    e.on_request_headers(&mut host, 3, false);
    e.on_request_body(&mut host, 3, body.len(), true);
    assert_eq!(host.metric("ai_lb.session.fallback"), 2);
    respond(&mut host, &mut e, 3, "200", &[r#"{"id":"resp_3"}"#]);
    assert_eq!(host.metric("ai_lb.session.response_recorded"), 0);
    assert_eq!(e.tracked().0, 0, "no request left");
}

// ---- plain Envoy: consistent hashing and this proxy's table of responses ----

const EPS: [&str; 4] = [
    "10.0.0.1:8000",
    "10.0.0.2:8000",
    "10.0.0.3:8000",
    "10.0.0.4:8000",
];

fn envoy(policy: &str, extra: serde_json::Value) -> (MockHost, Balancer) {
    let mut lb = json!({"endpoints": EPS, "debugHeader": "x-dbg"});
    if let (Some(a), serde_json::Value::Object(b)) = (lb.as_object_mut(), extra) {
        a.extend(b);
    }
    let doc = json!({"lb_policy": policy, "lb_config": lb}).to_string();
    let config = PluginConfig::parse_for(doc.as_bytes(), crate::config::Build::Envoy).unwrap();
    let mut host = MockHost::new();
    host.now_ms = 1_000;
    let e = Balancer::configure(&mut host, config, 42, LogLevel::Trace);
    (host, e)
}

/// One plain-Envoy request with `headers` and `body`, answered 200 with `answer` (its body):
/// (the destination chosen, the debug reason).
fn envoy_send(
    host: &mut MockHost,
    e: &mut Balancer,
    ctx: u32,
    headers: &[(&str, &str)],
    body: &[u8],
    answer: &str,
) -> (String, String) {
    host.request_headers = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    host.body = body.to_vec();
    host.live_contexts.push(ctx);
    if e.on_request_headers(host, ctx, false) == Verdict::Pause {
        e.on_request_body(host, ctx, body.len(), true);
    }
    let to = host
        .request_headers
        .iter()
        .find(|(k, _)| k == "x-gateway-destination-endpoint")
        .map(|(_, v)| v.split(',').next().unwrap_or("").to_string())
        .unwrap_or_default();
    let dbg = respond(host, e, ctx, "200", &[answer]);
    let reason = dbg.rsplit("reason=").next().unwrap_or("").to_string();
    (to, reason)
}

fn chat_body(text: &str) -> Vec<u8> {
    json!({"model": "m", "messages": [{"role": "user", "content": text}]})
        .to_string()
        .into_bytes()
}

#[test]
fn envoy_an_agent_header_keeps_its_ring_pod_on_every_proxy() {
    // Least request by bytes reads the body; by requests it decides at the headers, where
    // only the headers count (both tried).
    for cost in ["bytes", "requests"] {
        let (mut a, mut ea) = envoy("global_least_request", json!({"costMode": cost}));
        let (mut b, mut eb) = envoy("global_least_request", json!({"costMode": cost}));
        let h = [("x-claude-code-session-id", "cc-1")];
        let (home, reason) = envoy_send(&mut a, &mut ea, 2, &h, &chat_body("q"), "{}");
        assert_eq!(reason, "agent_session", "{cost}");
        for ctx in 3..8 {
            let (to, _) = envoy_send(&mut a, &mut ea, ctx, &h, &chat_body("q"), "{}");
            assert_eq!(to, home, "{cost}");
            assert_eq!(
                envoy_send(&mut b, &mut eb, ctx, &h, &chat_body("q"), "{}").0,
                home
            );
        }
        assert_eq!(a.metric("ai_lb.session.agent"), 6);
        assert_eq!(a.metric("ai_lb.session.hit"), 6);
        // Off: least request alone.
        let (mut c, mut ec) = envoy(
            "global_least_request",
            json!({"costMode": cost, "agentSessions": false}),
        );
        let (_, reason) = envoy_send(&mut c, &mut ec, 2, &h, &chat_body("q"), "{}");
        assert_eq!(reason, "least_request");
    }
}

#[test]
fn envoy_a_continuation_goes_to_the_pod_this_proxy_recorded() {
    for policy in ["global_least_request", "prefix_cache"] {
        let (mut host, mut e) = envoy(policy, json!({"costMode": "bytes"}));
        let first = json!({"model": "m", "input": "hello there"}).to_string();
        let (pod, _) = envoy_send(
            &mut host,
            &mut e,
            2,
            &[RESPONSES],
            first.as_bytes(),
            r#"{"id":"resp_1"}"#,
        );
        assert_eq!(
            host.metric("ai_lb.session.response_recorded"),
            1,
            "{policy}"
        );
        let mut prev = "resp_1".to_string();
        for (ctx, turn) in (3..9).zip(1..) {
            let body = json!({"model": "m", "input": format!("turn {turn}"), "previous_response_id": prev})
                .to_string();
            let next = format!("resp_{ctx}");
            let answer = json!({"id": next}).to_string();
            let (to, reason) = envoy_send(
                &mut host,
                &mut e,
                ctx,
                &[RESPONSES],
                body.as_bytes(),
                &answer,
            );
            assert_eq!(
                (to.as_str(), reason.as_str()),
                (pod.as_str(), "continuation"),
                "{policy}"
            );
            prev = next;
        }
        // Unknown in this proxy: placed as without it, counted.
        let body = json!({"input": "x", "previous_response_id": "resp_elsewhere"}).to_string();
        let (_, reason) = envoy_send(&mut host, &mut e, 20, &[RESPONSES], body.as_bytes(), "{}");
        assert_ne!(reason, "continuation", "{policy}");
        assert_eq!(
            host.metric("ai_lb.session.continuation_unknown"),
            1,
            "{policy}"
        );
        // The counts all came back.
        let shared = host.shared.borrow();
        let counts: Vec<_> = shared
            .iter()
            .filter(|(k, _)| k.starts_with("ailb.glr."))
            .flat_map(|(_, (v, _))| shared::decode_counts(v))
            .filter(|(k, _)| !k.starts_with('~'))
            .collect();
        assert!(counts.iter().all(|(_, n)| *n == 0), "{policy}: {counts:?}");
    }
}

#[test]
fn envoy_a_continuation_leaves_its_pod_only_over_the_guard() {
    let (mut host, mut e) = envoy(
        "global_least_request",
        json!({"costMode": "bytes", "maxRequestCount": 1}),
    );
    let first = json!({"input": "hello"}).to_string();
    let (pod, _) = envoy_send(
        &mut host,
        &mut e,
        2,
        &[RESPONSES],
        first.as_bytes(),
        r#"{"id":"resp_1"}"#,
    );
    // Its pod at the cap (a request in flight there): the continuation goes elsewhere.
    let body = json!({"input": "again", "previous_response_id": "resp_1"}).to_string();
    let busy = json!({"input": "busy", "previous_response_id": "resp_1"}).to_string();
    host.request_headers = vec![(RESPONSES.0.into(), RESPONSES.1.into())];
    host.body = busy.clone().into_bytes();
    host.live_contexts.push(3);
    e.on_request_headers(&mut host, 3, false);
    e.on_request_body(&mut host, 3, busy.len(), true);
    let (to, reason) = envoy_send(&mut host, &mut e, 4, &[RESPONSES], body.as_bytes(), "{}");
    assert_ne!(to, pod);
    assert_eq!(reason, "session_rebound");
    respond(&mut host, &mut e, 3, "200", &[]);
    // Back within the guard: its pod again.
    let (to, reason) = envoy_send(&mut host, &mut e, 5, &[RESPONSES], body.as_bytes(), "{}");
    assert_eq!((to, reason), (pod, "continuation".to_string()));
}

/// The token of the last Redis call sent.
fn last_token(host: &MockHost) -> u32 {
    host.next_token - 4
}

#[test]
fn a_json_answers_end_waits_for_its_record_and_a_streams_does_not() {
    let (mut host, mut e) = glr(json!({}));
    let (_, t) = send(&mut host, &mut e, 2, &[RESPONSES], &responses_body(None));
    picked(&mut host, &mut e, t, "10.0.0.1:80", "0");
    host.response_headers = vec![(":status".into(), "200".into())];
    assert!(e.on_response_headers(&mut host, 2));
    let answer = r#"{"id":"resp_j","object":"response"}"#;
    host.response_body = answer.as_bytes().to_vec();
    e.on_response_body(&mut host, 2, answer.len(), true);
    // Its id and its end came together: the end is held until Redis has the record.
    assert_eq!(sets(&host).len(), 1);
    assert!(e.holds_response(2));
    let write = last_token(&host);
    deliver(&mut host, &mut e, write, b"+OK\r\n");
    assert!(!e.holds_response(2));
    assert_eq!(host.responses_resumed, 1);
    assert_eq!(host.effective_context, Some(2));
    host.live_contexts.retain(|&c| c != 2);
    e.on_done(&mut host, 2);
    // A failed write lets the answer go on all the same.
    let (_, t) = send(&mut host, &mut e, 3, &[RESPONSES], &responses_body(None));
    picked(&mut host, &mut e, t, "10.0.0.1:80", "0");
    assert!(e.on_response_headers(&mut host, 3));
    e.on_response_body(&mut host, 3, answer.len(), true);
    assert!(e.holds_response(3));
    let write = last_token(&host);
    e.on_redis_reply(&mut host, write, CallStatus::Failed, 0);
    assert_eq!(host.responses_resumed, 2);
    host.live_contexts.retain(|&c| c != 3);
    e.on_done(&mut host, 3);
    // A stream's record leaves with its first event and is answered long before its end.
    let body = json!({"input": "x", "stream": true}).to_string();
    let (_, t) = send(&mut host, &mut e, 4, &[RESPONSES], body.as_bytes());
    picked(&mut host, &mut e, t, "10.0.0.1:80", "0");
    assert!(e.on_response_headers(&mut host, 4));
    let created = "data: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_k\"}}\n\n";
    host.response_body = created.as_bytes().to_vec();
    e.on_response_body(&mut host, 4, created.len(), false);
    assert!(!e.holds_response(4), "only a last chunk is ever held");
    let write = last_token(&host);
    deliver(&mut host, &mut e, write, b"+OK\r\n");
    e.on_response_body(&mut host, 4, created.len(), true);
    assert!(!e.holds_response(4));
    assert_eq!(host.responses_resumed, 2, "nothing to resume");
    host.live_contexts.retain(|&c| c != 4);
    e.on_done(&mut host, 4);
    // A stream that ends while its write is in flight: its end waits too.
    let (_, t) = send(&mut host, &mut e, 5, &[RESPONSES], body.as_bytes());
    picked(&mut host, &mut e, t, "10.0.0.1:80", "0");
    assert!(e.on_response_headers(&mut host, 5));
    e.on_response_body(&mut host, 5, created.len(), false);
    let write = last_token(&host);
    e.on_response_body(&mut host, 5, created.len(), true);
    assert!(e.holds_response(5));
    // The client goes away while it is held: the late reply resumes nothing.
    host.live_contexts.retain(|&c| c != 5);
    e.on_done(&mut host, 5);
    assert!(!e.holds_response(5));
    deliver(&mut host, &mut e, write, b"+OK\r\n");
    assert_eq!(host.responses_resumed, 2);
    // Answers recorded nowhere are never held.
    let (mut host, mut e) = glr(json!({"agentSessions": false}));
    let (_, t) = send(&mut host, &mut e, 2, &[RESPONSES], &responses_body(None));
    picked(&mut host, &mut e, t, "10.0.0.1:80", "0");
    e.on_response_headers(&mut host, 2);
    e.on_response_body(&mut host, 2, answer.len(), true);
    assert!(!e.holds_response(2));
}

#[test]
fn a_streams_later_chunks_skip_the_vm_once_its_id_is_recorded() {
    let (mut host, mut e) = glr(json!({}));
    let body = json!({"input": "x", "stream": true}).to_string();
    let (_, t) = send(&mut host, &mut e, 2, &[RESPONSES], body.as_bytes());
    picked(&mut host, &mut e, t, "10.0.0.1:80", "0");
    host.response_headers = vec![(":status".into(), "200".into())];
    assert!(e.on_response_headers(&mut host, 2), "its head is read");
    let created = "data: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_v\"}}\n\n";
    host.response_body = created.as_bytes().to_vec();
    // Found: nothing more to read, but the end may still have to wait for the write.
    assert!(e.on_response_body(&mut host, 2, created.len(), false));
    let write = last_token(&host);
    deliver(&mut host, &mut e, write, b"+OK\r\n");
    assert!(
        !e.on_response_body(&mut host, 2, created.len(), false),
        "the rest passes without the VM"
    );
    assert!(!e.wants_response_body(2));
    assert_eq!(host.responses_resumed, 0, "nothing was held");
}
