//! Every fallback cause docs/metrics.md counts is also warned, at most once per 10 s per cause
//! (docs/metrics.md "Logs"): a body over `maxBodyBytes` and a body that is no prompt as much
//! as a Redis failure.

use super::*;

/// The warn lines that name `cause`.
fn warned(host: &MockHost, cause: &str) -> Vec<String> {
    host.logs
        .borrow()
        .iter()
        .filter(|(l, m)| *l == LogLevel::Warn && m.contains(cause))
        .map(|(_, m)| m.clone())
        .collect()
}

#[test]
fn a_body_over_max_body_bytes_is_warned_once_per_interval() {
    let (mut host, mut e) = setup(r#","maxBodyBytes":100"#);
    for ctx in 2..5 {
        host.live_contexts.push(ctx);
        e.on_request_headers(&mut host, ctx, false);
        assert_eq!(
            e.on_request_body(&mut host, ctx, 101, false),
            Verdict::Pause
        );
        end(&mut host, &mut e, ctx);
    }
    assert_eq!(host.metric("ai_lb.fallback.body_too_large"), 3);
    let lines = warned(&host, "body_too_large");
    assert_eq!(lines.len(), 1, "{:?}", host.logs.borrow());
    assert!(
        lines[0].contains("[ai-load-balancer] #2 ")
            && lines[0].contains("maxBodyBytes (100 bytes)"),
        "{}",
        lines[0]
    );
    host.now_ms += 10_000;
    host.live_contexts.push(9);
    e.on_request_headers(&mut host, 9, false);
    e.on_request_body(&mut host, 9, 101, false);
    assert_eq!(warned(&host, "body_too_large").len(), 2, "again after 10 s");
}

#[test]
fn a_body_that_is_no_prompt_is_warned_once_per_interval() {
    let (mut host, mut e) = prefix_setup();
    for (ctx, body) in [(2, &b"not json"[..]), (3, b"{\"messages\":\"x\"}")] {
        start_with_body(&mut host, &mut e, ctx, body);
        end(&mut host, &mut e, ctx);
    }
    assert_eq!(host.metric("ai_lb.fallback.bad_request"), 2);
    let lines = warned(&host, "bad_request");
    assert_eq!(lines.len(), 1, "{:?}", host.logs.borrow());
    assert!(
        lines[0].contains("#2 ") && lines[0].contains("least request"),
        "{}",
        lines[0]
    );
    host.now_ms += 10_000;
    start_with_body(&mut host, &mut e, 4, b"not json");
    assert_eq!(warned(&host, "bad_request").len(), 2, "again after 10 s");
}

#[test]
fn every_counted_cause_is_warned_like_a_fallback() {
    // A Redis failure (a fallback to the cluster's balancing) and a body too large (balanced
    // without it) each warn once, side by side: one cause's interval does not hide another's.
    let (mut host, mut e) = setup(r#","maxBodyBytes":100"#);
    let t = start(&mut host, &mut e, 2);
    fail_call(&mut host, &mut e, t);
    host.live_contexts.push(3);
    e.on_request_headers(&mut host, 3, false);
    e.on_request_body(&mut host, 3, 101, false);
    assert_eq!(
        warned(&host, "redis_timeout").len(),
        1,
        "{:?}",
        host.logs.borrow()
    );
    assert_eq!(
        warned(&host, "body_too_large").len(),
        1,
        "{:?}",
        host.logs.borrow()
    );
}
