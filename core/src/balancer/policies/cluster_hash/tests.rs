//! Higress PR #3921's `key` block end to end on the mock host (issue 39 item 7): the key is read
//! where the block says, hashed as Go hashes it, and a request without it is answered 403
//! `hash key required`. Before, the block was an unknown key: every request hashed
//! `x-mse-consumer` instead (or was refused 403 without it), the worst outcome for a user who
//! wrote a cookie or body key, since nothing said so.

use crate::balancer::{Balancer, Verdict};
use crate::cluster::hash::slot_of;
use crate::config::PluginConfig;
use crate::host::mock::MockHost;
use crate::host::{Host, LogLevel};
use serde_json::json;

const HEADER: &str = "x-higress-target-cluster";
const A: &str = "outbound|80||a.static";
const B: &str = "outbound|80||b.static";

fn engine(key: serde_json::Value) -> (MockHost, Balancer) {
    let cfg = json!({"lb_type": "cluster", "lb_policy": "cluster_hash", "lb_config": {
        "clusters": [{"cluster": A, "weight": 50}, {"cluster": B, "weight": 50}],
        "key": key,
    }});
    let mut host = MockHost::new().with_route("chat", "outbound|80||default");
    let config = PluginConfig::parse(cfg.to_string().as_bytes()).unwrap();
    let e = Balancer::configure(&mut host, config, 42, LogLevel::Trace);
    (host, e)
}

fn cluster_of(key: &[u8]) -> &'static str {
    if slot_of(key) < 50 {
        A
    } else {
        B
    }
}

