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
    assert_eq!(g.max_load, 0);
    assert_eq!(g.lease_ttl_ms, 600_000);
    assert_eq!(g.cost, CostMode::Requests);
    assert_eq!(g.failure_mode, FailureMode::Allow);
    assert_eq!(g.debug_header, None);
    assert_eq!(g.key_prefix, "ailb");
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
    assert_eq!(g.max_load, 64);
    assert_eq!(g.lease_ttl_ms, 300_000);
    assert_eq!(g.debug_header.as_deref(), Some("x-ai-lb-debug"));
    assert_eq!(g.max_body_bytes, 4_194_304);
    assert!(!g.detail_log);
    assert_eq!(cfg.rules.len(), 2);
    assert_eq!(cfg.rules[0].1.failure_mode, FailureMode::Deny);
    assert_eq!(cfg.rules[1].1.cost, CostMode::Tokens);
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
        (c.failure_mode, c.cost)
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

fn warnings_of(v: serde_json::Value, build: Build) -> Vec<String> {
    let parsed = parse(v.to_string().as_bytes(), build).unwrap_or_else(|e| panic!("{v}: {e}"));
    parsed.warnings.iter().map(|w| w.to_string()).collect()
}

#[test]
fn endpoint_metrics_keys_go_accepts_are_warnings() {
    // Each of these was refused before; Higress's Go plugin accepts them (corpus files
    // range-metric-policy-*, range-rate-limit-*, leftover-*).
    for (lb, path) in [
        (
            json!({"metric_policy": "fastest"}),
            "lb_config.metric_policy: unknown value `fastest`",
        ),
        (
            json!({"metric_policy": "least"}),
            "lb_config.metric_policy: least/most without",
        ),
        (
            json!({"metric_policy": "most", "target_metric": "not a name"}),
            "lb_config.target_metric: `not a name` is not a Prometheus metric name",
        ),
        (
            json!({"rate_limit": 0}),
            "lb_config.rate_limit: 0 is not a share",
        ),
        (
            json!({"rate_limit": 1.5}),
            "lb_config.rate_limit: 1.5 is above 1",
        ),
        (
            json!({"serviceFQDN": "redis.static"}),
            "lb_config.serviceFQDN: not read by endpoint_metrics",
        ),
        (
            json!({"unknownKey": 1}),
            "lb_config.unknownKey: unknown key: ignored",
        ),
    ] {
        let cfg = json!({"lb_policy": "endpoint_metrics", "lb_config": lb});
        let w = warnings_of(cfg.clone(), Build::Higress);
        assert!(w.iter().any(|w| w.starts_with(path)), "{cfg}: {w:?}");
    }
    // The plain-Envoy build has no Redis: its keys stay an error there.
    let cfg = json!({"lb_policy": "endpoint_metrics",
        "lb_config": {"endpoints": ["10.0.0.1:80"], "scrapeCluster": "c", "servicePort": 1}});
    let err = parse(cfg.to_string().as_bytes(), Build::Envoy).unwrap_err();
    assert_eq!(
        (err.path.as_str(), err.kind),
        ("lb_config.servicePort", ErrorKind::Strict)
    );
}

#[test]
fn one_warning_per_field_and_load() {
    let cfg = json!({
        "lb_policy": "endpoint_metrics", "lb_config": {"rate_limit": "0.5"}, "lbtype": 1,
        "_rules_": [{"_match_route_": ["a"], "lb_policy": "endpoint_metrics", "lb_config": {"rate_limit": "0.5"}}]
    });
    let w = warnings_of(cfg, Build::Higress);
    assert_eq!(
        w,
        vec![
            "lbtype: unknown key: ignored, as Higress ignores it; did you mean `lb_type`?",
            "lb_config.rate_limit: a string, read as the number 0.5 (as Higress reads it)",
            "_rules_[0].lb_config.rate_limit: a string, read as the number 0.5 (as Higress reads it)",
        ]
    );
}

