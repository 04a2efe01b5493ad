//! The cluster's single endpoint: Envoy's `redis_proxy` in front of the nodes, as a Higress
//! user would put it (the host follows no `MOVED`, the proxy does).

use super::auth::{auth_cmd, PASSWORD, USER};
use crate::envoy::envoy_bin;
use crate::gateway::http;
use ailb_core::redis::resp::Value;
use ailb_testkit::wait_until;
use serde_json::{json, Value as Json};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Envoy running only the `redis_proxy` network filter, on a fixed port so it can be restarted
/// under the gateways' feet.
pub struct RedisProxy {
    pub port: u16,
    pub admin: u16,
    seeds: Vec<u16>,
    child: Option<Child>,
    config: PathBuf,
    log: PathBuf,
}

impl RedisProxy {
    pub(super) fn start(dir: &std::path::Path, seeds: Vec<u16>) -> RedisProxy {
        let port = ailb_testkit::free_port();
        let mut p = RedisProxy {
            port,
            admin: ailb_testkit::free_port(),
            seeds,
            child: None,
            config: dir.join(format!("envoy-redis-{port}.json")),
            log: dir.join(format!("envoy-redis-{port}.log")),
        };
        p.spawn();
        p
    }

    /// The proxy's Envoy config: downstream clients authenticate as the ACL user; the proxy
    /// authenticates to every node with `RedisProtocolOptions`; the redis cluster type
    /// discovers the topology with `CLUSTER SLOTS` (refreshed every second, and at once after a
    /// redirection or a failure, so a promoted replica is found quickly) and the filter follows
    /// `MOVED`/`ASK` itself.
    pub fn config(&self) -> Json {
        let sock = |p: u16| json!({"socket_address": {"address": "127.0.0.1", "port_value": p}});
        let seeds: Vec<Json> = self
            .seeds
            .iter()
            .map(|&p| json!({"endpoint": {"address": sock(p)}}))
            .collect();
        json!({
          "static_resources": {
            "listeners": [{"name": "redis", "address": sock(self.port),
              "filter_chains": [{"filters": [{"name": "envoy.filters.network.redis_proxy",
                "typed_config": {
                  "@type": "type.googleapis.com/envoy.extensions.filters.network.redis_proxy.v3.RedisProxy",
                  "stat_prefix": "redis",
                  "settings": {"op_timeout": "1s", "enable_redirection": true,
                               "enable_hashtagging": true},
                  "prefix_routes": {"catch_all_route": {"cluster": "redis_cluster"}},
                  "downstream_auth_username": {"inline_string": USER},
                  "downstream_auth_passwords": [{"inline_string": PASSWORD}]}}]}]}],
            "clusters": [{"name": "redis_cluster", "connect_timeout": "0.5s",
              "lb_policy": "CLUSTER_PROVIDED",
              "load_assignment": {"cluster_name": "redis_cluster",
                                  "endpoints": [{"lb_endpoints": seeds}]},
              "cluster_type": {"name": "envoy.clusters.redis", "typed_config": {
                "@type": "type.googleapis.com/google.protobuf.Struct",
                "value": {"cluster_refresh_rate": "1s", "cluster_refresh_timeout": "0.5s",
                          "redirect_refresh_interval": "0.2s", "redirect_refresh_threshold": 1,
                          "failure_refresh_threshold": 1}}},
              "typed_extension_protocol_options": {"envoy.filters.network.redis_proxy": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.redis_proxy.v3.RedisProtocolOptions",
                "auth_username": {"inline_string": USER},
                "auth_password": {"inline_string": PASSWORD}}}}]
          },
          "admin": {"address": sock(self.admin)}
        })
    }

    fn spawn(&mut self) {
        std::fs::write(&self.config, self.config().to_string()).expect("write envoy config");
        let child = Command::new(envoy_bin())
            .arg("-c")
            .arg(&self.config)
            .args(["--concurrency", "2", "--disable-hot-restart", "-l", "warn"])
            .args(["--file-flush-interval-msec", "100"])
            .arg("--base-id")
            .arg(self.port.to_string())
            .arg("--log-path")
            .arg(&self.log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start envoy");
        self.child = Some(child);
        let admin = format!("http://127.0.0.1:{}", self.admin);
        let ready = wait_until(Duration::from_secs(30), || {
            matches!(http(&admin, "GET", "/ready", &[], b""), Ok((200, _, _)))
        });
        assert!(ready, "redis proxy did not become ready:\n{}", self.logs());
    }

    /// SIGKILL, then the same config on the same ports.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn cmd<A: AsRef<[u8]>>(&self, args: &[A]) -> Option<Value> {
        auth_cmd(self.port, USER, PASSWORD, args)
    }
}

impl Drop for RedisProxy {
    fn drop(&mut self) {
        self.kill();
    }
}
