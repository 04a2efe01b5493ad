//! Keys of Higress's open pull requests that users already write (issue 39 item 7), read as
//! each PR's Go code reads them: cluster_hash's `key` block (#3921), the rate-limit window
//! `window_size` / `window_seconds` (#4260), `engine` (#4043). Before, each was an unknown key,
//! ignored with a warning: a cookie or body key hashed `x-mse-consumer` instead.

use super::*;
use serde_json::json;

fn hash(key: serde_json::Value) -> Result<ClusterHashConfig, String> {
    let cfg = json!({"lb_type": "cluster", "lb_policy": "cluster_hash", "lb_config": {
        "clusters": [{"cluster": "outbound|80||a.static", "weight": 100}], "key": key}});
    let parsed = parse(cfg.to_string().as_bytes(), Build::Higress).map_err(|e| e.to_string())?;
    let warnings: Vec<String> = parsed.warnings.iter().map(|w| w.to_string()).collect();
    assert!(
        warnings
            .iter()
            .all(|w| !w.contains("lb_config.key: unknown key")),
        "{warnings:?}"
    );
    match parsed.config.global.as_ref().map(|g| g.policy.clone()) {
        Some(PolicyConfig::ClusterHash(h)) => Ok(h),
        other => Err(format!("{other:?}")),
    }
}

#[test]
fn the_key_block_names_where_the_key_comes_from() {
    let k = |v| hash(v).unwrap().key;
    assert_eq!(
        k(json!({"source": "cookie", "name": "sid"})),
        HashKey::Cookie("sid".into())
    );
    assert_eq!(
        k(json!({"source": "body", "jsonPath": " $.callOptions.stickySessionId "})),
        HashKey::Body {
            path: vec!["callOptions".into(), "stickySessionId".into()],
            max_body_bytes: DEFAULT_KEY_MAX_BODY_BYTES
        }
    );
    assert_eq!(
        k(json!({"source": "body", "json_path": "a.0", "max_body_bytes": "4096"})),
        HashKey::Body {
            path: vec!["a".into(), "0".into()],
            max_body_bytes: 4096
        }
    );
    assert_eq!(
        k(json!({"source": "metadata", "property_path": ["filter", "", "k"]})),
        HashKey::Metadata(vec!["filter".into(), "k".into()])
    );
    assert_eq!(
        k(json!({"source": "metadata", "name": "k"})),
        HashKey::Metadata(vec!["metadata".into(), "k".into()])
    );
    assert_eq!(k(json!({"name": "x-s"})), HashKey::Header("x-s".into()));
    assert_eq!(k(json!(null)), HashKey::Header("x-mse-consumer".into()));
    let h = hash(json!({"source": "header"})).unwrap();
    assert!(h.key_block);
    assert_eq!(h.key, HashKey::Header("x-mse-consumer".into()));
    // A body key holds the request for its body; the others decide at the headers.
    let cfg = br#"{"lb_type":"cluster","lb_policy":"cluster_hash","lb_config":{"clusters":[{"cluster":"a","weight":100}],"key":{"source":"body","jsonPath":"id"}}}"#;
    let body = parse(cfg, Build::Higress).unwrap().config.global.unwrap();
    assert!(!body.decide_at_headers);
    assert_eq!(body.common.max_body_bytes, 100 << 20);
    // Plain Envoy holds it too, with its usual wait for a body it may withhold.
    let envoy = parse(cfg, Build::Envoy).unwrap().config.global.unwrap();
    assert!(!envoy.decide_at_headers);
    assert_eq!(envoy.common.max_body_wait_ms, 1000);
    let cfg = br#"{"lb_type":"cluster","lb_policy":"cluster_hash","lb_config":{"clusters":[{"cluster":"a","weight":100}],"key":{"source":"cookie","name":"s"}}}"#;
    assert!(
        parse(cfg, Build::Higress)
            .unwrap()
            .config
            .global
            .unwrap()
            .decide_at_headers
    );
}

#[test]
fn a_key_block_the_pr_refuses_is_refused_with_its_text() {
    for (key, want) in [
        (
            json!({"source": "cookie"}),
            "lb_config.key.name: key.name is required when key.source is cookie",
        ),
        (
            json!({"source": "body", "jsonPath": "$"}),
            "lb_config.key.jsonPath: key.jsonPath is required when key.source is body",
        ),
        (
            json!({"source": "metadata", "propertyPath": []}),
            "key.name or key.propertyPath is required when key.source is metadata",
        ),
        (
            json!({"source": "query", "name": "q"}),
            "lb_config.key.source: unsupported key.source \"query\"",
        ),
        (
            json!({"source": "body", "jsonPath": "a", "max_body_bytes": 5_000_000_000u64}),
            "key.max_body_bytes exceeds uint32 limit",
        ),
        // Ours: a path this plugin would read otherwise than gjson.
        (
            json!({"source": "body", "jsonPath": "messages.#.content"}),
            "lb_config.key.jsonPath: `messages.#.content`: a part starting with `#`: gjson syntax",
        ),
    ] {
        let e = hash(key.clone()).unwrap_err();
        assert!(e.contains(want), "{key}: {e}");
    }
}

#[test]
fn the_rate_limit_window_keys_shape_the_window() {
    let m = |lb: serde_json::Value| {
        let cfg = json!({"lb_policy": "endpoint_metrics", "lb_config": lb});
        let parsed = parse(cfg.to_string().as_bytes(), Build::Higress).unwrap();
        let warnings: Vec<String> = parsed.warnings.iter().map(|w| w.to_string()).collect();
        match parsed.config.global.map(|g| g.policy.clone()) {
            Some(PolicyConfig::EndpointMetrics(m)) => (
                m.scheduler.rate_window,
                m.scheduler.rate_window_ms,
                warnings,
            ),
            other => panic!("{other:?}"),
        }
    };
    let (size, ms, w) = m(json!({"rate_limit": 0.5}));
    assert_eq!((size, ms), (100, None), "the released plugin's window");
    assert!(w.is_empty(), "{w:?}");
    let (size, ms, w) = m(json!({"rate_limit": 0.5, "window_size": 50, "window_seconds": "30"}));
    assert_eq!((size, ms), (50, Some(30_000)));
    assert!(w.iter().all(|w| !w.contains("unknown key")), "{w:?}");
    assert_eq!(m(json!({"window_size": 0})).0, 100);
    assert_eq!(
        m(json!({"window_size": 20})).1,
        Some(60_000),
        "the PR's 60 s"
    );
    let (size, _, w) = m(json!({"window_size": 1_000_000}));
    assert_eq!(size, 10_000);
    assert!(
        w.iter()
            .any(|w| w.contains("window_size: 1000000 decisions")),
        "{w:?}"
    );
    // `engine`: read as the PR names it; an unknown one is said.
    assert!(m(json!({"engine": "sglang"})).2.is_empty());
    let (_, _, w) = m(json!({"engine": "tgi"}));
    assert!(
        w.iter()
            .any(|w| w.contains("lb_config.engine: unknown value `tgi`")),
        "{w:?}"
    );
}
