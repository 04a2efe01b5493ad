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

/// Parses a shipped example: it must be accepted, and without a single warning.
fn parse(v: &Value) -> PluginConfig {
    parse_bytes(v.to_string().as_bytes())
}

fn parse_bytes(bytes: &[u8]) -> PluginConfig {
    let parsed = ailb_core::config::parse(bytes, Build::Higress)
        .unwrap_or_else(|e| panic!("{e}\n{}", String::from_utf8_lossy(bytes)));
    assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
    parsed.config
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
    // The schema and the parser must agree on names, types and which policy reads a key: each
    // key with its default (or example) under each of its policies is accepted without warning.
    let spec = yaml("spec.yaml");
    let props = spec["spec"]["configSchema"]["openAPIV3Schema"]["properties"]["lb_config"]
        ["properties"]
        .as_object()
        .unwrap()
        .clone();
    assert!(props.len() >= 30);
    for (key, p) in props {
        let value = p
            .get("default")
            .or_else(|| p.get("example"))
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
            let mut cfg = json!({"lb_policy": policy});
            match policy {
                "global_least_request" | "prefix_cache" if !envoy => {
                    lb.insert("serviceFQDN".into(), json!("redis.static"));
                    lb.insert("servicePort".into(), json!(6379));
                }
                "cluster_metrics" => {
                    cfg["lb_type"] = json!("cluster");
                    lb.insert("mode".into(), json!("AdaptiveScore"));
                    lb.insert("service_list".into(), json!(["outbound|80||a.static"]));
                }
                "cluster_hash" => {
                    cfg["lb_type"] = json!("cluster");
                    let one = json!([{"cluster": "outbound|80||a.static", "weight": 100}]);
                    lb.insert("clusters".into(), one);
                }
                _ => {}
            }
            if envoy {
                lb.insert("endpoints".into(), json!(["10.0.0.1:8000"]));
            }
            // A key that only means something with others (priority classes) names them.
            if let Some(companions) = p["x-requires"].as_object() {
                lb.extend(companions.clone());
            }
            lb.insert(key.clone(), value.clone());
            cfg["lb_config"] = Value::Object(lb);
            let build = if envoy { Build::Envoy } else { Build::Higress };
            let parsed = ailb_core::config::parse(cfg.to_string().as_bytes(), build)
                .unwrap_or_else(|e| panic!("schema key {key} ({policy}): {e}"));
            // Expected beside prefix_cache: Higress's Go prefix_cache ignores maxRequestCount,
            // which caps here (plugin-config/compat/meaning-prefix-cache-max-request-count.yaml).
            let warnings: Vec<_> = parsed
                .warnings
                .iter()
                .filter(|w| !(policy == "prefix_cache" && w.path == "lb_config.maxRequestCount"))
                .collect();
            assert!(
                warnings.is_empty(),
                "schema key {key} ({policy}): {:?}",
                warnings
            );
        }
    }
}

#[test]
fn it_parses_the_console_route_example() {
    let cfg = parse(&yaml("route-example.yaml"));
    assert_eq!(cfg.global.unwrap().common.max_load, 32);
}

#[test]
fn it_parses_the_wasmplugin_resource_as_the_controller_sends_it() {
    // Converted as the Higress controller does (the same code check-config uses).
    let cr = yaml("wasmplugin.yaml");
    let cfg = parse(&ailb_core::config::wasm_plugin(&cr["spec"]).unwrap());
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
    assert_eq!(cfg.select(&service).unwrap().common.max_load, 200_000);
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
        parse_bytes(&bytes);
    }
}

#[test]
fn cluster_examples_are_accepted_and_the_envoyfilter_reads_their_header() {
    for name in ["cluster-metrics-example.yaml", "cluster-hash-example.yaml"] {
        for build in [Build::Higress, Build::Envoy] {
            let bytes = yaml(name).to_string();
            let parsed = ailb_core::config::parse(bytes.as_bytes(), build)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(parsed.warnings.is_empty(), "{name}: {:?}", parsed.warnings);
            let c = parsed.config.select(&RequestKeys::default()).unwrap();
            assert!(c.policy.is_cluster() && c.decide_at_headers, "{name}");
            assert_eq!(
                c.publish,
                ailb_core::config::Publish::ClusterHeader {
                    name: "x-higress-target-cluster".into()
                }
            );
        }
    }
    let filter = yaml("cluster-envoyfilter.yaml");
    assert_eq!(filter["kind"], "EnvoyFilter");
    let patch = &filter["spec"]["configPatches"][0];
    assert_eq!(patch["applyTo"], "HTTP_ROUTE");
    assert_eq!(patch["match"]["context"], "GATEWAY");
    assert_eq!(patch["patch"]["operation"], "MERGE");
    assert_eq!(
        patch["patch"]["value"]["route"]["cluster_header"],
        "x-higress-target-cluster"
    );
}

