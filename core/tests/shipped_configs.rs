//! Every configuration example we ship is parsed by the plugin's own parser.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ailb_core::config::{Build, PluginConfig, RequestKeys};
use serde_json::{json, Map, Value};
use std::path::Path;

fn yaml(name: &str) -> Value {
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .join("plugin-config")
        .join(name);
    let y: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    serde_json::to_value(y).unwrap()
}

fn parse(v: &Value) -> PluginConfig {
    PluginConfig::parse(v.to_string().as_bytes()).unwrap_or_else(|e| panic!("{e}\n{v:#}"))
}

#[test]
fn it_parses_the_spec_example() {
    let spec = yaml("spec.yaml");
    let schema = &spec["spec"]["configSchema"]["openAPIV3Schema"];
    assert_eq!(spec["spec"]["priority"], 50);
    parse(&schema["example"]);
}

#[test]
fn it_accepts_every_schema_key_with_its_default() {
    // The schema and the parser must agree on names and types.
    let spec = yaml("spec.yaml");
    let props = spec["spec"]["configSchema"]["openAPIV3Schema"]["properties"]["lb_config"]
        ["properties"]
        .as_object()
        .unwrap()
        .clone();
    assert!(props.len() >= 15);
    for (key, p) in props {
        let value = p
            .get("default")
            .cloned()
            .unwrap_or_else(|| match p["type"].as_str() {
                Some("integer") => json!(6379),
                Some("boolean") => json!(true),
                Some("array") => json!(["10.0.0.1:8000"]),
                _ => json!("x-ai-lb-debug"),
            });
        // Policy-specific keys name their policies; the rest apply to every Redis policy.
        let policies: Vec<&str> = p["x-policies"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_else(|| vec!["global_least_request", "prefix_cache"]);
        let envoy = p["x-build"].as_str() == Some("envoy");
        for policy in policies {
            let mut lb = Map::new();
            let redis = policy != "endpoint_metrics" && !envoy;
            if redis {
                lb.insert("serviceFQDN".into(), json!("redis.static"));
                lb.insert("servicePort".into(), json!(6379));
            }
            if envoy {
                lb.insert("endpoints".into(), json!(["10.0.0.1:8000"]));
            }
            lb.insert(key.clone(), value.clone());
            let cfg = json!({"lb_policy": policy, "lb_config": lb});
            let build = if envoy { Build::Envoy } else { Build::Higress };
            PluginConfig::parse_for(cfg.to_string().as_bytes(), build)
                .unwrap_or_else(|e| panic!("schema key {key} ({policy}): {e}"));
        }
    }
}

#[test]
fn it_parses_the_console_route_example() {
    let cfg = parse(&yaml("route-example.yaml"));
    assert_eq!(cfg.global.unwrap().max_load, 32);
}

/// Builds the plugin JSON from a WasmPlugin resource the way the Higress controller does
/// (docs/higress-abi.md §11): defaultConfig unless disabled, one `_rules_` entry per matchRule.
fn controller_json(cr: &Value) -> Value {
    let spec = &cr["spec"];
    let mut top = if spec["defaultConfigDisable"].as_bool().unwrap_or(false) {
        Map::new()
    } else {
        spec["defaultConfig"]
            .as_object()
            .cloned()
            .unwrap_or_default()
    };
    let rules: Vec<Value> = spec["matchRules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let mut c = r["config"].as_object().cloned().unwrap();
            for (from, to) in [
                ("ingress", "_match_route_"),
                ("domain", "_match_domain_"),
                ("service", "_match_service_"),
            ] {
                if let Some(list) = r.get(from) {
                    c.insert(to.into(), list.clone());
                }
            }
            Value::Object(c)
        })
        .collect();
    top.insert("_rules_".into(), Value::Array(rules));
    Value::Object(top)
}

#[test]
fn it_parses_the_wasmplugin_resource_as_the_controller_sends_it() {
    let cfg = parse(&controller_json(&yaml("wasmplugin.yaml")));
    assert!(cfg.global.is_none());
    assert_eq!(cfg.rules.len(), 2);
    let route = RequestKeys {
        route: Some("default/chat"),
        ..Default::default()
    };
    assert_eq!(
        cfg.select(&route)
            .unwrap()
            .redis
            .as_ref()
            .unwrap()
            .timeout_ms,
        500
    );
    let service = RequestKeys {
        cluster: Some("outbound|8000||llm-batch.default.svc.cluster.local"),
        ..Default::default()
    };
    assert_eq!(cfg.select(&service).unwrap().max_load, 200_000);
    let other = RequestKeys {
        route: Some("default/other"),
        ..Default::default()
    };
    assert!(cfg.select(&other).is_none());
}

#[test]
fn it_parses_the_json_examples() {
    for name in ["minimal.json", "full.json"] {
        let bytes = std::fs::read(
            Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
                .join("plugin-config")
                .join(name),
        )
        .unwrap();
        PluginConfig::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}
