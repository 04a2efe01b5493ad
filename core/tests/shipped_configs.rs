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

/// `lb_config`'s properties in spec.yaml's configSchema.
fn schema_keys() -> Map<String, Value> {
    let spec = yaml("spec.yaml");
    let schema = &spec["spec"]["configSchema"]["openAPIV3Schema"];
    schema["properties"]["lb_config"]["properties"]
        .as_object()
        .unwrap()
        .clone()
}

/// The parser's own key list (`ailb_core::config::LB_CONFIG_KEYS`), each key with its Rust
/// type without spaces (`Go` for Higress's leniently read keys).
fn parser_keys() -> Vec<(String, String)> {
    ailb_core::config::LB_CONFIG_KEYS
        .iter()
        .map(|(k, ty)| (k.to_string(), ty.replace(' ', "")))
        .collect()
}

/// The schema type an `Own<T>` key must have (Higress's `Go` keys: whatever the schema says).
fn schema_type_of(rust: &str) -> Option<(&'static str, Option<&'static str>)> {
    let inner = rust.strip_prefix("Own<")?.strip_suffix('>')?;
    Some(match inner {
        "u64" | "u32" | "u16" => ("integer", None),
        "f64" => ("number", None),
        "bool" => ("boolean", None),
        "String" => ("string", None),
        "Vec<String>" => ("array", Some("string")),
        "std::collections::BTreeMap<String,f64>" => ("object", Some("number")),
        "std::collections::BTreeMap<String,String>" => ("object", Some("string")),
        "Value" => ("object", None),
        other => panic!("raw.rs type {other}: add its schema type here"),
    })
}

#[test]
fn the_schema_names_exactly_the_parsers_keys_with_their_types() {
    let schema = schema_keys();
    let parser = parser_keys();
    assert!(parser.len() >= 80, "{}", parser.len());
    let mut missing: Vec<&str> = parser
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| !schema.contains_key(*k))
        .collect();
    missing.sort();
    assert!(
        missing.is_empty(),
        "spec.yaml lacks parser keys {missing:?}"
    );
    let extra: Vec<&String> = schema
        .keys()
        .filter(|k| !parser.iter().any(|(p, _)| p == *k))
        .collect();
    assert!(
        extra.is_empty(),
        "spec.yaml has keys the parser does not know: {extra:?}"
    );
    for (key, rust) in &parser {
        let p = &schema[key];
        let ty = p["type"]
            .as_str()
            .unwrap_or_else(|| panic!("{key}: no type"));
        assert!(
            ["string", "integer", "number", "boolean", "array", "object"].contains(&ty),
            "{key}: {ty}"
        );
        if let Some((want, inner)) = schema_type_of(rust) {
            assert_eq!(ty, want, "{key} is {rust} in the parser");
            match (want, inner) {
                ("array", Some(t)) => assert_eq!(p["items"]["type"], t, "{key} items"),
                ("object", Some(t)) => {
                    assert_eq!(p["additionalProperties"]["type"], t, "{key} values")
                }
                _ => {}
            }
        }
        // Higress's spec format: a title and description in English and Chinese.
        for field in ["title", "description"] {
            assert!(p[field].is_string(), "{key}: no {field}");
            let i18n = format!("x-{field}-i18n");
            assert!(p[&i18n]["zh-CN"].is_string(), "{key}: no {i18n}.zh-CN");
        }
        for own in ["x-policies", "x-requires", "x-build"] {
            assert!(
                p.get(own).is_none(),
                "{key}: {own} is not Higress's spec format"
            );
        }
    }
}

