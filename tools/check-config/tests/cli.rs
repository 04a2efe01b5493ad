//! The `check-config` binary over the shipped examples, the invalid fixtures and the
//! compatibility corpus (plugin-config/compat: every file carries Higress's Go verdict).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ailb_testkit::corpus;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn repo(rel: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join(rel)
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_check-config"))
        .args(args)
        .output()
        .unwrap()
}

/// `check-config -` with `input` on its standard input.
fn run_stdin(input: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_check-config"))
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn files(dir: &str, exts: &[&str]) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(repo(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| exts.iter().any(|x| e == *x)))
        .collect();
    v.sort();
    v
}

#[test]
fn the_corpus_gets_the_go_verdicts() {
    let (mut accepted, mut go_accepts, mut total) = (0, 0, 0);
    for path in corpus::files() {
        let go_accepts_it = corpus::go_accepts(&path);
        let out = run(&[path.to_str().unwrap()]);
        let text = stdout(&out);
        assert_eq!(
            out.status.code(),
            Some(if go_accepts_it { 0 } else { 1 }),
            "{}: {text}",
            path.display()
        );
        assert!(
            text.contains(if go_accepts_it {
                "accepted: "
            } else {
                "refused: "
            }),
            "{text}"
        );
        // Where YAML 1.2 reads the file differently, check-config says so.
        for note in corpus::values(&corpus::header(&path), "yaml") {
            assert!(
                text.contains(&note),
                "{}: no `{note}` in {text}",
                path.display()
            );
        }
        total += 1;
        go_accepts += usize::from(go_accepts_it);
        accepted += usize::from(out.status.success());
    }
    println!("accepted {accepted} of {total} (Go accepts {go_accepts})");
    assert_eq!(accepted, go_accepts);
    assert!(total >= 45);
}

#[test]
fn shipped_examples_are_accepted_without_warnings() {
    for name in [
        "minimal.json",
        "full.json",
        "route-example.yaml",
        "wasmplugin.yaml",
        "spec.yaml",
        "cluster-metrics-example.yaml",
        "cluster-hash-example.yaml",
    ] {
        let out = run(&[repo("plugin-config").join(name).to_str().unwrap()]);
        let text = stdout(&out);
        assert!(out.status.success(), "{name}: {text}");
        assert!(
            text.contains("accepted: ") && !text.contains("warning:"),
            "{name}: {text}"
        );
    }
}

#[test]
fn invalid_fixtures_are_refused_with_their_reason() {
    let fixtures = files("plugin-config/invalid", &["json"]);
    assert!(fixtures.len() >= 20);
    for path in fixtures {
        let want = std::fs::read_to_string(path.with_extension("err")).unwrap();
        let out = run(&[path.to_str().unwrap()]);
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(1), "{}: {text}", path.display());
        assert!(text.starts_with("refused: "), "{text}");
        assert!(
            text.contains(want.trim()),
            "{}: {text} lacks {want}",
            path.display()
        );
    }
}

#[test]
fn warnings_name_the_field_and_never_the_secret() {
    let out = run_stdin("lb_policy: global_least_request\nlb_config:\n  serviceFQDN: redis.static\n  servicePort: \"6379\"\n  password: 918273645\n  leaseTtl: 60\n");
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("warning: lb_config.servicePort: a string, read as the number 6379"),
        "{text}"
    );
    assert!(
        text.contains("warning: lb_config.password: a number, read as the text"),
        "{text}"
    );
    assert!(text.contains("warning: lb_config.leaseTtl: unknown key: ignored, as Higress ignores it; did you mean `leaseTTL`?"), "{text}");
    assert!(!text.contains("918273645"), "{text}");
}

