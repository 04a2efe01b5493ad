//! The configuration documents a user holds, turned into the JSON the plugin receives:
//!
//! * a plugin config (the console's per-route YAML, `plugin-config/route-example.yaml`): as is;
//! * a Higress `WasmPlugin` resource: converted as the Higress controller converts it
//!   (`spec.pluginConfig` verbatim if set; else `defaultConfig` unless `defaultConfigDisable`,
//!   plus one `_rules_` entry per enabled `matchRules` item: its `config` with `_match_route_`
//!   = `ingress`, `_match_service_` = `service`, `_match_domain_` = `domain`);
//! * a plugin `spec.yaml`: its schema examples.
//!
//! YAML is the caller's business (tools/check-config, tests): this works on JSON values.

use serde_json::{Map, Value};

/// One plugin configuration found in a document, with where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivered {
    pub label: String,
    pub json: Value,
}

/// The plugin configurations a document amounts to, or why Higress would deliver none.
pub fn plugin_configs(doc: &Value) -> Result<Vec<Delivered>, String> {
    if doc["kind"] == "WasmPlugin" {
        let name = doc["metadata"]["name"].as_str().unwrap_or("?");
        return Ok(vec![Delivered {
            label: format!("WasmPlugin {name}"),
            json: wasm_plugin(&doc["spec"])?,
        }]);
    }
    let schema = &doc["spec"]["configSchema"]["openAPIV3Schema"];
    if schema.is_object() {
        let mut out = Vec::new();
        for key in ["configSchema", "routeConfigSchema"] {
            let example = &doc["spec"][key]["openAPIV3Schema"]["example"];
            if !example.is_null() {
                out.push(Delivered {
                    label: format!("spec.{key} example"),
                    json: example.clone(),
                });
            }
        }
        if out.is_empty() {
            return Err("a plugin spec without a schema example: nothing to check".into());
        }
        return Ok(out);
    }
    Ok(vec![Delivered {
        label: "plugin config".into(),
        json: doc.clone(),
    }])
}

fn enabled(flag: &Value) -> bool {
    flag.as_bool().unwrap_or(false)
}

/// The controller's conversion of a `WasmPlugin` spec.
pub fn wasm_plugin(spec: &Value) -> Result<Value, String> {
    if !spec["pluginConfig"].is_null() {
        return Ok(spec["pluginConfig"].clone());
    }
    let default_disabled = enabled(&spec["defaultConfigDisable"]);
    let mut top: Option<Map<String, Value>> = if default_disabled {
        None
    } else {
        spec["defaultConfig"].as_object().cloned()
    };
    let mut rules = Vec::new();
    for (n, rule) in spec["matchRules"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        if enabled(&rule["configDisable"]) {
            continue;
        }
        let mut config = rule["config"].as_object().cloned().unwrap_or_default();
        let mut matched = false;
        for (from, to) in [
            ("ingress", "_match_route_"),
            ("service", "_match_service_"),
            ("domain", "_match_domain_"),
        ] {
            if rule[from].as_array().is_some_and(|l| !l.is_empty()) {
                config.insert(to.into(), rule[from].clone());
                matched = true;
            }
        }
        if !matched {
            return Err(format!(
                "matchRules[{n}] has no ingress, domain or service: the Higress controller refuses the resource (invalid match rule has no match condition)"
            ));
        }
        rules.push(Value::Object(config));
    }
    if rules.is_empty() && default_disabled {
        return Err(
            "defaultConfigDisable with no enabled matchRules: the Higress controller emits no plugin config, so the plugin does not run"
                .into(),
        );
    }
    if !rules.is_empty() {
        top.get_or_insert_with(Map::new)
            .insert("_rules_".into(), Value::Array(rules));
    }
    Ok(Value::Object(top.unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wasm_plugin_becomes_rules_as_the_controller_makes_them() {
        let spec = json!({
            "defaultConfig": {"lb_policy": "x"},
            "matchRules": [
                {"ingress": ["default/a"], "config": {"lb_policy": "y"}},
                {"service": ["s.svc"], "domain": ["*.e.com"], "config": {}},
                {"ingress": ["off"], "configDisable": true, "config": {}}
            ]
        });
        let got = wasm_plugin(&spec).unwrap();
        assert_eq!(got["lb_policy"], "x");
        assert_eq!(got["_rules_"][0]["_match_route_"], json!(["default/a"]));
        assert_eq!(got["_rules_"][1]["_match_service_"], json!(["s.svc"]));
        assert_eq!(got["_rules_"][1]["_match_domain_"], json!(["*.e.com"]));
        assert_eq!(got["_rules_"].as_array().unwrap().len(), 2);
        let disabled = json!({"defaultConfigDisable": true, "defaultConfig": {"a": 1},
            "matchRules": [{"ingress": ["r"], "config": {"b": 2}}]});
        assert_eq!(
            wasm_plugin(&disabled).unwrap(),
            json!({"_rules_": [{"b": 2, "_match_route_": ["r"]}]})
        );
        assert!(wasm_plugin(&json!({"matchRules": [{"config": {}}]})).is_err());
        assert!(wasm_plugin(&json!({"defaultConfigDisable": true})).is_err());
        assert_eq!(
            wasm_plugin(&json!({"pluginConfig": {"v": 1}})).unwrap(),
            json!({"v": 1})
        );
    }
}