#[test]
fn the_spec_is_in_higress_format() {
    let spec = yaml("spec.yaml");
    let info = &spec["info"];
    assert_eq!(info["type"], "oss");
    assert_eq!(info["name"], "ai-load-balancer");
    assert_eq!(info["category"], "ai");
    for key in [
        "image",
        "readmeUrl",
        "title",
        "description",
        "iconUrl",
        "version",
    ] {
        assert!(info[key].is_string(), "info.{key}");
    }
    assert!(info["x-title-i18n"]["zh-CN"].is_string());
    assert!(info["x-description-i18n"]["zh-CN"].is_string());
    assert!(info["x-readmeUrl-i18n"]["en-US"].is_string());
    // The console opens readmeUrl as a link, so a path relative to nothing opens nothing;
    // Higress's specs give https URLs. Ours name the READMEs the image carries, where the
    // maintainers (info.contact.url) publish them.
    let home = info["contact"]["url"].as_str().unwrap();
    for (url, file) in [
        (&info["readmeUrl"], "README.md"),
        (&info["x-readmeUrl-i18n"]["en-US"], "README_EN.md"),
    ] {
        let url = url.as_str().unwrap();
        assert!(
            url.starts_with(&format!("{home}/"))
                && url.ends_with(&format!("/plugin-config/{file}")),
            "{url} is not an https URL of plugin-config/{file} under {home}"
        );
    }
    assert!(home.starts_with("https://"), "{home}");
    assert_eq!(spec["spec"]["phase"], "UNSPECIFIED_PHASE");
    let global = &spec["spec"]["configSchema"]["openAPIV3Schema"];
    // Higress's plugins give routes the global schema (the console uses only configSchema).
    assert_eq!(
        &spec["spec"]["routeConfigSchema"]["openAPIV3Schema"],
        global
    );
    let mut top: Vec<&String> = global["properties"].as_object().unwrap().keys().collect();
    top.sort();
    assert_eq!(top, ["lb_config", "lb_policy", "lb_type"]);
    parse(&global["example"]);
}

/// Configs in which a key of `policy` can be read: the policy's required keys, and the keys
/// other keys only mean something beside (priority classes, the queue, sessions, tenants,
/// scraping, the weighted policy, the global in-flight count).
fn contexts(policy: &str, build: Build) -> Vec<Value> {
    let mut base = json!({"lb_policy": policy, "lb_config": {}});
    let redis = json!({"serviceFQDN": "redis.static", "servicePort": 6379});
    let lb = base["lb_config"].as_object_mut().unwrap();
    match (policy, build) {
        ("global_least_request" | "prefix_cache", Build::Higress) => {
            lb.extend(redis.as_object().unwrap().clone())
        }
        ("global_least_request" | "prefix_cache", Build::Envoy) => {
            lb.insert("endpoints".into(), json!(["10.0.0.1:8000"]));
        }
        ("cluster_metrics", _) => {
            base["lb_type"] = json!("cluster");
            let lb = base["lb_config"].as_object_mut().unwrap();
            lb.insert("mode".into(), json!("AdaptiveScore"));
            lb.insert("service_list".into(), json!(["outbound|80||a.static"]));
        }
        ("cluster_hash", _) => {
            base["lb_type"] = json!("cluster");
            let one = json!([{"cluster": "outbound|80||a.static", "weight": 100}]);
            base["lb_config"]["clusters"] = one;
        }
        _ => {}
    }
    let groups = [
        json!({}),
        json!({"maxRequestCount": 4, "priorityHeader": "x-priority"}),
        json!({"maxRequestCount": 4, "queueTimeoutMs": 2000}),
        json!({"sessionHeader": "x-session-id"}),
        json!({"sessionHeader": "x-session-id", "serviceFQDN": "redis.static", "servicePort": 6379}),
        json!({"maxPoolRequests": 64, "tenantHeader": "x-tenant"}),
        json!({"maxRequestCount": 4, "priorityHeader": "x-priority", "tenantHeader": "x-tenant"}),
        json!({"scrapeCluster": "ailb_scrape"}),
        json!({"metricsSource": "scrape", "scrapeCluster": "ailb_scrape"}),
        json!({"metric_policy": "weighted"}),
        json!({"metric_policy": "least", "target_metric": "vllm:num_requests_waiting"}),
        json!({"global_inflight_enabled": true, "serviceFQDN": "redis.static", "servicePort": 6379}),
    ];
    groups
        .iter()
        .map(|g| {
            let mut cfg = base.clone();
            let lb = cfg["lb_config"].as_object_mut().unwrap();
            lb.extend(g.as_object().unwrap().clone());
            cfg
        })
        .collect()
}

