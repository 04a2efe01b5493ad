//! A throwaway redis-server on a free loopback port, and a minimal pipelining client built on
//! the plugin's own RESP codec. Shared by the integration tests and the Redis benchmark.
// Test scaffolding: a broken setup should fail loudly.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ailb_core::redis::resp::{self, Value};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    pub port: u16,
    child: Child,
    _dir: TempDir,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl RedisServer {
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> RedisServer {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("ailb-redis-{port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(extra)
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (apt-get install redis-server)");
        let server = RedisServer {
            port,
            child,
            _dir: TempDir(dir),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = Conn::try_connect(port) {
                if c.cmd(&["PING"]) == Value::Simple("PONG".into()) {
                    return server;
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not start on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn conn(&self) -> Conn {
        Conn::try_connect(self.port).unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    pub fn try_connect(port: u16) -> std::io::Result<Conn> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Conn {
            stream,
            buf: Vec::new(),
        })
    }

    pub fn cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Value {
        self.send_raw(&resp::encode_command(args));
        self.read()
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// Sends every query, then reads every reply (one write, one round trip).
    pub fn pipeline(&mut self, queries: &[Vec<u8>]) -> Vec<Value> {
        let all: Vec<u8> = queries.concat();
        self.send_raw(&all);
        (0..queries.len()).map(|_| self.read()).collect()
    }

    pub fn read(&mut self) -> Value {
        loop {
            match resp::decode(&self.buf) {
                Ok((v, used)) => {
                    self.buf.drain(..used);
                    return v;
                }
                Err(resp::RespError::Incomplete) => {
                    let mut chunk = [0u8; 65536];
                    let n = self.stream.read(&mut chunk).unwrap();
                    assert!(n > 0, "redis closed the connection");
                    self.buf.extend_from_slice(&chunk[..n]);
                }
                Err(e) => panic!("bad reply: {e}"),
            }
        }
    }

    /// The raw bytes of one reply, as the host hands them to the plugin (buffer 9).
    pub fn raw_reply(&mut self, query: &[u8]) -> Vec<u8> {
        self.send_raw(query);
        let v = self.read();
        let mut out = Vec::new();
        encode_value(&v, &mut out);
        out
    }
}

pub fn encode_value(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Simple(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
        Value::Error(s) => out.extend_from_slice(format!("-{s}\r\n").as_bytes()),
        Value::Integer(i) => out.extend_from_slice(format!(":{i}\r\n").as_bytes()),
        Value::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
        Value::Bulk(Some(b)) => {
            out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
            out.extend_from_slice(b);
            out.extend_from_slice(b"\r\n");
        }
        Value::Array(None) => out.extend_from_slice(b"*-1\r\n"),
        Value::Array(Some(items)) => {
            out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
            for i in items {
                encode_value(i, out);
            }
        }
    }
}

/// `usec` and `calls` of one command from INFO commandstats.
pub fn command_stats(c: &mut Conn, command: &str) -> (u64, u64) {
    let info = c.cmd(&["INFO", "commandstats"]);
    let text = info.as_str().unwrap_or_default().to_string();
    let prefix = format!("cmdstat_{command}:");
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix(&prefix) {
            let field = |k: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(k))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            return (field("calls="), field("usec="));
        }
    }
    (0, 0)
}

impl Conn {
    /// Sends an already-encoded command and reads its reply.
    pub fn cmd_raw(&mut self, query: &[u8]) -> Value {
        self.send_raw(query);
        self.read()
    }
}

impl RedisServer {
    /// A one-node Redis Cluster owning every slot: scripts there fail with CROSSSLOT unless
    /// all their keys share one slot.
    pub fn start_cluster() -> RedisServer {
        let server = Self::start_with(&[
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
        ]);
        let mut c = server.conn();
        assert_eq!(
            c.cmd(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]),
            Value::Simple("OK".into())
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while !c
            .cmd(&["CLUSTER", "INFO"])
            .as_str()
            .unwrap_or_default()
            .contains("cluster_state:ok")
        {
            assert!(Instant::now() < deadline, "cluster did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }
}