#[test]
fn errors_say_whose_rule_refused() {
    let kind = |json: &[u8]| parse(json, Build::Higress).unwrap_err().kind;
    assert_eq!(kind(b"{"), ErrorKind::Syntax);
    assert_eq!(kind(br#"{"lb_policy": "least_busy"}"#), ErrorKind::Higress);
    assert_eq!(kind(b""), ErrorKind::Higress);
    assert_eq!(
        kind(br#"{"lb_policy": "endpoint_metrics", "lb_config": {"leaseTTL": 0}}"#),
        ErrorKind::Strict
    );
}

#[test]
fn cluster_policies_are_parsed_but_not_handed_to_the_balancer() {
    let cfg = json!({
        "lb_type": "cluster", "lb_policy": "cluster_hash",
        "lb_config": {"clusters": [{"cluster": "outbound|80||a.static", "weight": 100}]},
        "_rules_": [
            {"_match_route_": ["r"], "lb_policy": "endpoint_metrics"},
            {"_match_route_": ["m"], "lb_type": "cluster", "lb_policy": "cluster_metrics",
             "lb_config": {"mode": "AdaptiveScore", "service_list": ["a", "b"],
                           "global_inflight_enabled": true, "serviceFQDN": "redis.static",
                           "servicePort": 6379, "password": "p", "global_inflight_timeout": 500}}
        ]
    });
    let parsed = parse(cfg.to_string().as_bytes(), Build::Higress).unwrap();
    let c = &parsed.config;
    let keys = |route| RequestKeys {
        route: Some(route),
        ..Default::default()
    };
    assert_eq!(
        c.select(&keys("r")).unwrap().policy.name(),
        "endpoint_metrics"
    );
    assert!(c.select(&keys("m")).is_none() && c.select(&keys("x")).is_none());
    assert_eq!(
        c.matching(&keys("x")).unwrap().policy.name(),
        "cluster_hash"
    );
    assert_eq!(c.all().count(), 1);
    assert_eq!(c.routes().count(), 3);
    assert_eq!(
        c.summary(),
        "global=true rules=2 policies=[cluster_hash,endpoint_metrics,cluster_metrics]"
    );
    let m = c.matching(&keys("m")).unwrap();
    let PolicyConfig::ClusterMetrics(cm) = &m.policy else {
        panic!("{m:?}")
    };
    let g = cm.global_inflight.as_ref().unwrap();
    assert_eq!(
        (g.redis.timeout_ms, g.key_prefix.as_str(), g.key_ttl_s),
        (500, "higress:adaptive_score_inflight", 1800)
    );
    assert_eq!(m.redis.as_ref(), Some(&g.redis));
    assert!(m.decide_at_headers);
    // The plain-Envoy build has no Redis: the count stays per proxy, with a warning.
    let mut cfg = cfg;
    cfg["_rules_"][0]["lb_config"] = json!({"endpoints": ["10.0.0.1:80"], "scrapeCluster": "c"});
    let parsed = parse(cfg.to_string().as_bytes(), Build::Envoy).unwrap();
    let m = parsed.config.matching(&keys("m")).unwrap().clone();
    let PolicyConfig::ClusterMetrics(cm) = &m.policy else {
        panic!()
    };
    assert!(cm.global_inflight.is_none() && m.redis.is_none());
    assert!(parsed
        .warnings
        .iter()
        .any(|w| w.path == "_rules_[1].lb_config.global_inflight_enabled"));
}

#[test]
fn cluster_metrics_nan_and_duplicates() {
    let cfg = json!({"lb_type": "cluster", "lb_policy": "cluster_metrics",
        "lb_config": {"ewma_beta": "NaN", "service_list": ["a", 7, "a", ""]}});
    let parsed = parse(cfg.to_string().as_bytes(), Build::Higress).unwrap();
    let PolicyConfig::ClusterMetrics(cm) = &parsed.config.global.as_ref().unwrap().policy else {
        panic!()
    };
    assert_eq!(cm.ewma_beta, 0.5);
    assert_eq!(cm.service_list, ["a", "7", "a", ""]);
    let paths: Vec<&str> = parsed.warnings.iter().map(|w| w.path.as_str()).collect();
    for p in [
        "lb_config.ewma_beta",
        "lb_config.service_list[1]",
        "lb_config.service_list[2]",
        "lb_config.service_list[3]",
        "lb_config.mode",
    ] {
        assert!(paths.contains(&p), "{p}: {:?}", parsed.warnings);
    }
}
