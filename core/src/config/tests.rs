//! Config tests over the shipped examples in `plugin-config/` and the invalid corpus in
//! `plugin-config/invalid/` (each `.json` beside a `.err` holding the expected message part).

use super::*;
use serde_json::json;
use std::path::Path;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .join("plugin-config")
            .join(name),
    )
    .unwrap()
}

#[test]
fn minimal_config_gets_higress_defaults() {
    let cfg = PluginConfig::parse(&fixture("minimal.json")).unwrap();
    let g = cfg.global.as_ref().unwrap();
    assert_eq!(g.policy.kind(), Policy::GlobalLeastRequest);
    assert_eq!(
        g.redis.as_ref().unwrap().cluster,
        "outbound|6379||redis.static"
    );
    assert_eq!(
        g.redis.as_ref().unwrap().init_cluster,
        "outbound|6379||redis.static?buffer_flush_timeout=0&max_buffer_size_before_flush=0"
    );
    assert_eq!(g.redis.as_ref().unwrap().timeout_ms, 3000);
    assert_eq!(g.redis.as_ref().unwrap().database, 0);
    assert_eq!(g.common.max_load, 0);
    assert_eq!(g.common.lease_ttl_ms, 600_000);
    assert_eq!(g.common.cost, CostMode::Requests);
    assert_eq!(g.common.failure_mode, FailureMode::Allow);
    assert_eq!(g.common.debug_header, None);
    assert_eq!(g.common.key_prefix, "ailb");
    assert!(cfg.rules.is_empty());
}

#[test]
fn full_config_reads_every_key() {
    let cfg = PluginConfig::parse(&fixture("full.json")).unwrap();
    let g = cfg.global.as_ref().unwrap();
    assert_eq!(g.redis.as_ref().unwrap().username, "default");
    assert_eq!(
        g.redis.as_ref().unwrap().password.expose(),
        "s3cret-password"
    );
    assert_eq!(g.redis.as_ref().unwrap().timeout_ms, 500);
    assert!(g.redis.as_ref().unwrap().init_cluster.contains("?db=2&"));
    assert_eq!(g.common.max_load, 64);
    assert_eq!(g.common.lease_ttl_ms, 300_000);
    assert_eq!(g.common.debug_header.as_deref(), Some("x-ai-lb-debug"));
    assert_eq!(g.common.max_body_bytes, 4_194_304);
    assert!(!g.common.detail_log);
    assert_eq!(cfg.rules.len(), 2);
    assert_eq!(cfg.rules[0].1.common.failure_mode, FailureMode::Deny);
    assert_eq!(cfg.rules[1].1.common.cost, CostMode::Tokens);
}

#[test]
fn password_never_appears_in_debug_output_errors_or_warnings() {
    let cfg = PluginConfig::parse(&fixture("full.json")).unwrap();
    let dump = format!("{cfg:?} {}", cfg.summary());
    assert!(!dump.contains("s3cret-password"), "{dump}");
    // Higress reads a password of any type as text; the warning saying so never quotes it.
    for password in [
        json!(["hunter2hunter2"]),
        json!(987654321),
        json!({"p": "hunter2hunter2"}),
    ] {
        let bad = json!({"lb_policy": "global_least_request",
            "lb_config": {"serviceFQDN": "r", "servicePort": 1, "password": password}});
        let parsed = parse(bad.to_string().as_bytes(), Build::Higress).unwrap();
        let text = format!("{:?} {:?}", parsed.warnings, parsed.config);
        assert!(text.contains("lb_config.password"), "{text}");
        assert!(
            !text.contains("hunter2") && !text.contains("987654321"),
            "{text}"
        );
    }
    // Nor does an error in another key of the same object.
    let bad = br#"{"lb_policy":"global_least_request","lb_config":{"serviceFQDN":"r","servicePort":1,"password":"hunter2","leaseTTL":"hunter2"}}"#;
    let err = PluginConfig::parse(bad).unwrap_err().to_string();
    assert!(
        err.contains("lb_config.leaseTTL") && !err.contains("hunter2"),
        "{err}"
    );
}

