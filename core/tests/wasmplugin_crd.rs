//! The shipped `WasmPlugin` resources (docs/install-higress.md) are valid against Higress's
//! `WasmPlugin` CRD (vendored in plugin-config/testdata/wasmplugin-crd.yaml), as the API server
//! with strict field validation checks them, and their configs are accepted by the plugin's
//! parser as the Higress controller delivers them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ailb_core::config::{Build, RequestKeys};
use serde_json::{json, Value};
use std::path::Path;

fn yaml(name: &str) -> Value {
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../plugin-config")).join(name);
    let y: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    serde_json::to_value(y).unwrap()
}

/// The CRD's `apiVersion` of the served version, its kind, and that version's schema.
fn crd() -> (String, String, Value) {
    let crd = yaml("testdata/wasmplugin-crd.yaml");
    assert_eq!(crd["metadata"]["name"], "wasmplugins.extensions.higress.io");
    let version = crd["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["served"] == true && v["storage"] == true)
        .unwrap();
    let api = format!(
        "{}/{}",
        crd["spec"]["group"].as_str().unwrap(),
        version["name"].as_str().unwrap()
    );
    let kind = crd["spec"]["names"]["kind"].as_str().unwrap().to_string();
    (api, kind, version["schema"]["openAPIV3Schema"].clone())
}

/// A structural OpenAPI v3 check as the API server makes it: `type`, `enum`, `nullable`,
/// `required`, `items`, and no field the schema does not name (strict field validation) unless
/// `x-kubernetes-preserve-unknown-fields`.
fn check(schema: &Value, v: &Value, path: &str, errors: &mut Vec<String>) {
    if v.is_null() && schema["nullable"] == true {
        return;
    }
    let ok = match schema["type"].as_str() {
        Some("object") => v.is_object(),
        Some("array") => v.is_array(),
        Some("string") => v.is_string(),
        Some("integer") => v.is_i64() || v.is_u64(),
        Some("number") => v.is_number(),
        Some("boolean") => v.is_boolean(),
        None => true,
        Some(t) => panic!("{path}: schema type {t} not handled"),
    };
    if !ok {
        errors.push(format!("{path}: {v} is not {}", schema["type"]));
        return;
    }
    if let Some(allowed) = schema["enum"].as_array() {
        if !allowed.contains(v) {
            errors.push(format!("{path}: {v} not in {allowed:?}"));
        }
    }
    if let Some(items) = v.as_array() {
        for (i, item) in items.iter().enumerate() {
            check(&schema["items"], item, &format!("{path}[{i}]"), errors);
        }
    }
    let Some(fields) = v.as_object() else { return };
    for req in schema["required"].as_array().into_iter().flatten() {
        if !fields.contains_key(req.as_str().unwrap()) {
            errors.push(format!("{path}: missing required {req}"));
        }
    }
    let preserve = schema["x-kubernetes-preserve-unknown-fields"] == true;
    for (k, field) in fields {
        match schema["properties"].get(k) {
            Some(s) => check(s, field, &format!("{path}.{k}"), errors),
            None if preserve => {}
            None => errors.push(format!("{path}: unknown field {k}")),
        }
    }
}

/// DNS-1123 subdomain (object names) and label-value rules.
fn valid_name(s: &str, max: usize, extra: &[char]) -> bool {
    let inner = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || extra.contains(&c);
    let edge = |c: char| c.is_ascii_alphanumeric();
    !s.is_empty()
        && s.len() <= max
        && s.chars().all(inner)
        && s.starts_with(edge)
        && s.ends_with(edge)
}

/// Everything wrong with a resource; empty when the API server would take it.
fn errors(cr: &Value) -> Vec<String> {
    let (api, kind, schema) = crd();
    let mut errors = Vec::new();
    if cr["apiVersion"] != api.as_str() || cr["kind"] != kind.as_str() {
        errors.push(format!(
            "{} {} is not {api} {kind}",
            cr["apiVersion"], cr["kind"]
        ));
    }
    let meta = &cr["metadata"];
    let name = meta["name"].as_str().unwrap_or("");
    if !valid_name(name, 253, &['-', '.']) {
        errors.push(format!("metadata.name {name:?}"));
    }
    if meta["namespace"] != "higress-system" {
        errors.push(format!("metadata.namespace {}", meta["namespace"]));
    }
    for (k, v) in meta["labels"].as_object().into_iter().flatten() {
        let v = v.as_str().unwrap_or("!");
        let value_ok = v.is_empty() || {
            let lower = v.to_ascii_lowercase();
            valid_name(&lower, 63, &['-', '.', '_'])
        };
        if !value_ok || !k.starts_with("higress.io/") {
            errors.push(format!("metadata.labels.{k}: {v:?}"));
        }
    }
    let mut body = cr.clone();
    for k in ["apiVersion", "kind", "metadata"] {
        body.as_object_mut().unwrap().remove(k);
    }
    check(&schema, &body, "", &mut errors);
    errors
}

/// The configs the controller delivers from the resource, each accepted without a warning.
fn parse(cr: &Value) -> ailb_core::config::PluginConfig {
    let bytes = ailb_core::config::wasm_plugin(&cr["spec"])
        .unwrap()
        .to_string();
    let bytes = bytes.as_bytes();
    let parsed = ailb_core::config::parse(bytes, Build::Higress)
        .unwrap_or_else(|e| panic!("{e}\n{}", String::from_utf8_lossy(bytes)));
    assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
    parsed.config
}

#[test]
fn the_resource_beside_the_builtin_is_valid() {
    let cr = yaml("wasmplugin.yaml");
    assert_eq!(errors(&cr), Vec::<String>::new());
    assert_eq!(cr["metadata"]["name"], "ai-load-balancer-rs");
    assert_eq!(
        cr["metadata"]["labels"]["higress.io/wasm-plugin-name"],
        "ai-load-balancer-rs"
    );
    assert_eq!(
        cr["metadata"]["labels"]["higress.io/wasm-plugin-built-in"],
        "false"
    );
    assert_eq!(parse(&cr).rules.len(), 2);
}

#[test]
fn the_resource_replacing_the_builtin_is_valid() {
    let cr = yaml("wasmplugin-replace-builtin.yaml");
    assert_eq!(errors(&cr), Vec::<String>::new());
    let labels = &cr["metadata"]["labels"];
    assert_eq!(labels["higress.io/wasm-plugin-name"], "ai-load-balancer");
    assert_eq!(labels["higress.io/wasm-plugin-built-in"], "true");
    // The console names it <name>-<version> and finds it by these labels.
    let version = labels["higress.io/wasm-plugin-version"].as_str().unwrap();
    assert_eq!(
        cr["metadata"]["name"],
        format!("ai-load-balancer-{version}")
    );
    assert_eq!(cr["spec"]["priority"], 50);
    assert!(cr["spec"]["url"]
        .as_str()
        .unwrap()
        .ends_with("/ai-load-balancer:0.1.0"));
    let cfg = parse(&cr);
    let agents = RequestKeys {
        route: Some("default/agents"),
        ..Default::default()
    };
    assert!(cfg.select(&agents).is_some());
}

#[test]
fn both_resources_pull_the_packaged_image() {
    // The URL names the tag `make package` gives the layout (spec.yaml info.version).
    let spec = yaml("spec.yaml");
    let tag = spec["info"]["version"].as_str().unwrap();
    for name in ["wasmplugin.yaml", "wasmplugin-replace-builtin.yaml"] {
        let url = yaml(name)["spec"]["url"].as_str().unwrap().to_string();
        assert!(url.starts_with("oci://"), "{name}: {url}");
        assert!(
            url.ends_with(&format!("/ai-load-balancer:{tag}")),
            "{name}: {url}"
        );
    }
}

#[test]
fn the_check_refuses_what_the_crd_refuses() {
    let good = yaml("wasmplugin.yaml");
    let cases: [(&str, Value); 6] = [
        ("/spec/phase", json!("DEFAULT")),
        ("/spec/priority", json!("50")),
        ("/spec/imagePullPolicy", json!("Never")),
        ("/spec/matchRules/0/ingress", json!("default/chat")),
        ("/spec/defaultConfigDisable", json!("true")),
        ("/metadata/name", json!("AI_Load_Balancer")),
    ];
    for (pointer, bad) in cases {
        let mut cr = good.clone();
        *cr.pointer_mut(pointer).unwrap() = bad;
        assert!(!errors(&cr).is_empty(), "{pointer} accepted");
    }
    let mut cr = good.clone();
    cr["spec"]["urls"] = json!("oci://x");
    assert_eq!(errors(&cr), vec![".spec: unknown field urls".to_string()]);
    let mut cr = good;
    cr["spec"]["matchRules"][0]["config"]["anything"] = json!({"goes": 1});
    assert!(errors(&cr).is_empty(), "config preserves unknown fields");
}
