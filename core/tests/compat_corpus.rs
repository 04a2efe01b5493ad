//! The compatibility corpus (`plugin-config/compat/`, read through `ailb_testkit::corpus`,
//! which lists its header lines): every file carries the verdict of Higress's Go
//! `ai-load-balancer` and, for accepted ones, the meaning of the keys that matter. Our parser
//! must give the same verdict for every file and read the keys as Go does.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ailb_core::config::{self, Build, PluginConfig, PolicyConfig, RequestKeys, RouteConfig};
use ailb_testkit::corpus;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

struct Case {
    name: String,
    go_accepts: bool,
    expects: Vec<(String, String)>,
    refuse: Vec<String>,
    warns: Vec<String>,
    configs: Vec<Value>,
}

fn load(path: &Path) -> Case {
    let text = std::fs::read_to_string(path).unwrap();
    let is_json = path.extension().is_some_and(|e| e == "json");
    let fields = corpus::header(path);
    let get = |k: &str| corpus::values(&fields, k);
    assert!(
        !get("source").is_empty(),
        "{}: no `# source:`",
        path.display()
    );
    assert!(!get("why").is_empty(), "{}: no `# why:`", path.display());
    let doc: Value = if is_json {
        // Kept as bytes below: duplicate keys must reach the parser.
        Value::String(text.clone())
    } else {
        // As kubectl, Helm and Argo CD read it (YAML 1.1), the way Higress gets it.
        let mut docs = ailb_k8s_yaml::documents(&text).unwrap();
        assert_eq!(docs.len(), 1, "{}: one document", path.display());
        docs.remove(0).value
    };
    let configs = match &doc {
        Value::String(raw) if is_json => vec![Value::String(raw.clone())],
        _ => config::plugin_configs(&doc)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .into_iter()
            .map(|d| d.json)
            .collect(),
    };
    Case {
        name: path.file_name().unwrap().to_string_lossy().into_owned(),
        go_accepts: corpus::go_accepts(path),
        expects: get("expect")
            .iter()
            .map(|e| {
                let (k, v) = e
                    .split_once(" = ")
                    .unwrap_or_else(|| panic!("bad expect `{e}`"));
                (k.trim().to_string(), v.trim().to_string())
            })
            .collect(),
        refuse: get("refuse"),
        warns: get("warn"),
        configs,
    }
}

fn bytes(config: &Value) -> Vec<u8> {
    match config {
        Value::String(raw) => raw.clone().into_bytes(),
        other => other.to_string().into_bytes(),
    }
}

fn f(x: f64) -> String {
    format!("{x}")
}

/// What the parsed config means, as `scope.key = value` facts (`scope` = global, rules[N]).
fn facts(cfg: &PluginConfig) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    out.insert(
        "global".into(),
        if cfg.global.is_some() {
            "present"
        } else {
            "absent"
        }
        .into(),
    );
    out.insert("rules".into(), cfg.rules.len().to_string());
    let scopes = cfg.global.iter().map(|g| ("global".to_string(), g)).chain(
        cfg.rules
            .iter()
            .enumerate()
            .map(|(n, (_, c))| (format!("rules[{n}]"), c)),
    );
    for (scope, c) in scopes {
        for (k, v) in route_facts(c) {
            out.insert(format!("{scope}.{k}"), v);
        }
    }
    out
}

fn route_facts(c: &RouteConfig) -> Vec<(&'static str, String)> {
    let mut v = vec![("policy", c.policy.name().to_string())];
    if let Some(r) = &c.redis {
        v.push(("redis.cluster", r.cluster.clone()));
        v.push(("redis.init_cluster", r.init_cluster.clone()));
        v.push(("redis.username", r.username.clone()));
        v.push(("redis.password", r.password.expose().to_string()));
        v.push(("redis.timeout_ms", r.timeout_ms.to_string()));
    }
    match &c.policy {
        PolicyConfig::GlobalLeastRequest => {
            v.push(("max_load", c.common.max_load.to_string()));
            v.push(("detail_log", c.common.detail_log.to_string()));
        }
        PolicyConfig::PrefixCache(p) => v.push(("prefix.ttl_s", p.ttl_s.to_string())),
        PolicyConfig::EndpointMetrics(m) => {
            v.push(("metrics.policy", format!("{:?}", m.scheduler.policy)));
            v.push((
                "metrics.target",
                m.extra.as_ref().map_or("none".into(), |e| e.name.clone()),
            ));
            v.push(("metrics.rate_limit", f(m.scheduler.rate_limit)));
            let window = m.scheduler.rate_window_ms;
            let age = window.map_or("any".into(), |ms| ms.to_string());
            v.push((
                "metrics.window",
                format!("{}/{age}", m.scheduler.rate_window),
            ));
        }
        PolicyConfig::ClusterMetrics(m) => {
            v.push(("cluster.mode", format!("{:?}", m.mode)));
            v.push(("cluster.services", m.service_list.join(",")));
            v.push(("cluster.header", m.cluster_header.clone()));
            v.push(("cluster.rate_limit", f(m.rate_limit)));
            v.push(("cluster.queue_size", m.queue_size.to_string()));
            v.push(("cluster.ring", m.ring_capacity().to_string()));
            v.push(("cluster.ewma_beta", f(m.ewma_beta)));
            v.push(("cluster.p2c", m.p2c_choices.to_string()));
            v.push(("cluster.ttft_weight", f(m.ttft_weight)));
            v.push(("cluster.total_latency_weight", f(m.total_latency_weight)));
            v.push(("cluster.error_penalty", f(m.error_penalty)));
            v.push(("cluster.cooldown_ms", m.failure_cooldown_ms.to_string()));
            let inflight = m.global_inflight.as_ref();
            v.push((
                "cluster.inflight",
                inflight.map_or("off".into(), |g| g.key_prefix.clone()),
            ));
            if let Some(g) = inflight {
                v.push(("cluster.inflight_ttl_s", g.key_ttl_s.to_string()));
            }
        }
        PolicyConfig::ClusterHash(h) => {
            v.push(("hash.header", h.hash_header.clone()));
            v.push(("hash.key", h.key.describe()));
            v.push(("hash.cluster_header", h.cluster_header.clone()));
            let list: Vec<String> = h
                .clusters
                .iter()
                .map(|c| format!("{}:{}", c.cluster, c.weight))
                .collect();
            v.push(("hash.clusters", list.join(",")));
        }
    }
    v
}

