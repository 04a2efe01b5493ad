//! The config parser (`config::parse`, both builds; Higress's keys read the lenient Go way) and
//! the document readers (`config::plugin_configs`, `wasm_plugin`): the shipped examples
//! (`plugin-config/*.json|yaml`), the compatibility corpus (`plugin-config/compat/`) and the
//! refused configs (`plugin-config/invalid/`), mutated as bytes and as JSON trees with values
//! Go's coercions meet (numbers as strings, `" 12 "`, `0x10`, `1e3`, booleans as text, …).
//!
//! Properties: never panics; deterministic; at most one warning per field path, so no more
//! warnings than the input has keys and elements; errors and warnings stay short; a password
//! (any string under a `password` key, wherever it is) never appears in an error, a warning or
//! the accepted config's summary; an accepted config answers `select` for any request.

use crate::gen::{drive, mutate_bytes, mutate_value, to_reordered_json, Rng};
use ailb_core::config::{self, Build, RequestKeys};
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

fn yaml_docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .filter_map(|d| {
            let y = serde_yaml::Value::deserialize(d).ok()?;
            serde_json::to_value(y).ok()
        })
        .collect()
}

/// Every plugin config JSON the repository ships or tests with.
fn seeds() -> Vec<Vec<u8>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugin-config");
    let mut out = Vec::new();
    for dir in [root.clone(), root.join("compat"), root.join("invalid")] {
        let mut paths: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        paths.sort();
        for p in paths {
            match p.extension().and_then(|e| e.to_str()) {
                Some("json") => out.push(std::fs::read(&p).unwrap()),
                Some("yaml") => {
                    for doc in yaml_docs(&p) {
                        match config::plugin_configs(&doc) {
                            Ok(list) => out.extend(list.into_iter().map(|d| match d.json {
                                Value::String(raw) => raw.into_bytes(),
                                other => other.to_string().into_bytes(),
                            })),
                            Err(_) => out.push(doc.to_string().into_bytes()),
                        }
                    }
                }
                _ => {}
            }
        }
    }
    assert!(out.len() > 100, "{} seeds", out.len());
    out
}

/// Every object key in the seeds (the parser's vocabulary), plus Higress envelope keys.
fn keys(seeds: &[Vec<u8>]) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    out.push(k.clone());
                    walk(x, out);
                }
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let mut out: Vec<String> = [
        "_rules_",
        "_match_route_",
        "_match_domain_",
        "_match_service_",
        "password",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for s in seeds {
        if let Ok(v) = serde_json::from_slice::<Value>(s) {
            walk(&v, &mut out);
        }
    }
    out.sort();
    out.dedup();
    out
}

const STRINGS: &[&str] = &[
    "global_least_request",
    "prefix_cache",
    "endpoint_metrics",
    "metrics_based",
    "least_busy",
    "cluster",
    "endpoint",
    "cluster_hash",
    "cluster_metrics",
    "redis.static",
    "outbound|6379||redis.static",
    "redis.default.svc.cluster.local",
    "x-ai-lb-debug",
    "deny",
    "allow",
    "true",
    "TRUE",
    "false",
    "1e3",
    "12.0",
    "0x1F",
    "010",
    "+5",
    "null",
    "scrape",
    "host",
    "weighted",
    "least",
    "most",
    "tokens",
    "requests",
    "10.0.0.1:8000",
    "ok-secret-value-1",
];

const DICT: &[&[u8]] = &[
    b"\"lb_policy\"",
    b"\"lb_config\"",
    b"\"lb_type\"",
    b"\"_rules_\"",
    b"\"serviceFQDN\"",
    b"\"servicePort\"",
    b"\"password\"",
    b"\"timeout\"",
    b"\"global_least_request\"",
    b"\"prefix_cache\"",
    b"\"endpoint_metrics\"",
    b"\"cluster\"",
    b"null",
    b"true",
    b"\"\"",
    b"{}",
    b"[]",
    b"\\u0000",
];