#[test]
fn every_document_and_build_is_checked() {
    let dir = std::env::temp_dir().join(format!("check-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let two = dir.join("two.yaml");
    std::fs::write(
        &two,
        "lb_policy: endpoint_metrics\n---\nlb_type: cluster\nlb_policy: cluster_hash\nlb_config:\n  clusters: [{cluster: a, weight: 99}]\n",
    )
    .unwrap();
    let out = run(&[two.to_str().unwrap()]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("[plugin config] accepted: "), "{text}");
    assert!(text.contains("[plugin config] refused: lb_config.clusters: sum of cluster weights must be 100, got 99 (Higress refuses it too)"), "{text}");
    // The plain-Envoy build needs `endpoints` (our own rule), the Higress build refuses them.
    let envoy = dir.join("envoy.json");
    std::fs::write(&envoy, r#"{"lb_policy": "endpoint_metrics", "lb_config": {"endpoints": ["10.0.0.1:80"], "scrapeCluster": "pods"}}"#).unwrap();
    assert!(run(&["--envoy", envoy.to_str().unwrap()]).status.success());
    let text = stdout(&run(&[envoy.to_str().unwrap()]));
    assert!(
        text.contains("refused: lb_config.endpoints: only in the plain-Envoy build")
            && text.contains("this plugin's own"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(run(&[]).status.code(), Some(2));
    assert_eq!(run(&["/nonexistent/file.yaml"]).status.code(), Some(2));
}

/// A file as `kubectl apply -f` takes it: several resources, YAML 1.1.
const MANIFESTS: &str = r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: llm
spec:
  rules: []
---
apiVersion: extensions.higress.io/v1alpha1
kind: WasmPlugin
metadata:
  name: ai-load-balancer
  namespace: higress-system
spec:
  defaultConfigDisable: true
  matchRules:
  - ingress: [llm]
    configDisable: off
    config:
      lb_policy: global_least_request
      lb_config: &redis
        serviceFQDN: redis.static
        servicePort: 6_379
  - ingress: [llm-2]
    config:
      lb_policy: prefix_cache
      lb_config:
        <<: *redis
        redisKeyTTL: 600
---
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata:
  name: cluster-header
spec: {}
"#;

#[test]
fn a_manifest_file_is_judged_by_its_plugin_configs_read_as_kubectl_reads_them() {
    let dir = std::env::temp_dir().join(format!("ailb-cc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("manifests.yaml");
    std::fs::write(&path, MANIFESTS).unwrap();
    let out = run(&[path.to_str().unwrap()]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("[Ingress llm] skipped: not a plugin config"),
        "{text}"
    );
    assert!(
        text.contains("[EnvoyFilter cluster-header] skipped"),
        "{text}"
    );
    assert!(
        text.contains("[WasmPlugin ai-load-balancer] accepted: "),
        "{text}"
    );
    // `off` is false to kubectl: the rule is enabled. The note names where YAML 1.2 differs.
    assert!(
        text.contains("spec.matchRules[0].configDisable: `off` is the boolean false"),
        "{text}"
    );
    assert!(
        text.contains(
            "spec.matchRules[0].config.lb_config.servicePort: `6_379` is the number 6379"
        ),
        "{text}"
    );
    assert!(text.contains("spec.matchRules[1].config.lb_config.<<: the merge key copies in `serviceFQDN`, `servicePort`"), "{text}");
    // The JSON Higress gets: both rules, the merged Redis block with the port as a number.
    let found = ailb_check_config::extract(MANIFESTS.as_bytes());
    let plugin = found
        .iter()
        .find(|e| e.label.starts_with("WasmPlugin"))
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(plugin.json.as_ref().unwrap()).unwrap();
    let rules = json["_rules_"].as_array().unwrap();
    assert_eq!(rules.len(), 2, "{json}");
    assert_eq!(rules[1]["lb_config"]["servicePort"], 6379);
    assert_eq!(rules[1]["lb_config"]["serviceFQDN"], "redis.static");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_file_of_other_resources_only_has_no_plugin_config() {
    let out = run_stdin("apiVersion: v1\nkind: Service\nmetadata:\n  name: redis\n");
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("[Service redis] skipped"), "{text}");
    assert!(text.contains("no plugin config in it"), "{text}");
}