/// One request: its headers, then its body when it has one. The written cluster, or the
/// local reply's details.
fn send(
    host: &mut MockHost,
    e: &mut Balancer,
    ctx: u32,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Result<String, String> {
    host.request_headers = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    host.local_responses.clear();
    host.live_contexts.push(ctx);
    let verdict = e.on_request_headers(host, ctx, body.is_none());
    if let Some(b) = body {
        assert_eq!(verdict, Verdict::Pause, "held for its body");
        host.body = b.as_bytes().to_vec();
        e.on_request_body(host, ctx, b.len(), true);
    }
    let out = match host.local_responses.first() {
        Some((status, details)) => Err(format!("{status} {details}")),
        None => host
            .request_header(HEADER)
            .unwrap()
            .ok_or_else(|| "none".into()),
    };
    host.live_contexts.retain(|&c| c != ctx);
    e.on_done(host, ctx);
    out
}

const MISSING: &str = "403 ai_lb_hash_key_required";

#[test]
fn a_cookie_key_hashes_the_cookie_as_go_reads_it() {
    let (mut host, mut e) = engine(json!({"source": "cookie", "name": "llm_session"}));
    for (ctx, user) in ["alice", "bob", "carol", "dave"].into_iter().enumerate() {
        let cookie = format!("theme=dark; llm_session=\"{user}\"; x=1");
        let got = send(
            &mut host,
            &mut e,
            ctx as u32 + 1,
            &[("cookie", &cookie)],
            None,
        );
        assert_eq!(got.as_deref(), Ok(cluster_of(user.as_bytes())), "{user}");
    }
    // The released plugin's header is not the key any more.
    let got = send(&mut host, &mut e, 9, &[("x-mse-consumer", "alice")], None);
    assert_eq!(got, Err(MISSING.into()));
    let got = send(&mut host, &mut e, 10, &[("cookie", "llm_session=")], None);
    assert_eq!(got, Err(MISSING.into()));
    assert_eq!(host.metric("ai_lb.cluster_hash.routed"), 4);
    assert_eq!(host.metric("ai_lb.cluster_hash.rejected_403"), 2);
    assert_eq!(e.tracked(), (0, 0));
}

#[test]
fn a_body_key_holds_the_request_for_its_body() {
    let (mut host, mut e) =
        engine(json!({"source": "body", "jsonPath": "$.callOptions.stickySessionId"}));
    let body = |id: &str| {
        json!({"model": "m", "messages": [], "callOptions": {"stickySessionId": id}}).to_string()
    };
    for (ctx, id) in ["s-1", "s-2", "s-3"].into_iter().enumerate() {
        let got = send(&mut host, &mut e, ctx as u32 + 1, &[], Some(&body(id)));
        assert_eq!(got.as_deref(), Ok(cluster_of(id.as_bytes())), "{id}");
    }
    // A number is hashed as gjson writes it.
    let n = r#"{"callOptions":{"stickySessionId":42}}"#;
    assert_eq!(
        send(&mut host, &mut e, 5, &[], Some(n)).as_deref(),
        Ok(cluster_of(b"42"))
    );
    // No body (a GET), no such field, not JSON: no key.
    assert_eq!(send(&mut host, &mut e, 6, &[], None), Err(MISSING.into()));
    assert_eq!(
        send(&mut host, &mut e, 7, &[], Some(r#"{"model":"m"}"#)),
        Err(MISSING.into())
    );
    assert_eq!(
        send(&mut host, &mut e, 8, &[], Some("callOptions")),
        Err(MISSING.into())
    );
    // A GET has no body key, whatever it carries (the PR answers it at its headers).
    let get = send(
        &mut host,
        &mut e,
        9,
        &[(":method", "GET")],
        Some(&body("s-1")),
    );
    assert_eq!(get, Err(MISSING.into()));
    assert_eq!(e.tracked(), (0, 0));
}

#[test]
fn a_body_over_the_keys_limit_has_no_key() {
    let (mut host, mut e) =
        engine(json!({"source": "body", "jsonPath": "id", "max_body_bytes": 64}));
    let small = r#"{"id":"u-1"}"#;
    assert_eq!(
        send(&mut host, &mut e, 1, &[], Some(small)).as_deref(),
        Ok(cluster_of(b"u-1"))
    );
    let big = format!(r#"{{"id":"u-1","pad":"{}"}}"#, "x".repeat(100));
    assert_eq!(
        send(&mut host, &mut e, 2, &[], Some(&big)),
        Err(MISSING.into())
    );
}

#[test]
fn a_metadata_key_hashes_the_property() {
    let (mut host, mut e) =
        engine(json!({"source": "metadata", "propertyPath": ["metadata", "selected_session_key"]}));
    host.properties
        .insert("metadata.selected_session_key".into(), b"tenant-7".to_vec());
    assert_eq!(
        send(&mut host, &mut e, 1, &[], None).as_deref(),
        Ok(cluster_of(b"tenant-7"))
    );
    host.properties.remove("metadata.selected_session_key");
    assert_eq!(send(&mut host, &mut e, 2, &[], None), Err(MISSING.into()));
    // `name` alone is the property `[metadata, name]`.
    let (mut host, mut e) = engine(json!({"source": "metadata", "name": "k"}));
    host.properties.insert("metadata.k".into(), b"v".to_vec());
    assert_eq!(
        send(&mut host, &mut e, 1, &[], None).as_deref(),
        Ok(cluster_of(b"v"))
    );
}

#[test]
fn a_header_key_names_its_header_or_falls_back_to_hash_header() {
    let (mut host, mut e) = engine(json!({"source": "header", "name": "x-session"}));
    let got = send(
        &mut host,
        &mut e,
        1,
        &[("x-session", "alice"), ("x-mse-consumer", "bob")],
        None,
    );
    assert_eq!(got.as_deref(), Ok(cluster_of(b"alice")));
    assert_eq!(
        send(&mut host, &mut e, 2, &[("x-mse-consumer", "bob")], None),
        Err(MISSING.into())
    );
    // No name: `hash_header` (here its default), still with the PR's 403 text.
    let (mut host, mut e) = engine(json!({}));
    let got = send(&mut host, &mut e, 1, &[("x-mse-consumer", "bob")], None);
    assert_eq!(got.as_deref(), Ok(cluster_of(b"bob")));
    assert_eq!(send(&mut host, &mut e, 2, &[], None), Err(MISSING.into()));
}
