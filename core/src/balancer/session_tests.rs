//! Session stickiness through the balancer (mock host): where the id is read, what the acquire
//! call carries, how each reply state reads (reason, counters), and degradation when Redis fails.

use super::*;
use crate::redis::scripts::session_key;

const NS: &str = "ailb:{chat|outbound|8000||llm.static}";
const STICKY: &str =
    r#","sessionHeader":"X-Session-Id","sessionCookie":"sid","debugHeader":"x-dbg""#;

/// A request with these headers, up to its pick; returns the acquire's args and token.
fn sticky_pick(
    host: &mut MockHost,
    e: &mut Balancer,
    ctx: u32,
    headers: &[(&str, &str)],
) -> (Vec<String>, u32) {
    host.request_headers = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let t = start(host, e, ctx);
    (host.last_query_args(), t)
}

/// The session key the call carried (its last key), if any.
fn session_of(args: &[String]) -> Option<String> {
    let numkeys: usize = args[2].parse().unwrap();
    (numkeys == 9).then(|| args[3 + 3].clone())
}

fn debug(host: &MockHost) -> String {
    host.response_headers
        .iter()
        .find(|(k, _)| k == "x-dbg")
        .map(|(_, v)| v.clone())
        .unwrap()
}

#[test]
fn the_header_names_the_session_and_rides_in_the_acquire() {
    let (mut host, mut e) = setup(STICKY);
    let (args, t) = sticky_pick(&mut host, &mut e, 2, &[("x-session-id", "conv-1")]);
    assert_eq!(args[2], "9");
    assert_eq!(
        session_of(&args).unwrap(),
        session_key(NS, b"conv-1"),
        "the session key shares the route's hash tag"
    );
    // ARGV[9..11]: session TTL (default 1800 s) and the guard's bounds.
    assert_eq!(&args[12 + 8..12 + 11], ["1800", "8", "1.5"]);
    deliver(
        &mut host,
        &mut e,
        t,
        &bulk_array(&["OK", "10.0.0.2:80", "0", "0", "1", "0"]),
    );
    e.on_response_headers(&mut host, 2);
    assert_eq!(debug(&host), "endpoint=10.0.0.2:80; reason=session");
    assert_eq!(host.override_host.as_deref(), Some("10.0.0.2:80"));
    assert_eq!(host.metric("ai_lb.session.hit"), 1);
    assert_eq!(host.metric("ai_lb.glr.routed"), 1);
    end(&mut host, &mut e, 2);
    assert_eq!(e.tracked(), (0, 1), "the release is in flight");
}

#[test]
fn each_session_state_has_its_reason_and_counter() {
    for (state, reason, counter) in [
        ("2", "least_request", "ai_lb.session.bound"),
        ("3", "session_rebound", "ai_lb.session.rebound"),
    ] {
        let (mut host, mut e) = setup(STICKY);
        let (_, t) = sticky_pick(&mut host, &mut e, 2, &[("x-session-id", "s")]);
        deliver(
            &mut host,
            &mut e,
            t,
            &bulk_array(&["OK", "10.0.0.1:80", "0", "0", state, "0"]),
        );
        e.on_response_headers(&mut host, 2);
        assert_eq!(
            debug(&host),
            format!("endpoint=10.0.0.1:80; reason={reason}")
        );
        assert_eq!(host.metric(counter), 1, "{counter}");
        assert_eq!(host.metric("ai_lb.session.hit"), 0);
    }
}

#[test]
fn an_unknown_session_state_is_a_bad_reply_and_nothing_is_held() {
    let (mut host, mut e) = setup(STICKY);
    let (_, t) = sticky_pick(&mut host, &mut e, 2, &[("x-session-id", "s")]);
    deliver(
        &mut host,
        &mut e,
        t,
        &bulk_array(&["OK", "10.0.0.1:80", "0", "0", "9", "0"]),
    );
    assert_eq!(host.metric("ai_lb.fallback.bad_reply"), 1);
    assert_eq!(host.metric("ai_lb.session.fallback"), 1);
    end(&mut host, &mut e, 2);
    assert_eq!(e.tracked(), (0, 0));
}