const POLICIES: [&str; 5] = [
    "global_least_request",
    "prefix_cache",
    "endpoint_metrics",
    "cluster_metrics",
    "cluster_hash",
];

/// Where `key: value` is accepted without a warning: "policy build" for each such config.
fn accepted_in(key: &str, value: &Value) -> Vec<String> {
    let mut ok = Vec::new();
    for build in [Build::Higress, Build::Envoy] {
        for policy in POLICIES {
            for mut cfg in contexts(policy, build) {
                cfg["lb_config"][key] = value.clone();
                if let Ok(p) = ailb_core::config::parse(cfg.to_string().as_bytes(), build) {
                    if p.warnings.is_empty() {
                        ok.push(format!("{policy} {build:?}"));
                    }
                }
            }
        }
    }
    ok
}

/// A value of the schema's type for `p`: its default, else its example.
fn value_of(p: &Value) -> Value {
    p.get("default")
        .or_else(|| p.get("example"))
        .cloned()
        .unwrap_or_else(|| panic!("{p}: give it a default or an example"))
}

#[test]
fn it_accepts_every_schema_key_with_a_value_of_its_type() {
    // Each key with its default (or example) is accepted without a warning by at least one
    // policy in one build, beside the keys it needs.
    for (key, p) in schema_keys() {
        let value = value_of(&p);
        assert!(
            !accepted_in(&key, &value).is_empty(),
            "schema key {key}: {value} accepted nowhere"
        );
    }
}

#[test]
fn it_refuses_our_keys_with_another_type_and_flags_unknown_keys() {
    // Our keys are strict: a value of another type than the schema's is refused (never taken
    // silently). Higress's keys are read as its Go plugin reads them, so only ours are checked.
    let wrong = |ty: &str| match ty {
        "string" => json!(7),
        "array" | "object" => json!(true),
        _ => json!("seven"),
    };
    let schema = schema_keys();
    for (key, rust) in parser_keys() {
        if !rust.starts_with("Own<") {
            continue;
        }
        let ty = schema[&key]["type"].as_str().unwrap();
        let bad = wrong(ty);
        let taken = accepted_in(&key, &bad);
        assert!(
            taken.is_empty(),
            "{key}: {bad} ({ty} expected) taken in {taken:?}"
        );
    }
    // A key the parser does not know (a misspelling) is never taken without a word.
    for key in ["maxRequestCont", "sessionheader", "leaseTtl", "lb_polcy"] {
        let taken = accepted_in(key, &json!(4));
        assert!(taken.is_empty(), "unknown key {key} taken in {taken:?}");
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

#[test]
fn the_packaged_readmes_show_the_same_accepted_examples() {
    // plugin-config/README.md (Chinese, the plugin market's default) and README_EN.md go into
    // the image (make package); their YAML examples are the same and each one is accepted.
    let read = |name: &str| {
        std::fs::read_to_string(
            Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../plugin-config")).join(name),
        )
        .unwrap()
    };
    let blocks = |text: &str| -> Vec<String> {
        text.split("```yaml\n")
            .skip(1)
            .map(|b| b.split("```").next().unwrap().to_string())
            .collect()
    };
    let (zh, en) = (read("README.md"), read("README_EN.md"));
    let cjk = |t: &str| t.chars().any(|c| ('\u{4e00}'..='\u{9fff}').contains(&c));
    assert!(cjk(&zh) && !cjk(&en));
    assert_eq!(blocks(&zh), blocks(&en));
    assert!(blocks(&en).len() >= 5);
    for block in blocks(&en) {
        let y: serde_yaml::Value = serde_yaml::from_str(&block).unwrap();
        parse(&serde_json::to_value(y).unwrap());
    }
}