fn generate(rng: &mut Rng, seeds: &[Vec<u8>], keys: &[&str]) -> Vec<u8> {
    let seed = rng.pick(seeds);
    let parsed = serde_json::from_slice::<Value>(seed).ok();
    match (rng.below(3), parsed) {
        (0, _) | (_, None) => mutate_bytes(rng, seed, seeds, DICT, 1 << 18),
        (_, Some(mut v)) => {
            mutate_value(rng, &mut v, keys, STRINGS);
            if rng.chance(1, 2) {
                v.to_string().into_bytes()
            } else {
                let mut s = String::new();
                to_reordered_json(&v, &mut s);
                s.into_bytes()
            }
        }
    }
}

/// A password no config text contains by chance.
const MARKER: &str = "Zq9-fuzz-password-Zq9";

/// `v` with every string under a `password` key replaced by [`MARKER`]; `None` if it has none.
fn with_marked_passwords(v: &Value) -> Option<Value> {
    fn walk(v: &mut Value, under_password: bool, n: &mut usize) {
        match v {
            Value::String(s) if under_password => {
                *s = MARKER.to_string();
                *n += 1;
            }
            Value::Object(m) => {
                for (k, x) in m.iter_mut() {
                    walk(x, k.eq_ignore_ascii_case("password"), n);
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| walk(x, under_password, n)),
            _ => {}
        }
    }
    let mut out = v.clone();
    let mut n = 0;
    walk(&mut out, false, &mut n);
    (n > 0).then_some(out)
}

/// What the plugin logs about a config: the error, or the warnings and the summary. (`Debug`
/// is not logged: a route name given as an object is kept as its JSON text, as Go does.)
fn said(input: &[u8], build: Build) -> Vec<String> {
    match config::parse(input, build) {
        Ok(p) => {
            let mut out: Vec<String> = p.warnings.iter().map(ToString::to_string).collect();
            out.push(p.config.summary());
            out
        }
        Err(e) => vec![e.to_string()],
    }
}

fn check(input: &[u8]) {
    let value: Option<Value> = serde_json::from_slice(input).ok();
    // Each path gets at most one warning; a path is a key (`:`) or an element (`,` or the first).
    let paths = input
        .iter()
        .filter(|&&b| b == b':' || b == b',' || b == b'[')
        .count()
        + 1;
    for build in [Build::Higress, Build::Envoy] {
        let out = config::parse(input, build);
        let again = config::parse(input, build);
        match (&out, &again) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a.warnings, b.warnings, "not deterministic");
                assert_eq!(format!("{:?}", a.config), format!("{:?}", b.config));
                assert!(a.warnings.len() <= paths, "{} warnings", a.warnings.len());
                // config/error.rs MAX_PATH and MAX_PROBLEM.
                for w in &a.warnings {
                    assert!(w.path.len() <= 256 && w.message.len() <= 512, "{w}");
                }
                for (route, cluster, authority) in [
                    (
                        Some("chat"),
                        Some("outbound|8000||llm.static"),
                        Some("a.example:80"),
                    ),
                    (None, None, None),
                    (Some(""), Some("x"), Some("[::1]:8080")),
                ] {
                    let keys = RequestKeys {
                        route,
                        cluster,
                        authority,
                    };
                    let _ = a.config.select(&keys);
                }
            }
            (Err(a), Err(b)) => {
                assert_eq!(a, b, "not deterministic");
                assert!(a.path.len() <= 256 && a.problem.len() <= 512, "{a}");
            }
            _ => panic!("not deterministic: {out:?} then {again:?}"),
        }
        // The same config with its passwords set to a marker: the marker is never said.
        if let Some(marked) = value.as_ref().and_then(with_marked_passwords) {
            for s in said(marked.to_string().as_bytes(), build) {
                assert!(!s.contains(MARKER), "a password in: {s}");
            }
        }
    }
    // The document readers take any tree.
    if let Some(v) = &value {
        let _ = config::plugin_configs(v);
        let _ = config::wasm_plugin(v);
    }
}

#[test]
fn fuzz_config_parse() {
    let seeds = seeds();
    let keys = keys(&seeds);
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    for s in &seeds {
        check(s);
    }
    drive("config", 200, |rng| generate(rng, &seeds, &keys), check);
}