#[test]
fn rules_first_match_wins_then_global() {
    let cfg = PluginConfig::parse(&fixture("full.json")).unwrap();
    let pick = |route: &str, authority: &str| {
        let keys = RequestKeys {
            route: Some(route),
            cluster: Some("outbound|8000||llm.static"),
            authority: Some(authority),
        };
        let c = cfg.select(&keys).unwrap();
        (c.common.failure_mode, c.common.cost)
    };
    assert_eq!(
        pick("default/chat-strict", "x.batch.example.com"),
        (FailureMode::Deny, CostMode::Requests)
    );
    assert_eq!(
        pick("other", "x.batch.example.com"),
        (FailureMode::Allow, CostMode::Tokens)
    );
    assert_eq!(
        pick("other", "chat.example.com"),
        (FailureMode::Allow, CostMode::Requests)
    );
}

#[test]
fn rules_only_config_is_inactive_elsewhere() {
    let json = br#"{"_rules_":[{"_match_route_":["a"],"lb_policy":"global_least_request",
        "lb_config":{"serviceFQDN":"redis.static","servicePort":6379}}]}"#;
    let cfg = PluginConfig::parse(json).unwrap();
    assert!(cfg.global.is_none());
    let hit = RequestKeys {
        route: Some("a"),
        ..Default::default()
    };
    let miss = RequestKeys {
        route: Some("b"),
        ..Default::default()
    };
    assert!(cfg.select(&hit).is_some());
    assert!(cfg.select(&miss).is_none());
}

#[test]
fn only_rules_and_endpoint_policies_need_the_request_names() {
    let cluster = r#""lb_type":"cluster","lb_policy":"cluster_hash","lb_config":{"clusters":[{"cluster":"a","weight":100}]}"#;
    let redis = r#""lb_policy":"global_least_request","lb_config":{"serviceFQDN":"redis.static","servicePort":6379}"#;
    for (json, needs) in [
        // A global cluster policy matches every request and names no route keys.
        (format!("{{{cluster}}}"), false),
        (format!("{{{redis}}}"), true),
        (
            format!(r#"{{{cluster},"_rules_":[{{"_match_route_":["r"],{cluster}}}]}}"#),
            true,
        ),
        (
            format!(r#"{{"_rules_":[{{"_match_domain_":["x.com"],{cluster}}}]}}"#),
            true,
        ),
    ] {
        let cfg = PluginConfig::parse(json.as_bytes()).unwrap();
        assert_eq!(cfg.needs_request_names(), needs, "{json}");
    }
}

#[test]
fn control_plane_keys_are_ignored() {
    let json = br#"{"_plugin_id_":"x","lb_policy":"global_least_request",
        "lb_config":{"serviceFQDN":"redis.static","servicePort":6379,"_comment_":"ok"}}"#;
    assert!(PluginConfig::parse(json).is_ok());
}

#[test]
fn every_invalid_fixture_fails_with_its_message() {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("plugin-config/invalid");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let want = std::fs::read_to_string(path.with_extension("err")).unwrap();
        let got = PluginConfig::parse(&std::fs::read(&path).unwrap());
        let err = got
            .err()
            .unwrap_or_else(|| panic!("{} was accepted", path.display()));
        assert!(
            err.to_string().contains(want.trim()),
            "{}: got `{err}`, want `{}`",
            path.display(),
            want.trim()
        );
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} invalid fixtures");
}

fn envoy(lb_policy: &str, lb: serde_json::Value) -> Result<RouteConfig, ConfigError> {
    let cfg = json!({"lb_policy": lb_policy, "lb_config": lb});
    let parsed = parse(cfg.to_string().as_bytes(), Build::Envoy)?;
    assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
    Ok(parsed.config.global.as_deref().cloned().unwrap())
}

