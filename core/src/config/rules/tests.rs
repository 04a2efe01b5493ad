use super::*;
use crate::config::warning::Warnings;
use serde_json::{json, Value};

fn matcher(v: Value) -> Matcher {
    try_matcher(v).0.unwrap()
}

fn try_matcher(v: Value) -> (Result<Matcher, ConfigError>, Vec<String>) {
    let mut w = Warnings::default();
    let m = Matcher::read(&RawRoute::from_value(&v), &mut Reader::new("", &mut w));
    (m, w.into_vec().iter().map(|w| w.to_string()).collect())
}

fn keys<'a>(route: &'a str, cluster: &'a str, authority: &'a str) -> RequestKeys<'a> {
    RequestKeys {
        route: Some(route),
        cluster: Some(cluster),
        authority: Some(authority),
    }
}

#[test]
fn matches_each_category() {
    let c = "outbound|8000||llm.default.svc.cluster.local";
    let k = keys("default/chat", c, "api.example.com:443");
    assert!(matcher(json!({"_match_route_": ["x", "default/chat"]})).matches(&k));
    assert!(!matcher(json!({"_match_route_": ["default/cha"]})).matches(&k));
    assert!(matcher(json!({"_match_route_prefix_": ["default/"]})).matches(&k));
    assert!(matcher(json!({"_match_domain_": ["*.example.com"]})).matches(&k));
    assert!(matcher(json!({"_match_domain_": ["api.*"]})).matches(&k));
    assert!(matcher(json!({"_match_domain_": ["api.example.com"]})).matches(&k));
    assert!(!matcher(json!({"_match_domain_": ["example.com"]})).matches(&k));
    // Go compares hosts exactly (case-sensitive).
    assert!(!matcher(json!({"_match_domain_": ["API.example.com"]})).matches(&k));
    assert!(matcher(json!({"_match_service_": ["llm.default.svc.cluster.local"]})).matches(&k));
    assert!(
        matcher(json!({"_match_service_": ["llm.default.svc.cluster.local:8000"]})).matches(&k)
    );
    assert!(
        !matcher(json!({"_match_service_": ["llm.default.svc.cluster.local:9000"]})).matches(&k)
    );
    // Route and service: both must match.
    assert!(
        !matcher(json!({"_match_route_": ["default/chat"], "_match_service_": ["other"]}))
            .matches(&k)
    );
    assert!(!matcher(json!({"_match_service_": ["llm"]})).matches(&keys(
        "r",
        "not-a-cluster-name",
        "h"
    )));
}

#[test]
fn a_rule_has_one_category_as_in_go() {
    let k = keys("default/chat", "outbound|80||a.svc", "x.example.com");
    // Route and domain: only the route list counts (the domain would match).
    let (m, w) =
        try_matcher(json!({"_match_route_": ["other"], "_match_domain_": ["*.example.com"]}));
    assert!(!m.unwrap().matches(&k));
    assert!(
        w.iter().any(|w| w.starts_with("_match_domain_: ignored")),
        "{w:?}"
    );
    // Domain and service: only the domain list counts.
    let m = matcher(json!({"_match_domain_": ["*.example.com"], "_match_service_": ["b.svc"]}));
    assert!(m.matches(&k));
    // Service and prefix: only the service list counts.
    let m = matcher(json!({"_match_service_": ["b.svc"], "_match_route_prefix_": ["default/"]}));
    assert!(!m.matches(&k));
}

#[test]
fn strips_ports_as_go_does() {
    assert_eq!(strip_port("a.b:80"), "a.b");
    assert_eq!(strip_port("a.b"), "a.b");
    assert_eq!(strip_port("[::1]:80"), "[::1]");
    assert_eq!(strip_port("[::1]"), "[::1]");
}

#[test]
fn lists_read_like_gjson() {
    let k = keys("r", "c", "h");
    // A single string is a one-item list; a number is its text.
    let (m, w) = try_matcher(json!({"_match_route_": "r"}));
    assert!(m.unwrap().matches(&k));
    assert!(
        w[0].starts_with("_match_route_: a string instead of a list"),
        "{w:?}"
    );
    assert!(matcher(json!({"_match_route_": [7]})).matches(&keys("7", "c", "h")));
    // Empty route names are dropped, so a rule of only those has no match list.
    for v in [
        json!({}),
        json!({"_match_route_": [""]}),
        json!({"_match_route_": null}),
    ] {
        let err = try_matcher(v.clone()).0.unwrap_err();
        assert!(err.problem.contains("a rule needs"), "{v}: {err}");
    }
    // An empty domain is kept and matches an empty authority only.
    let m = matcher(json!({"_match_domain_": [""]}));
    assert!(m.matches(&keys("r", "c", "")));
    assert!(!m.matches(&k));
}