/// Envoy's `per_connection_buffer_limit_bytes` when a listener sets none.
const DEFAULT_BUFFER_LIMIT: u64 = 1 << 20;

/// What bounds a held body under one wasm filter: the listener's
/// `per_connection_buffer_limit_bytes` (the most one read delivers), and the request body
/// buffer of its HCM's routes (the least `request_body_buffer_limit`, the listener's limit for
/// a route without one).
#[derive(Clone, Copy)]
struct Limits {
    read: u64,
    body: u64,
}

/// Every wasm filter config (`envoy.extensions.filters.http.wasm.v3.Wasm`) under `v`, with the
/// [`Limits`] it sits under.
fn wasm_filters(v: &Value, limits: Limits, out: &mut Vec<(Value, Limits)>) {
    let mut limits = limits;
    if let Some(read) = v["per_connection_buffer_limit_bytes"].as_u64() {
        limits = Limits { read, body: read };
    }
    if let Some(hosts) = v["route_config"]["virtual_hosts"].as_array() {
        let routes = hosts
            .iter()
            .filter_map(|h| h["routes"].as_array())
            .flatten();
        limits.body = routes
            .map(|r| {
                r["request_body_buffer_limit"]
                    .as_u64()
                    .unwrap_or(limits.read)
            })
            .min()
            .unwrap_or(limits.read);
    }
    match v {
        Value::Object(m) => {
            let wasm = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
            if m.get("@type").and_then(Value::as_str) == Some(wasm) {
                out.push((m["config"].clone(), limits));
            }
            for child in m.values() {
                wasm_filters(child, limits, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|c| wasm_filters(c, limits, out)),
        _ => {}
    }
}

#[test]
fn envoy_configs_let_the_plugin_read_the_body_it_holds_for() {
    // `envoy --mode validate` (make e2e-test) runs the plugin's parser but not its warnings,
    // nor these rules (docs/plain-envoy.md): a filter whose routes hold for the body sets
    // allow_on_headers_stop_iteration, and its routes' body buffer leaves two whole reads above
    // maxBodyBytes, so an oversized body is balanced unread instead of refused with 413 (a held
    // body grows by whole reads before the plugin sees them: docs/higress-abi.md §10).
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../envoy"));
    let mut holding = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let y: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let mut filters = Vec::new();
        let default = Limits {
            read: DEFAULT_BUFFER_LIMIT,
            body: DEFAULT_BUFFER_LIMIT,
        };
        wasm_filters(&serde_json::to_value(y).unwrap(), default, &mut filters);
        assert_eq!(filters.len(), 1, "{}", path.display());
        for (filter, limits) in filters {
            let plugin = filter["configuration"]["value"].as_str().unwrap();
            let parsed = ailb_core::config::parse(plugin.as_bytes(), Build::Envoy)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(
                parsed.warnings.is_empty(),
                "{}: {:?}",
                path.display(),
                parsed.warnings
            );
            for c in parsed.config.all() {
                if c.decide_at_headers {
                    continue;
                }
                holding.push(path.file_name().unwrap().to_owned());
                assert_eq!(
                    filter["allow_on_headers_stop_iteration"],
                    true,
                    "{}",
                    path.display()
                );
                let needed = c.common.max_body_bytes as u64 + 2 * limits.read;
                assert!(
                    limits.body >= needed,
                    "{}: body buffer {} for maxBodyBytes {} and reads of {}",
                    path.display(),
                    limits.body,
                    c.common.max_body_bytes,
                    limits.read
                );
            }
        }
    }
    assert!(
        holding.iter().any(|f| f == "envoy-prefix-cache.yaml"),
        "{holding:?}"
    );
}

#[test]
fn each_envoy_example_tells_to_run_itself() {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../envoy"));
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let name = path.file_name().unwrap().to_str().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let runs: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with('#') && l.contains("envoy -c "))
            .collect();
        assert!(!runs.is_empty(), "{name} says how to run it");
        for line in runs {
            assert!(
                line.contains(&format!("envoy -c envoy/{name} ")),
                "{name}: {line}"
            );
        }
        seen += 1;
    }
    assert!(seen >= 4, "the envoy/ examples were found");
}