#[test]
fn plain_envoy_holds_for_the_body_only_where_the_policy_reads_it() {
    let pods = json!(["10.0.0.1:80", "10.0.0.2:80"]);
    let scrape = json!({"endpoints": pods, "scrapeCluster": "c"});
    for (policy, lb, at_headers) in [
        ("global_least_request", json!({"endpoints": pods}), true),
        (
            "global_least_request",
            json!({"endpoints": pods, "costMode": "requests"}),
            true,
        ),
        (
            "global_least_request",
            json!({"endpoints": pods, "costMode": "bytes"}),
            false,
        ),
        (
            "global_least_request",
            json!({"endpoints": pods, "costMode": "tokens"}),
            false,
        ),
        ("prefix_cache", json!({"endpoints": pods}), false),
        ("endpoint_metrics", scrape.clone(), false),
    ] {
        let r = envoy(policy, lb.clone()).unwrap();
        assert_eq!(r.decide_at_headers, at_headers, "{policy} {lb}");
        assert_eq!(r.common.max_body_wait_ms, 1000, "{policy} {lb}");
        assert!(r.redis.is_none());
    }
    // The Higress build always waits for the body, with no deadline.
    let cfg = PluginConfig::parse_for(&fixture("minimal.json"), Build::Higress).unwrap();
    let g = cfg.global.unwrap();
    assert!(!g.decide_at_headers);
    assert_eq!(g.common.max_body_wait_ms, 0);
}

#[test]
fn plain_envoy_accepts_prefix_cache_with_endpoints_and_no_redis() {
    let r = envoy(
        "prefix_cache",
        json!({"endpoints": ["10.0.0.2:80", "10.0.0.1:80"], "maxBodyWaitMs": 250,
               "redisKeyTTL": 60, "maxBlocks": 16}),
    )
    .unwrap();
    assert_eq!(r.policy.kind(), Policy::PrefixCache);
    assert_eq!(*r.endpoints, vec!["10.0.0.1:80", "10.0.0.2:80"]);
    assert_eq!(r.common.max_body_wait_ms, 250);
    assert!(matches!(r.publish, Publish::Header { .. }));
    let PolicyConfig::PrefixCache(p) = &r.policy else {
        panic!()
    };
    assert_eq!((p.ttl_s, p.canon.max_blocks), (60, 16));
    // The pods are required; Redis keys have no meaning there.
    let e = envoy("prefix_cache", json!({})).unwrap_err();
    assert!(e.to_string().contains("endpoints"), "{e}");
    let e = envoy(
        "prefix_cache",
        json!({"endpoints": ["10.0.0.1:80"], "serviceFQDN": "redis.static"}),
    )
    .unwrap_err();
    assert!(e.to_string().contains("no Redis"), "{e}");
}

#[test]
fn max_body_wait_is_a_plain_envoy_key_within_bounds() {
    let pods = json!(["10.0.0.1:80"]);
    for bad in [0, 9, 600_001] {
        let e = envoy(
            "prefix_cache",
            json!({"endpoints": pods, "maxBodyWaitMs": bad}),
        )
        .unwrap_err();
        assert!(e.to_string().contains("maxBodyWaitMs"), "{e}");
    }
    let e = envoy(
        "prefix_cache",
        json!({"endpoints": pods, "maxBodyWaitMs": "1s"}),
    )
    .unwrap_err();
    assert!(e.to_string().contains("maxBodyWaitMs"), "{e}");
    let cfg = json!({"lb_policy": "global_least_request", "lb_config":
        {"serviceFQDN": "redis.static", "servicePort": 6379, "maxBodyWaitMs": 500}});
    let e = parse(cfg.to_string().as_bytes(), Build::Higress).unwrap_err();
    assert!(e.to_string().contains("plain-Envoy build"), "{e}");
}

