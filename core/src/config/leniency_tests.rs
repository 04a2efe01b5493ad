//! Where Higress's Go plugin is lenient and so are we: warnings instead of errors, one per
//! field and load; whose rule refused a config; cluster policies kept from the balancer.

use super::*;
use serde_json::json;

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
fn cluster_policies_are_parsed_and_handed_to_the_balancer() {
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
    assert_eq!(
        c.select(&keys("m")).unwrap().policy.name(),
        "cluster_metrics"
    );
    assert_eq!(c.select(&keys("x")).unwrap().policy.name(), "cluster_hash");
    assert_eq!(
        c.select(&keys("m")).unwrap().publish,
        Publish::ClusterHeader {
            name: "x-higress-target-cluster".into()
        }
    );
    assert_eq!(
        c.matching(&keys("x")).unwrap().policy.name(),
        "cluster_hash"
    );
    assert_eq!(c.all().count(), 3);
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
    // One warning for the NaN, saying what is used: never "read as NaN".
    let beta: Vec<String> = parsed
        .warnings
        .iter()
        .filter(|w| w.path == "lb_config.ewma_beta")
        .map(|w| w.to_string())
        .collect();
    assert_eq!(beta.len(), 1, "{beta:?}");
    assert!(beta[0].contains("the default 0.5 is used"), "{beta:?}");
    assert!(!beta[0].contains("read as the number NaN"), "{beta:?}");
}

#[test]
fn inflight_capacity_is_ours_and_strict() {
    let cm = |extra: serde_json::Value| {
        let mut lb = json!({"mode": "AdaptiveScore", "service_list": ["a", "b"]});
        if let (Some(o), Some(e)) = (lb.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        json!({"lb_type": "cluster", "lb_policy": "cluster_metrics", "lb_config": lb})
    };
    let parsed = parse(
        cm(json!({"inflight_capacity": 8})).to_string().as_bytes(),
        Build::Higress,
    )
    .unwrap();
    let Some(PolicyConfig::ClusterMetrics(c)) = parsed.config.global.as_ref().map(|g| &g.policy)
    else {
        panic!("cluster_metrics")
    };
    assert_eq!(c.inflight_capacity, Some(8));
    assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
    for (bad, why) in [
        (json!(0), "must be between 1 and 1000000"),
        (json!(1_000_001), "must be between 1 and 1000000"),
        (json!("8"), "got a string"),
        (json!(2.5), "got a fractional number"),
        (json!(-1), "got a negative number"),
    ] {
        let e = parse(
            cm(json!({"inflight_capacity": bad})).to_string().as_bytes(),
            Build::Higress,
        )
        .expect_err(&bad.to_string())
        .to_string();
        assert!(
            e.contains("lb_config.inflight_capacity") && e.contains(why),
            "{bad}: {e}"
        );
    }
    let mut other_mode = cm(json!({"inflight_capacity": 4}));
    other_mode["lb_config"]["mode"] = "LeastBusy".into();
    let w = warnings_of(other_mode, Build::Higress);
    assert!(
        w.iter()
            .any(|w| w.contains("inflight_capacity: read only by mode AdaptiveScore")),
        "{w:?}"
    );
}