/// `route <name>`, `authority <host>`, `cluster <name>`: which scope Higress applies.
fn matched(cfg: &PluginConfig, query: &str) -> Option<String> {
    let (what, value) = query.split_once(' ')?;
    let keys = match what {
        "route" => RequestKeys {
            route: Some(value),
            ..Default::default()
        },
        "authority" => RequestKeys {
            authority: Some(value),
            ..Default::default()
        },
        "cluster" => RequestKeys {
            cluster: Some(value),
            ..Default::default()
        },
        _ => return None,
    };
    let hit = cfg.matching(&keys);
    Some(match hit {
        None => "none".into(),
        Some(c)
            if cfg
                .global
                .as_ref()
                .is_some_and(|g| std::ptr::eq(g.as_ref(), c.as_ref())) =>
        {
            "global".into()
        }
        Some(c) => {
            let n = cfg
                .rules
                .iter()
                .position(|(_, r)| std::ptr::eq(r.as_ref(), c.as_ref()));
            format!("rules[{}]", n.unwrap())
        }
    })
}

fn cases() -> Vec<Case> {
    corpus::files().iter().map(|p| load(p)).collect()
}

#[test]
fn every_corpus_file_gets_the_go_verdict_and_meaning() {
    let cases = cases();
    let (mut accepted, mut go_accepts) = (0, 0);
    for case in &cases {
        go_accepts += usize::from(case.go_accepts);
        let mut all_accepted = true;
        for json in &case.configs {
            let got = config::parse(&bytes(json), Build::Higress);
            match (&got, case.go_accepts) {
                (Ok(parsed), true) => {
                    let facts = facts(&parsed.config);
                    for (key, want) in &case.expects {
                        let have = matched(&parsed.config, key)
                            .or_else(|| facts.get(key).cloned())
                            .unwrap_or_else(|| {
                                panic!("{}: no fact `{key}` in {facts:#?}", case.name)
                            });
                        assert_eq!(&have, want, "{}: {key}", case.name);
                    }
                    let warnings: Vec<String> =
                        parsed.warnings.iter().map(|w| w.to_string()).collect();
                    for want in &case.warns {
                        assert!(
                            warnings.iter().any(|w| w.contains(want.as_str())),
                            "{}: no warning with `{want}` in {warnings:#?}",
                            case.name
                        );
                    }
                }
                (Err(e), false) => {
                    all_accepted = false;
                    for want in &case.refuse {
                        assert!(
                            e.to_string().contains(want.as_str()),
                            "{}: `{e}` lacks `{want}`",
                            case.name
                        );
                    }
                }
                (Ok(_), false) => panic!("{}: accepted, but Go refuses it", case.name),
                (Err(e), true) => panic!("{}: refused ({e}), but Go accepts it", case.name),
            }
        }
        accepted += usize::from(all_accepted);
    }
    println!(
        "accepted {accepted} of {} (Go accepts {go_accepts})",
        cases.len()
    );
    assert_eq!(accepted, go_accepts);
    assert!(cases.len() >= 45, "only {} corpus files", cases.len());
}

#[test]
fn the_corpus_holds_every_higress_readme_example() {
    // README.md and README_EN.md of Higress's ai-load-balancer each have 7 YAML examples.
    for lang in ["zh", "en"] {
        let n = cases()
            .iter()
            .filter(|c| c.name.starts_with(&format!("readme-{lang}-")))
            .count();
        assert_eq!(n, 7, "readme-{lang}-*");
    }
    assert!(cases().iter().any(|c| c.name.starts_with("console-spec")));
}
