//! The compatibility corpus (`plugin-config/compat/`, issue 9) through the gateway emulator:
//! every plugin config of every file, extracted as check-config extracts it (the bytes Higress's
//! control plane hands the plugin), is delivered to the built `dist/ai-load-balancer.wasm` in an
//! emulator gateway, and the verdict must be the Go plugin's:
//!
//! * Go `accept`: the VM configures, and for each scope of the config (the global config, each
//!   rule) a request that reaches it, by route name, `:authority` or cluster as Higress matches
//!   rules (docs/higress-abi.md §11), is decided by that scope's policy and served by a pod;
//! * Go `refuse`: `proxy_on_configure` answers false and the gateway does not start. Higress's
//!   wasm-go wrapper fails plugin start on a config it cannot parse, and one bad rule fails the
//!   whole config (docs/compatibility.md; the emulator's rule: e2e/gateway
//!   README, docs/higress-abi.md §12).
//!
//! The gateways run in this process on one compilation of the plugin (compiling it per gateway
//! would cost ~1 s of CPU each); each one lives for one probe and stops when dropped.

use ailb_check_config::{extract, Unchecked};
use ailb_core::config::{self, Build, PluginConfig, PolicyConfig, RequestKeys, RouteConfig};
use ailb_e2e::bed::{chat_body, Bed};
use ailb_e2e::gateway::{http, CLUSTER, ROUTE};
use ailb_gateway::config::Config;
use ailb_gateway::gateway::{start_with, ConfigRejected, Gateway};
use ailb_gateway::vm::Plugin;
use ailb_testkit::corpus;
use ailb_testkit::wait_until;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// The Redis cluster the corpus's `serviceFQDN: redis.static` / `servicePort: 6379` names;
/// other names stay unknown to the gateway, and the plugin then fails open (README).
const REDIS_CLUSTER: &str = "outbound|6379||redis.static";
/// The `:authority` of a request that names no domain (the port is stripped for matching).
const LOCAL_AUTHORITY: &str = "127.0.0.1";

