//! A redis-server process (stoppable and restartable on the same port) and inspection of the
//! plugin's keys.

use ailb_core::redis::resp::{self, Value};
use ailb_core::redis::scripts::Keys;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Redis {
    pub port: u16,
    child: Option<Child>,
}

impl Redis {
    pub fn start() -> Redis {
        let mut r = Redis {
            port: crate::free_port(),
            child: None,
        };
        r.spawn();
        r
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                // DEBUG SLEEP stalls Redis in the fault tests (Redis 7 disables DEBUG by default).
                "--enable-debug-command",
                "yes",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.try_cmd(&["PING"]).is_none() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A handle on a server someone else owns (for watcher threads); never stops it.
    pub fn attach(port: u16) -> Redis {
        Redis { port, child: None }
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

    pub fn try_cmd(&self, args: &[&str]) -> Option<Value> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(&resp::encode_command(args)).ok()?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 65536];
        loop {
            match resp::decode(&buf) {
                Ok((v, _)) => return Some(v),
                Err(resp::RespError::Incomplete) => {
                    let n = s.read(&mut chunk).ok()?;
                    if n == 0 {
                        return None;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                Err(_) => return None,
            }
        }
    }

    pub fn cmd(&self, args: &[&str]) -> Value {
        self.try_cmd(args).expect("redis command failed")
    }

    /// `counts` of the default route/cluster, or None while Redis is unreachable.
    pub fn try_counts(&self) -> Option<Counts> {
        self.counts_of(crate::gateway::ROUTE, crate::gateway::CLUSTER)
    }

    /// In-flight load per endpoint and the number of live leases of one (route, cluster).
    pub fn counts(&self, route: &str, cluster: &str) -> Counts {
        self.counts_of(route, cluster).expect("redis unreachable")
    }

    fn counts_of(&self, route: &str, cluster: &str) -> Option<Counts> {
        let keys = Keys::new("ailb", route, cluster);
        let mut load = BTreeMap::new();
        let Value::Array(Some(items)) =
            self.try_cmd(&["ZRANGE", &keys.load, "0", "-1", "WITHSCORES"])?
        else {
            return None;
        };
        for pair in items.chunks(2) {
            if let [m, s] = pair {
                load.insert(
                    m.as_str().unwrap_or_default().to_string(),
                    s.as_f64().unwrap_or(f64::NAN),
                );
            }
        }
        let leases = self.try_cmd(&["ZCARD", &keys.leases])?.as_i64()?;
        Some(Counts { load, leases })
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Counts {
    pub load: BTreeMap<String, f64>,
    pub leases: i64,
}

impl Counts {
    pub fn total(&self) -> f64 {
        self.load.values().sum()
    }

    pub fn is_zero(&self) -> bool {
        self.leases == 0 && self.load.values().all(|&v| v == 0.0)
    }

    pub fn any_negative(&self) -> bool {
        self.load.values().any(|&v| v < 0.0)
    }
}
