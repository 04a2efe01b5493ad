//! A redis-server process on a free loopback port, in its own temporary directory, killed on
//! Drop. It can be stopped and restarted on the same port (the e2e fault tests take Redis away
//! under load and bring it back empty).

use crate::client::{try_cmd, Conn};
use ailb_core::redis::resp::Value;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// How long a starting redis-server (or a fresh cluster) may take to answer.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Ports [`free_port`] hands out: 12000-21999, and 10000 above each (a Redis Cluster node's
/// bus port) 22000-31999, all below the kernel's ephemeral range.
const FIRST_PORT: u32 = 12_000;
const PORT_SPAN: u32 = 10_000;
const BUS_OFFSET: u32 = 10_000;

/// A free loopback port for a server the caller starts (bound, then released for it to bind).
///
/// Taken below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`, from 32768 by
/// default), where the kernel never puts an outgoing connection's local end: a port from
/// `bind(0)` is an ephemeral one, and another test's connection can take it before the server
/// binds it (CI failed so once: Envoy could not bind 127.0.0.1:34081). One process never hands
/// out a port twice, and each process starts at its own place (its pid). Falls back to
/// `bind(0)` where the ephemeral range starts too low for this.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let start = std::process::id().wrapping_mul(7919) % PORT_SPAN;
    let _ = NEXT.compare_exchange(u32::MAX, start, Ordering::Relaxed, Ordering::Relaxed);
    if ephemeral_low() >= FIRST_PORT + PORT_SPAN + BUS_OFFSET {
        for _ in 0..PORT_SPAN {
            let port = FIRST_PORT + NEXT.fetch_add(1, Ordering::Relaxed) % PORT_SPAN;
            if bindable(port) && bindable(port + BUS_OFFSET) {
                return port as u16;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

/// The first port of the kernel's ephemeral range (Linux; 32768 where it cannot be read),
/// read once per process.
fn ephemeral_low() -> u32 {
    static LOW: OnceLock<u32> = OnceLock::new();
    *LOW.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(32_768)
    })
}

fn bindable(port: u32) -> bool {
    u16::try_from(port).is_ok_and(|p| TcpListener::bind(("127.0.0.1", p)).is_ok())
}

/// What kind of server to start; the default is a plain standalone server without persistence.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// A one-node Redis Cluster owning every slot: scripts there fail with CROSSSLOT unless all
    /// their keys share one slot.
    pub cluster: bool,
    /// Allow the DEBUG command (Redis 7 disables it by default): the e2e fault tests stall
    /// Redis with DEBUG SLEEP.
    pub debug_command: bool,
}

pub struct RedisServer {
    pub port: u16,
    options: Options,
    child: Option<Child>,
    dir: PathBuf,
}

impl RedisServer {
    /// A plain standalone server.
    pub fn start() -> RedisServer {
        Self::start_with(Options::default())
    }

    /// A one-node cluster owning every slot (see [`Options::cluster`]).
    pub fn start_cluster() -> RedisServer {
        Self::start_with(Options {
            cluster: true,
            ..Options::default()
        })
    }

    pub fn start_with(options: Options) -> RedisServer {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("ailb-redis-{port}-{}", std::process::id()));
        let mut server = RedisServer {
            port,
            options,
            child: None,
            dir,
        };
        server.spawn();
        server
    }

    /// Starts redis-server in an emptied directory and waits until it answers (and, for a
    /// cluster, until every slot is served).
    fn spawn(&mut self) {
        // Empty, so a restarted cluster node starts without the previous nodes.conf.
        let _ = std::fs::remove_dir_all(&self.dir);
        std::fs::create_dir_all(&self.dir).expect("redis-server temp dir");
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"]);
        if self.options.debug_command {
            cmd.args(["--enable-debug-command", "yes"]);
        }
        if self.options.cluster {
            cmd.args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ]);
        }
        let child = cmd
            .current_dir(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (apt-get install redis-server)");
        self.child = Some(child);
        let port = self.port;
        wait_for(&format!("redis-server on {port}"), || {
            self.try_cmd(&["PING"]) == Some(Value::Simple("PONG".into()))
        });
        if self.options.cluster {
            assert_eq!(
                self.cmd(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]),
                Value::Simple("OK".into())
            );
            wait_for(&format!("cluster on {port}"), || {
                self.try_cmd(&["CLUSTER", "INFO"])
                    .and_then(|v| v.as_str().map(|s| s.contains("cluster_state:ok")))
                    .unwrap_or(false)
            });
        }
    }

    /// A new connection for a sequence of commands (pipelining, scripts, raw replies).
    pub fn conn(&self) -> Conn {
        Conn::try_connect(self.port).expect("connect to redis-server")
    }

    /// One command on a fresh connection; None while the server is down, stalled past the
    /// timeout, or replying garbage.
    pub fn try_cmd<A: AsRef<[u8]>>(&self, args: &[A]) -> Option<Value> {
        try_cmd(self.port, args)
    }

    pub fn cmd<A: AsRef<[u8]>>(&self, args: &[A]) -> Value {
        self.try_cmd(args).expect("redis command failed")
    }

    /// The server process (e.g. to SIGSTOP it: a stall no command can cause).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops the server (connections drop, pending calls fail).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port, empty (as after a crash without persistence).
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn wait_for(what: &str, ready: impl FnMut() -> bool) {
    assert!(
        crate::wait::wait_until(START_TIMEOUT, ready),
        "{what} did not come up"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_bindable_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), ports.len(), "a port handed out twice");
        for &p in &ports {
            assert!(TcpListener::bind(("127.0.0.1", p)).is_ok(), "{p} is taken");
            if ephemeral_low() >= FIRST_PORT + PORT_SPAN + BUS_OFFSET {
                assert!(u32::from(p) < ephemeral_low() - BUS_OFFSET, "{p}");
            }
        }
    }
}
