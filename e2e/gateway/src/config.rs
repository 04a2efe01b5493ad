//! Gateway YAML configuration (documented in README.md) and `--set key=value` overrides.

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default = "default_listen")]
    pub listen: String,
    #[serde(default = "default_listen")]
    pub admin: String,
    #[serde(default = "default_workers")]
    pub workers: usize,
    #[serde(default = "default_gateway_id")]
    pub gateway_id: String,
    #[serde(default = "default_log_level")]
    pub log_level: String,
    #[serde(default = "default_buffer_limit")]
    pub buffer_limit_bytes: usize,
    #[serde(default)]
    pub redis_clusters: Vec<RedisClusterCfg>,
    #[serde(default)]
    pub clusters: Vec<ClusterCfg>,
    #[serde(default)]
    pub routes: Vec<RouteCfg>,
    #[serde(default)]
    pub plugin: Option<PluginCfg>,
    /// Directory relative paths (wasm, config_file) are resolved against.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisClusterCfg {
    pub name: String,
    pub address: String,
    /// Emulate "LB returned no host": proxy_redis_call answers 10 and never calls back.
    #[serde(default)]
    pub no_host: bool,
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_ms: u64,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum LbPolicy {
    #[default]
    RoundRobin,
    Random,
    LeastRequest,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum ClusterType {
    #[default]
    Static,
    OriginalDst,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterCfg {
    pub name: String,
    #[serde(default)]
    pub lb_policy: LbPolicy,
    #[serde(default, rename = "type")]
    pub kind: ClusterType,
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_ms: u64,
    #[serde(default = "default_route_timeout")]
    pub timeout_ms: u64,
    #[serde(default)]
    pub endpoints: Vec<EndpointCfg>,
    #[serde(default)]
    pub health_check: Option<HealthCheckCfg>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointCfg {
    pub address: String,
    #[serde(default = "default_health")]
    pub health: String,
    #[serde(default)]
    pub metrics: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthCheckCfg {
    #[serde(default = "default_hc_path")]
    pub path: String,
    #[serde(default = "default_hc_interval")]
    pub interval_ms: u64,
    #[serde(default = "default_hc_timeout")]
    pub timeout_ms: u64,
    #[serde(default = "default_two")]
    pub unhealthy_threshold: u32,
    #[serde(default = "default_one")]
    pub healthy_threshold: u32,
    #[serde(default)]
    pub store_metrics: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteCfg {
    pub name: String,
    #[serde(rename = "match", default)]
    pub matcher: RouteMatch,
    /// The one cluster of the route (Envoy's `RouteAction.cluster`); or
    #[serde(default)]
    pub cluster: Option<String>,
    /// Envoy's `RouteAction.cluster_header`: the cluster named by this request header's value
    /// when the headers reach the router. Exactly one of `cluster` / `cluster_header`.
    #[serde(default)]
    pub cluster_header: Option<String>,
    /// Envoy's `RouteAction.retry_policy` (retry_policy.rs; none: no retries).
    #[serde(default)]
    pub retry_policy: Option<crate::retry_policy::RetryPolicy>,
}

/// Where a route sends its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteTarget<'a> {
    Cluster(&'a str),
    /// The request header (lowercase) naming the cluster.
    Header(&'a str),
}

impl RouteCfg {
    pub fn target(&self) -> RouteTarget<'_> {
        match (&self.cluster, &self.cluster_header) {
            (Some(c), _) => RouteTarget::Cluster(c),
            (None, Some(h)) => RouteTarget::Header(h),
            // `validate` refuses a route with neither.
            (None, None) => RouteTarget::Cluster(""),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RouteMatch {
    #[serde(default)]
    pub prefix: Option<String>,
    #[serde(default)]
    pub exact: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginCfg {
    pub wasm: PathBuf,
    #[serde(default)]
    pub config: Option<serde_json::Value>,
    #[serde(default)]
    pub config_file: Option<PathBuf>,
    /// Bytes readable as buffer type 6 (VmConfiguration).
    #[serde(default)]
    pub vm_config: String,
    #[serde(default = "default_root_id")]
    pub root_id: String,
    /// What a dead VM (a trap in any callback) does to requests: Envoy's
    /// `PluginConfig.failure_policy`, FAIL_CLOSED by default (docs/higress-abi.md).
    #[serde(default)]
    pub failure_policy: FailurePolicy,
    /// FAIL_RELOAD: a new VM is built for a new request once this long has passed since the
    /// failure (Envoy's `ReloadConfig.backoff`, base interval 1 s by default).
    #[serde(default = "default_reload_backoff")]
    pub reload_backoff_ms: u64,
}

/// Envoy's `envoy.extensions.wasm.v3.FailurePolicy` (the deprecated `fail_open: true` is
/// FAIL_OPEN).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum FailurePolicy {
    /// Every stream of the dead VM, and every later one, gets a 503 local reply.
    #[default]
    FailClosed,
    /// Every callback of the dead VM answers Continue: streams go on without the plugin.
    FailOpen,
    /// As FAIL_CLOSED for the streams of the dead VM; new requests get a fresh VM (after the
    /// backoff).
    FailReload,
}

fn default_reload_backoff() -> u64 {
    1000
}
fn default_listen() -> String {
    "127.0.0.1:0".into()
}
fn default_workers() -> usize {
    2
}
fn default_gateway_id() -> String {
    "gw1".into()
}
fn default_log_level() -> String {
    "info".into()
}
fn default_buffer_limit() -> usize {
    10 * 1024 * 1024
}
fn default_connect_timeout() -> u64 {
    1000
}
fn default_route_timeout() -> u64 {
    30000
}
fn default_health() -> String {
    "Healthy".into()
}
fn default_hc_path() -> String {
    "/metrics".into()
}
fn default_hc_interval() -> u64 {
    1000
}
fn default_hc_timeout() -> u64 {
    500
}
fn default_two() -> u32 {
    2
}
fn default_one() -> u32 {
    1
}
fn default_root_id() -> String {
    String::new()
}

impl Config {
    /// Load YAML from `path`, apply `key=value` overrides (dotted keys into the YAML tree,
    /// values parsed as YAML scalars), then validate.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        Self::from_yaml(&text, overrides, base)
    }

    pub fn from_yaml(text: &str, overrides: &[String], base_dir: PathBuf) -> Result<Config> {
        let mut tree: serde_yaml::Value = serde_yaml::from_str(text).context("parsing YAML")?;
        if tree.is_null() {
            tree = serde_yaml::Value::Mapping(Default::default());
        }
        for o in overrides {
            let (k, v) = o
                .split_once('=')
                .with_context(|| format!("--set {o}: expected key=value"))?;
            let val: serde_yaml::Value = serde_yaml::from_str(v).unwrap_or(v.into());
            set_path(&mut tree, k, val)?;
        }
        let mut cfg: Config = serde_yaml::from_value(tree).context("invalid gateway config")?;
        cfg.base_dir = base_dir;
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&mut self) -> Result<()> {
        if self.workers == 0 {
            bail!("workers must be >= 1");
        }
        for r in &mut self.routes {
            if let Some(p) = &mut r.retry_policy {
                p.validate().with_context(|| format!("route {}", r.name))?;
            }
            match (&r.cluster, &mut r.cluster_header) {
                (Some(_), Some(_)) | (None, None) => {
                    bail!("route {}: exactly one of cluster, cluster_header", r.name)
                }
                (Some(c), None) => {
                    if !self.clusters.iter().any(|k| &k.name == c) {
                        bail!("route {}: unknown cluster {c}", r.name);
                    }
                }
                (None, Some(h)) => {
                    // Header names are matched lowercase (host calls store them lowercase).
                    *h = h.to_ascii_lowercase();
                    if h.is_empty() || h.starts_with(':') {
                        bail!(
                            "route {}: cluster_header must name a request header",
                            r.name
                        );
                    }
                }
            }
        }
        for c in &self.clusters {
            for e in &c.endpoints {
                crate::health::Health::parse(&e.health)
                    .with_context(|| format!("cluster {} endpoint {}", c.name, e.address))?;
            }
        }
        Ok(())
    }

    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base_dir.join(p)
        }
    }

    /// The plugin configuration bytes delivered as buffer type 7.
    pub fn plugin_config_bytes(&self) -> Result<Vec<u8>> {
        let Some(p) = &self.plugin else {
            return Ok(Vec::new());
        };
        if let Some(f) = &p.config_file {
            let path = self.resolve(f);
            return std::fs::read(&path)
                .with_context(|| format!("reading plugin config {}", path.display()));
        }
        match &p.config {
            Some(v) => Ok(serde_json::to_vec(v)?),
            None => Ok(Vec::new()),
        }
    }
}

fn set_path(tree: &mut serde_yaml::Value, key: &str, val: serde_yaml::Value) -> Result<()> {
    let mut cur = tree;
    let parts: Vec<&str> = key.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        if let Ok(idx) = part.parse::<usize>() {
            let seq = cur
                .as_sequence_mut()
                .with_context(|| format!("--set {key}: {part} indexes a non-list"))?;
            let slot = seq
                .get_mut(idx)
                .with_context(|| format!("--set {key}: index {idx} out of range"))?;
            if last {
                *slot = val;
                return Ok(());
            }
            cur = slot;
        } else {
            let map = cur
                .as_mapping_mut()
                .with_context(|| format!("--set {key}: {part} is not in a mapping"))?;
            let k = serde_yaml::Value::String(part.to_string());
            if last {
                map.insert(k, val);
                return Ok(());
            }
            cur = map
                .entry(k)
                .or_insert_with(|| serde_yaml::Value::Mapping(Default::default()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_apply() {
        let y = "listen: 127.0.0.1:1\nclusters:\n  - name: c\n    endpoints:\n      - { address: '127.0.0.1:9' }\nroutes:\n  - { name: r, match: { prefix: / }, cluster: c }\n";
        let c = Config::from_yaml(
            y,
            &[
                "listen=127.0.0.1:0".into(),
                "clusters.0.timeout_ms=5".into(),
                "workers=3".into(),
            ],
            PathBuf::from("."),
        )
        .unwrap();
        assert_eq!(c.listen, "127.0.0.1:0");
        assert_eq!(c.clusters[0].timeout_ms, 5);
        assert_eq!(c.workers, 3);
        assert!(Config::from_yaml("bogus: 1", &[], PathBuf::from(".")).is_err());
    }
}
