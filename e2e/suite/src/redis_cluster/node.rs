//! The cluster's redis-server nodes, and what they say about the topology: the masters, their
//! slots and replicas, as `CLUSTER NODES` reports them.

use super::auth::{auth_cmd, PASSWORD, USER};
use ailb_core::redis::resp::Value;
use ailb_testkit::wait_until;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Redis Cluster's node timeout: a killed master is marked failed and its replica promoted
/// within a few of these.
pub const NODE_TIMEOUT_MS: u64 = 1000;

/// One redis-server of the cluster, in its own directory (config, `nodes.conf`, log).
pub struct Node {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Node {
    pub(super) fn new(root: &std::path::Path) -> Node {
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

/// The live masters as the first live node of `nodes` that answers sees them.
pub(super) fn masters(nodes: &[Node]) -> Vec<Master> {
    nodes
        .iter()
        .filter(|n| n.is_up())
        .find_map(|n| n.cmd(&["CLUSTER", "NODES"])?.as_str().map(parse_masters))
        .unwrap_or_default()
}

/// Every live node says `cluster_state:ok` and agrees on 3 masters covering all slots (each
/// with a replica if `replicas`).
pub(super) fn healthy(nodes: &[Node], replicas: bool) -> bool {
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