#[test]
fn cluster_metrics_global_inflight_reads_the_lease_ttl() {
    let lb = |extra: serde_json::Value| {
        let mut lb = json!({"mode": "AdaptiveScore", "service_list": ["a", "b"]});
        if let (Some(o), Some(e)) = (lb.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        json!({"lb_type": "cluster", "lb_policy": "cluster_metrics", "lb_config": lb}).to_string()
    };
    let on = json!({"global_inflight_enabled": true, "serviceFQDN": "redis.static",
                    "servicePort": 6379, "leaseTTL": 3});
    let parsed = parse(lb(on.clone()).as_bytes(), Build::Higress).unwrap();
    assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
    assert_eq!(parsed.config.global.unwrap().common.lease_ttl_ms, 3000);
    let mut bad = on;
    bad["leaseTTL"] = json!(0);
    let err = parse(lb(bad).as_bytes(), Build::Higress).unwrap_err();
    assert!(err.to_string().contains("lb_config.leaseTTL"), "{err}");
    // Without the count there is no lease: the key is ignored, and said so.
    let parsed = parse(lb(json!({"leaseTTL": 3})).as_bytes(), Build::Higress).unwrap();
    assert_eq!(
        parsed.config.global.unwrap().common.lease_ttl_ms,
        common::DEFAULT_LEASE_TTL_S * 1000
    );
    assert!(
        format!("{:?}", parsed.warnings).contains("read only with global_inflight_enabled"),
        "{:?}",
        parsed.warnings
    );
}

fn session_cfg(policy: &str, extra: &str, build: Build) -> Result<Parsed, ConfigError> {
    let redis = if build == Build::Higress {
        r#""serviceFQDN":"redis.static","servicePort":6379"#
    } else {
        r#""endpoints":["10.0.0.1:80"]"#
    };
    let json = format!(r#"{{"lb_policy":"{policy}","lb_config":{{{redis}{extra}}}}}"#);
    parse(json.as_bytes(), build)
}

#[test]
fn session_keys_are_read_for_both_redis_policies() {
    for policy in ["global_least_request", "prefix_cache"] {
        let extra = r#","sessionHeader":"X-Session-Id","sessionCookie":"sid","sessionBodyField":"metadata.conv","sessionTTL":60"#;
        let parsed = session_cfg(policy, extra, Build::Higress).unwrap();
        assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
        let s = parsed.config.global.unwrap().session.clone().unwrap();
        assert_eq!(s.header.as_deref(), Some("x-session-id"));
        assert_eq!(s.cookie.as_deref(), Some("sid"));
        assert_eq!(s.body_field, Some(BodyField::Metadata("conv".into())));
        assert_eq!(s.ttl_s, 60);
    }
    let s = session_cfg(
        "global_least_request",
        r#","sessionBodyField":"user""#,
        Build::Higress,
    )
    .unwrap()
    .config
    .global
    .unwrap()
    .session
    .clone()
    .unwrap();
    assert_eq!((&s.header, &s.cookie), (&None, &None));
    assert_eq!(s.body_field, Some(BodyField::User));
    assert_eq!(s.ttl_s, 1800);
    let none = session_cfg("global_least_request", "", Build::Higress).unwrap();
    assert!(none.config.global.unwrap().session.is_none());
}

#[test]
fn session_keys_are_strict() {
    for (extra, key, part) in [
        (
            r#","sessionHeader":"x session""#,
            "sessionHeader",
            "header name",
        ),
        (r#","sessionHeader":"""#, "sessionHeader", "header name"),
        (r#","sessionHeader":7"#, "sessionHeader", ""),
        (r#","sessionCookie":"a=b""#, "sessionCookie", "cookie name"),
        (
            r#","sessionBodyField":"metadata.""#,
            "sessionBodyField",
            "user, metadata.<key>",
        ),
        (
            r#","sessionBodyField":"messages""#,
            "sessionBodyField",
            "unknown value",
        ),
        (
            r#","sessionHeader":"s","sessionTTL":0"#,
            "sessionTTL",
            "outside 1-604800",
        ),
        (r#","sessionHeader":"s","sessionTTL":-5"#, "sessionTTL", ""),
        (r#","sessionTTL":60"#, "sessionTTL", "there is no session"),
    ] {
        let e = session_cfg("global_least_request", extra, Build::Higress).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains(&format!("lb_config.{key}")),
            "{extra}: {text}"
        );
        assert!(text.contains(part), "{extra}: {text}");
    }
}

#[test]
fn session_keys_are_taken_by_every_endpoint_policy_and_ttl_only_with_a_binding() {
    // endpoint_metrics consistent-hashes sessions without Redis (below), and keeps their
    // binding in Redis with it (Higress build).
    let s = session_cfg(
        "endpoint_metrics",
        r#","sessionHeader":"s","sessionBodyField":"user""#,
        Build::Higress,
    )
    .unwrap()
    .config
    .global
    .unwrap()
    .session
    .clone()
    .unwrap();
    assert_eq!(s.header.as_deref(), Some("s"));
    assert_eq!(s.body_field, Some(BodyField::User));
    // With a Redis service the binding is kept there, with its TTL, and the Redis keys are read.
    let parsed = session_cfg(
        "endpoint_metrics",
        r#","sessionHeader":"s","sessionTTL":60"#,
        Build::Higress,
    )
    .unwrap();
    assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
    let route = parsed.config.global.unwrap();
    assert!(route.redis.is_some());
    assert_eq!(route.session.as_ref().unwrap().ttl_s, 60);
    // Without one: consistent hashing, no TTL; Redis keys without a session are ignored.
    let json =
        br#"{"lb_policy":"endpoint_metrics","lb_config":{"sessionHeader":"s","sessionTTL":60}}"#;
    let e = parse(json, Build::Higress).unwrap_err().to_string();
    assert!(
        e.contains("lb_config.sessionTTL") && e.contains("without serviceFQDN"),
        "{e}"
    );
    let json = br#"{"lb_policy":"endpoint_metrics","lb_config":{"sessionHeader":"s"}}"#;
    let route = parse(json, Build::Higress).unwrap().config.global.unwrap();
    assert!(route.redis.is_none() && route.session.is_some());
    let plain = session_cfg("endpoint_metrics", "", Build::Higress).unwrap();
    assert!(plain.config.global.unwrap().redis.is_none());
    assert!(format!("{:?}", plain.warnings).contains("serviceFQDN"));
    let envoy_metrics = r#","scrapeCluster":"scrape","sessionCookie":"sid""#;
    let s = session_cfg("endpoint_metrics", envoy_metrics, Build::Envoy)
        .unwrap()
        .config
        .global
        .unwrap()
        .session
        .clone()
        .unwrap();
    assert_eq!(s.cookie.as_deref(), Some("sid"));
    let e = session_cfg(
        "endpoint_metrics",
        r#","scrapeCluster":"scrape","sessionCookie":"sid","sessionTTL":5"#,
        Build::Envoy,
    );
    assert!(e.unwrap_err().to_string().contains("stores no binding"));
    // The keys stay strict there too.
    let e = session_cfg(
        "endpoint_metrics",
        r#","scrapeCluster":"scrape","sessionCookie":"a;b""#,
        Build::Envoy,
    );
    assert!(e.unwrap_err().to_string().contains("cookie name"));
    // Plain-Envoy prefix_cache: the body is read, so the body field is taken; no TTL.
    let s = session_cfg(
        "prefix_cache",
        r#","sessionHeader":"s","sessionBodyField":"metadata.conv""#,
        Build::Envoy,
    )
    .unwrap()
    .config
    .global
    .unwrap()
    .session
    .clone()
    .unwrap();
    assert_eq!(s.body_field, Some(BodyField::Metadata("conv".into())));
    let e = session_cfg(
        "prefix_cache",
        r#","sessionHeader":"s","sessionTTL":5"#,
        Build::Envoy,
    );
    let e = e.unwrap_err().to_string();
    assert!(
        e.contains("prefix_cache in the plain-Envoy build stores no binding"),
        "{e}"
    );
    // Plain Envoy: global_least_request consistent-hashes sessions (no TTL, no body field at
    // the headers).
    let ok = session_cfg(
        "global_least_request",
        r#","sessionHeader":"s""#,
        Build::Envoy,
    );
    assert!(ok.unwrap().config.global.unwrap().session.is_some());
    let e = session_cfg(
        "global_least_request",
        r#","sessionHeader":"s","sessionTTL":5"#,
        Build::Envoy,
    );
    assert!(e.unwrap_err().to_string().contains("stores no binding"));
    let e = session_cfg(
        "global_least_request",
        r#","sessionBodyField":"user""#,
        Build::Envoy,
    );
    assert!(e
        .unwrap_err()
        .to_string()
        .contains("decides at the request headers"));
    // A cluster policy does not read them: warned, as every foreign key.
    let json = br#"{"lb_type":"cluster","lb_policy":"cluster_hash","lb_config":{"clusters":[{"cluster":"a","weight":100}],"sessionHeader":"s"}}"#;
    let parsed = parse(json, Build::Higress).unwrap();
    assert!(
        format!("{:?}", parsed.warnings).contains("sessionHeader"),
        "{:?}",
        parsed.warnings
    );
}

#[test]
fn agent_sessions_are_on_by_default_and_their_keys_strict() {
    for build in [Build::Higress, Build::Envoy] {
        for policy in ["global_least_request", "prefix_cache", "endpoint_metrics"] {
            let extra = if policy == "endpoint_metrics" && build == Build::Envoy {
                r#","scrapeCluster":"scrape""#
            } else {
                ""
            };
            let parsed = session_cfg(policy, extra, build).unwrap();
            let route = parsed.config.global.unwrap();
            assert_eq!(route.agents.as_ref().unwrap().ttl_s, 1800, "{policy}");
            assert!(route.session.is_none(), "no configured session");
            let off = format!(r#"{extra},"agentSessions":false"#);
            let route = session_cfg(policy, &off, build)
                .unwrap()
                .config
                .global
                .unwrap();
            assert!(route.agents.is_none(), "{policy}: turned off");
            let ttl = format!(r#"{extra},"agentSessionTTL":90"#);
            let parsed = session_cfg(policy, &ttl, build).unwrap();
            let agent_warned = format!("{:?}", parsed.warnings).contains("agentSession");
            assert!(!agent_warned, "{:?}", parsed.warnings);
            assert_eq!(
                parsed.config.global.unwrap().agents.as_ref().unwrap().ttl_s,
                90
            );
        }
    }
    // Its TTL follows sessionTTL unless set.
    let s = session_cfg(
        "global_least_request",
        r#","sessionHeader":"s","sessionTTL":60"#,
        Build::Higress,
    )
    .unwrap();
    assert_eq!(s.config.global.unwrap().agents.as_ref().unwrap().ttl_s, 60);
    for (extra, part) in [
        (r#","agentSessions":"no""#, "wrong type"),
        (r#","agentSessions":0"#, "wrong type"),
        (r#","agentSessionTTL":0"#, "outside 1-604800"),
        (r#","agentSessionTTL":604801"#, "outside 1-604800"),
        (r#","agentSessionTTL":-1"#, ""),
        (
            r#","agentSessions":false,"agentSessionTTL":60"#,
            "agentSessions is false",
        ),
    ] {
        let e = session_cfg("global_least_request", extra, Build::Higress)
            .unwrap_err()
            .to_string();
        assert!(e.contains("lb_config.agent"), "{extra}: {e}");
        assert!(e.contains(part), "{extra}: {e}");
    }
    // Cluster policies do not read them: warned, as every foreign key; they have none.
    let json = br#"{"lb_type":"cluster","lb_policy":"cluster_hash","lb_config":{"clusters":[{"cluster":"a","weight":100}],"agentSessions":false}}"#;
    let parsed = parse(json, Build::Higress).unwrap();
    assert!(format!("{:?}", parsed.warnings).contains("agentSessions"));
    assert!(parsed.config.global.unwrap().agents.is_none());
}