#[test]
fn empty_absent_huge_unicode_and_repeated_ids() {
    let (mut host, mut e) = setup(STICKY);
    // Empty header, no cookie: no session at all (ARGV[9] = 0, three keys).
    let (args, _) = sticky_pick(&mut host, &mut e, 2, &[("x-session-id", "")]);
    assert_eq!(session_of(&args), None);
    assert_eq!(args[11 + 8], "0");
    // Absent header: the cookie names it; an empty header also falls through to it.
    let (args, _) = sticky_pick(
        &mut host,
        &mut e,
        3,
        &[("x-session-id", ""), ("cookie", "a=1; sid=c-7")],
    );
    assert_eq!(session_of(&args).unwrap(), session_key(NS, b"c-7"));
    // A 10 KB id and a unicode id: fixed-size keys, distinct, stable.
    let huge = "x".repeat(10 * 1024);
    let (args, _) = sticky_pick(&mut host, &mut e, 4, &[("x-session-id", &huge)]);
    let k = session_of(&args).unwrap();
    assert_eq!(k.len(), NS.len() + ":session:".len() + 40);
    assert_eq!(k, session_key(NS, huge.as_bytes()));
    let uni = "\u{4f1a}\u{8bdd}-\u{1F600}";
    let (args, _) = sticky_pick(&mut host, &mut e, 5, &[("x-session-id", uni)]);
    let u = session_of(&args).unwrap();
    assert_eq!(u, session_key(NS, uni.as_bytes()));
    assert_ne!(u, k);
    // A repeated header reads as the host gives it (the first value, as Envoy does).
    let (args, _) = sticky_pick(
        &mut host,
        &mut e,
        6,
        &[("x-session-id", "first"), ("x-session-id", "second")],
    );
    assert_eq!(session_of(&args).unwrap(), session_key(NS, b"first"));
}

/// A request whose whole body is `body`, up to its pick; returns the acquire's args.
fn body_pick(host: &mut MockHost, e: &mut Balancer, ctx: u32, body: &[u8]) -> Vec<String> {
    host.body = body.to_vec();
    host.live_contexts.push(ctx);
    assert_eq!(e.on_request_headers(host, ctx, false), Verdict::Pause);
    assert_eq!(
        e.on_request_body(host, ctx, body.len(), true),
        Verdict::Pause
    );
    host.last_query_args()
}

#[test]
fn the_body_field_names_the_session_last() {
    let (mut host, mut e) = setup(r#","sessionBodyField":"metadata.conversation""#);
    let body = br#"{"model":"m","metadata":{"conversation":"b-1"},"messages":[]}"#;
    let args = body_pick(&mut host, &mut e, 2, body);
    assert_eq!(session_of(&args).unwrap(), session_key(NS, b"b-1"));
    let args = body_pick(&mut host, &mut e, 3, br#"{"metadata":{"conversation":""}}"#);
    assert_eq!(session_of(&args), None, "an empty value is no session");
    let args = body_pick(&mut host, &mut e, 4, br#"{"metadata":{"conversation":7}}"#);
    assert_eq!(session_of(&args), None, "a non-string is no session");
}

#[test]
fn redis_down_degrades_to_the_fallback_counted_with_nothing_held() {
    let (mut host, mut e) = setup(STICKY);
    // Lost reply: every lease the call could have written is released, the request falls back.
    let (_, t) = sticky_pick(&mut host, &mut e, 2, &[("x-session-id", "s")]);
    let calls = host.redis_calls.len();
    fail_call(&mut host, &mut e, t);
    assert_eq!(host.metric("ai_lb.session.fallback"), 1);
    assert_eq!(host.metric("ai_lb.glr.fallback"), 1);
    assert_eq!(
        host.redis_calls.len(),
        calls + 1,
        "a release of every possible lease"
    );
    assert_eq!(host.resumed, 1);
    end(&mut host, &mut e, 2);
    // The call cannot even be sent.
    host.redis_call_status = Some(HostErrorKind::NotFound);
    host.request_headers = vec![("x-session-id".into(), "s".into())];
    host.live_contexts.push(3);
    assert_eq!(e.on_request_headers(&mut host, 3, false), Verdict::Pause);
    e.on_request_body(&mut host, 3, 20, true);
    assert_eq!(host.metric("ai_lb.session.fallback"), 2);
    end(&mut host, &mut e, 3);
    // A request without a session falling back is not a session fallback.
    host.request_headers.clear();
    host.live_contexts.push(4);
    e.on_request_headers(&mut host, 4, false);
    e.on_request_body(&mut host, 4, 20, true);
    assert_eq!(host.metric("ai_lb.glr.fallback"), 3);
    assert_eq!(host.metric("ai_lb.session.fallback"), 2);
}