/// What every gateway shares: a Redis, one fake pod behind every cluster, the compiled plugin,
/// and a directory for the config files.
struct World {
    bed: Bed,
    plugin: Arc<Plugin>,
    /// What `plugin` was compiled from (the gateway config names it; it is not read again).
    wasm: PathBuf,
    dir: TempDir,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One request reaching one scope of an accepted config.
struct Probe {
    route: String,
    /// The cluster the route names when the request arrives.
    cluster: String,
    /// `None`: the gateway's own address.
    authority: Option<String>,
    scope: Rc<RouteConfig>,
    /// `global` or `rules[N]`, for messages.
    name: String,
}

fn scopes(cfg: &PluginConfig) -> Vec<(String, Rc<RouteConfig>)> {
    let rules = cfg
        .rules
        .iter()
        .enumerate()
        .map(|(n, (_, c))| (format!("rules[{n}]"), c.clone()));
    cfg.global
        .iter()
        .map(|g| ("global".to_string(), g.clone()))
        .chain(rules)
        .collect()
}

/// The values of `key` in the config's `_rules_` entries (a list, or one object).
fn match_values(json: &[u8], key: &str) -> Vec<String> {
    let Ok(doc) = serde_json::from_slice::<Value>(json) else {
        return Vec::new();
    };
    let rules = match &doc["_rules_"] {
        Value::Array(list) => list.clone(),
        one @ Value::Object(_) => vec![one.clone()],
        _ => Vec::new(),
    };
    rules
        .iter()
        .flat_map(|r| match &r[key] {
            Value::String(s) => vec![s.clone()],
            Value::Array(list) => list
                .iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect(),
            _ => Vec::new(),
        })
        .collect()
}

/// For each scope, one request the plugin's own matcher sends to it: candidates are built from
/// the rules' `_match_*` values (a host for each domain pattern, a cluster for each service),
/// and `PluginConfig::matching` decides where each one lands.
fn probes(json: &[u8], cfg: &PluginConfig) -> Result<Vec<Probe>, String> {
    let routes: Vec<String> = std::iter::once(ROUTE.to_string())
        .chain(match_values(json, "_match_route_"))
        .collect();
    let clusters: Vec<String> = std::iter::once(CLUSTER.to_string())
        .chain(
            match_values(json, "_match_service_")
                .iter()
                .map(|s| match s.rsplit_once(':') {
                    Some((fqdn, port)) => format!("outbound|{port}||{fqdn}"),
                    None => format!("outbound|8000||{s}"),
                }),
        )
        .collect();
    let authorities: Vec<Option<String>> = std::iter::once(None)
        .chain(match_values(json, "_match_domain_").iter().map(|d| {
            Some(if let Some(suffix) = d.strip_prefix('*') {
                format!("probe{suffix}")
            } else if let Some(prefix) = d.strip_suffix('*') {
                format!("{prefix}probe")
            } else {
                d.clone()
            })
        }))
        .collect();
    let mut out = Vec::new();
    for (name, scope) in scopes(cfg) {
        let hit = routes.iter().find_map(|route| {
            clusters.iter().find_map(|cluster| {
                authorities.iter().find_map(|authority| {
                    let keys = RequestKeys {
                        route: Some(route),
                        cluster: Some(cluster),
                        authority: Some(authority.as_deref().unwrap_or(LOCAL_AUTHORITY)),
                    };
                    cfg.matching(&keys)
                        .is_some_and(|c| Rc::ptr_eq(c, &scope))
                        .then(|| Probe {
                            route: route.clone(),
                            cluster: cluster.clone(),
                            authority: authority.clone(),
                            scope: scope.clone(),
                            name: name.clone(),
                        })
                })
            })
        });
        out.push(hit.ok_or_else(|| format!("no probe request reaches {name}"))?);
    }
    Ok(out)
}

/// The clusters a cluster-level policy routes to, and the header its route follows.
fn cluster_policy(c: &RouteConfig) -> Option<(Vec<String>, &str)> {
    match &c.policy {
        PolicyConfig::ClusterHash(h) => Some((
            h.clusters.iter().map(|w| w.cluster.clone()).collect(),
            &h.cluster_header,
        )),
        PolicyConfig::ClusterMetrics(m) => Some((m.service_list.clone(), &m.cluster_header)),
        _ => None,
    }
}

impl World {
    fn new() -> World {
        let wasm = ailb_e2e::plugin_wasm();
        let bytes = std::fs::read(&wasm).unwrap();
        let dir = std::env::temp_dir().join(format!("ailb-compat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        World {
            bed: Bed::new(1, |_| {}),
            plugin: Arc::new(Plugin::load(&bytes).unwrap()),
            wasm,
            dir: TempDir(dir),
        }
    }

    /// A one-worker gateway running the plugin with the config in `config_file`, its one
    /// route `route`, and every cluster in `clusters` served by the pod.
    fn gateway(
        &self,
        id: &str,
        config_file: &Path,
        route: &Value,
        clusters: &BTreeSet<String>,
    ) -> anyhow::Result<Gateway> {
        let pod = self.bed.pod_addrs()[0].clone();
        let clusters: Vec<Value> = clusters
            .iter()
            .map(|c| json!({"name": c, "timeout_ms": 10_000, "endpoints": [{"address": pod}]}))
            .collect();
        let cfg = json!({
            "workers": 1,
            "gateway_id": id,
            "log_level": "error",
            "redis_clusters": [{"name": REDIS_CLUSTER, "address": format!("127.0.0.1:{}", self.bed.redis.port)}],
            "clusters": clusters,
            "routes": [route],
            "plugin": {"wasm": self.wasm, "config_file": config_file},
        });
        let cfg = Config::from_yaml(&cfg.to_string(), &[], self.dir.0.clone())?;
        start_with(cfg, Some(self.plugin.clone()))
    }
}

/// Sends `probe`'s request through a gateway of its own; an error says what went wrong.
fn serve(
    world: &World,
    id: &str,
    config_file: &Path,
    cfg: &PluginConfig,
    probe: &Probe,
) -> Result<(), String> {
    let mut clusters: BTreeSet<String> = [CLUSTER.to_string(), probe.cluster.clone()].into();
    for (_, scope) in scopes(cfg) {
        clusters.extend(cluster_policy(&scope).into_iter().flat_map(|(c, _)| c));
    }
    let mut headers: Vec<(String, String)> =
        vec![("content-type".into(), "application/json".into())];
    if let Some(a) = &probe.authority {
        headers.push(("host".into(), a.clone()));
    }
    let route = match cluster_policy(&probe.scope) {
        // Higress routes a cluster-level policy's requests by this header
        // (docs/higress-cluster-policies.md §1); the cluster the request arrives for is its
        // first value, which the plugin then overwrites.
        Some((_, header)) => {
            headers.push((header.to_string(), probe.cluster.clone()));
            json!({"name": probe.route, "match": {"prefix": "/"}, "cluster_header": header})
        }
        None => json!({"name": probe.route, "match": {"prefix": "/"}, "cluster": probe.cluster}),
    };
    if let PolicyConfig::ClusterHash(h) = &probe.scope.policy {
        // Without it cluster_hash answers 403, as Higress does.
        headers.push((h.hash_header.clone(), "compat-consumer".into()));
    }
    let gw = world
        .gateway(id, config_file, &route, &clusters)
        .map_err(|e| format!("{}: the gateway did not start again: {e:#}", probe.name))?;
    let url = format!("http://{}", gw.listen);
    let h: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let (status, got, body) = http(
        &url,
        "POST",
        "/v1/chat/completions",
        &h,
        &chat_body("compat", 2),
    )
    .map_err(|e| format!("{}: no answer: {e}", probe.name))?;
    let pod = got.iter().any(|(k, _)| k == "x-pod");
    if status != 200 || !pod {
        return Err(format!(
            "{}: status {status}, served by a pod: {pod}: {}",
            probe.name,
            String::from_utf8_lossy(&body)
        ));
    }
    // The scope's policy decided the request (routed or fell back to the cluster's own LB).
    let label = probe.scope.policy.kind().metric_label();
    let decided = || {
        ["routed", "fallback"]
            .iter()
            .map(|o| metric(&gw, &format!("ai_lb.{label}.{o}")))
            .sum::<i64>()
    };
    if !wait_until(Duration::from_secs(5), || decided() == 1) {
        return Err(format!(
            "{}: ai_lb.{label}.routed + fallback = {}, want 1",
            probe.name,
            decided()
        ));
    }
    let traps = gw.shared.counters.vm_traps.load(Relaxed);
    if traps != 0 {
        return Err(format!("{}: {traps} VM trap(s)", probe.name));
    }
    Ok(())
}

fn metric(gw: &Gateway, name: &str) -> i64 {
    gw.shared
        .metrics
        .lock()
        .unwrap()
        .iter()
        .find(|m| m.name == name)
        .map_or(0, |m| m.value.load(Relaxed))
}

/// Whether the plugin accepts `json` in the emulator; when it does, every scope is probed and
/// what went wrong is added to `failures`.
fn run_config(world: &World, id: &str, json: &[u8], failures: &mut Vec<String>) -> bool {
    let file = world.dir.0.join(format!("{id}.json"));
    std::fs::write(&file, json).unwrap();
    let default_route = json!({"name": ROUTE, "match": {"prefix": "/"}, "cluster": CLUSTER});
    let started = world.gateway(id, &file, &default_route, &[CLUSTER.to_string()].into());
    match started {
        Ok(gw) => drop(gw),
        Err(e) if e.downcast_ref::<ConfigRejected>().is_some() => return false,
        Err(e) => {
            failures.push(format!("the gateway failed otherwise: {e:#}"));
            return false;
        }
    }
    // The VM took it; the probes are planned with the same parser the plugin ran.
    let probed = config::parse(json, Build::Higress)
        .map_err(|e| format!("the emulator accepted what the parser refuses: {e}"))
        .and_then(|parsed| {
            probes(json, &parsed.config)?
                .iter()
                .try_for_each(|p| serve(world, id, &file, &parsed.config, p))
        });
    if let Err(e) = probed {
        failures.push(e);
    }
    true
}

#[test]
fn the_emulator_gives_every_corpus_file_the_go_verdict() {
    let world = World::new();
    let files = corpus::files();
    let (mut accepted, mut go_accepts) = (0, 0);
    let mut failures = Vec::new();
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let go = corpus::go_accepts(path);
        let text = std::fs::read(path).unwrap();
        let mut all_accepted = true;
        for (n, found) in extract(&text).into_iter().enumerate() {
            let id = format!("{}-{n}", path.file_stem().unwrap().to_string_lossy());
            let mut problems = Vec::new();
            all_accepted &= match &found.json {
                Ok(json) => run_config(&world, &id, json, &mut problems),
                // A document the control plane refuses delivers no config: no plugin runs.
                Err(Unchecked::Refused(_)) => false,
                // Another kind of resource in the same file is not the plugin's.
                Err(Unchecked::Skipped) => true,
            };
            failures.extend(
                problems
                    .into_iter()
                    .map(|p| format!("{name} [{}]: {p}", found.label)),
            );
        }
        if all_accepted != go {
            failures.push(format!(
                "{name}: the emulator {} it, Go {}s it",
                if all_accepted { "accepts" } else { "refuses" },
                if go { "accept" } else { "refuse" }
            ));
        }
        go_accepts += usize::from(go);
        accepted += usize::from(all_accepted);
    }
    println!(
        "accepted {accepted} of {} (Go accepts {go_accepts})",
        files.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(accepted, go_accepts);
    assert!(files.len() >= 45, "only {} corpus files", files.len());
}
