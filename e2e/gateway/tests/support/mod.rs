//! Test helpers: build the test plugin, run echo upstreams / fake Redis endpoints / gateways on
//! free loopback ports, and a tiny blocking HTTP client. A real redis-server comes from
//! `ailb_testkit`.
#![allow(dead_code)]

use ailb_gateway::config::Config;
use ailb_gateway::gateway::{start, Gateway};
// Not every test binary uses them.
#[allow(unused_imports)]
pub use ailb_testkit::{free_port, wait_until, RedisServer, TempFile};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// Build testdata/testplugin for both ABIs once per test binary; returns (0_2_1, 0_2_100).
pub fn test_plugins() -> &'static (PathBuf, PathBuf) {
    static P: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    P.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/testplugin");
        let target = std::env::var("CARGO_TARGET_DIR")
            .map(|t| PathBuf::from(t).join("testplugin"))
            .unwrap_or_else(|_| std::env::temp_dir().join("ailb-testplugin-target"));
        // Beside their build, which every run reuses: one file per ABI, not one per process.
        let out = target.join("abis");
        std::fs::create_dir_all(&out).unwrap();
        let mut paths = Vec::new();
        for (feat, name) in [(None, "tp_0_2_1.wasm"), (Some("abi100"), "tp_0_2_100.wasm")] {
            let mut c = Command::new(env!("CARGO"));
            c.args(["build", "--release", "--target", "wasm32-wasip1", "--quiet"])
                .current_dir(&dir)
                .env("CARGO_TARGET_DIR", &target);
            if let Some(f) = feat {
                c.args(["--features", f]);
            }
            assert!(c.status().unwrap().success(), "building test plugin");
            let dst = out.join(name);
            // Another test binary may be loading the last run's copy.
            let built = std::fs::read(target.join("wasm32-wasip1/release/ailb_testplugin.wasm"));
            ailb_testkit::replace_file(&dst, &built.unwrap()).unwrap();
            paths.push(dst);
        }
        (paths[0].clone(), paths[1].clone())
    })
}

/// A TCP server that accepts and then either stays silent or closes at once.
pub fn fake_redis(close_immediately: bool) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut keep = Vec::new();
        for s in l.incoming().flatten() {
            if !close_immediately {
                keep.push(s);
            }
        }
    });
    port
}

/// An upstream that answers every request with `addr=<its address>` and the request's
/// headers and body length, one per line; `/slow` waits 3 s first.
pub fn echo_upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || serve_echo(s, addr));
        }
    });
    addr
}

fn serve_echo(mut s: TcpStream, addr: SocketAddr) {
    loop {
        let Some((head, body)) = read_request(&mut s) else {
            return;
        };
        if head.lines().next().unwrap_or("").contains("/slow") {
            std::thread::sleep(Duration::from_secs(3));
        }
        let mut out = format!("addr={addr}\n");
        for l in head.lines().skip(1) {
            out.push_str(&l.to_ascii_lowercase());
            out.push('\n');
        }
        out.push_str(&format!("body-len: {}\n", body.len()));
        let resp = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{}",
            out.len(),
            out
        );
        if s.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

fn read_request(s: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut b = [0u8; 4096];
    let end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        let n = s.read(&mut b).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&b[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut body = buf[end + 4..].to_vec();
    let lower = head.to_ascii_lowercase();
    if let Some(cl) = lower
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
    {
        let n: usize = cl.trim().parse().ok()?;
        while body.len() < n {
            let k = s.read(&mut b).ok()?;
            if k == 0 {
                return None;
            }
            body.extend_from_slice(&b[..k]);
        }
    } else if lower.contains("transfer-encoding: chunked") {
        loop {
            if let Some(p) = body.windows(5).position(|w| w == b"0\r\n\r\n") {
                body.truncate(p);
                break;
            }
            let k = s.read(&mut b).ok()?;
            if k == 0 {
                return None;
            }
            body.extend_from_slice(&b[..k]);
        }
    }
    Some((head, body))
}

pub struct Resp {
    pub status: u16,
    pub head: String,
    pub body: String,
}
impl Resp {
    pub fn header(&self, name: &str) -> Option<String> {
        let pre = format!("{}: ", name.to_ascii_lowercase());
        self.head.lines().find_map(|l| {
            l.to_ascii_lowercase()
                .starts_with(&pre)
                .then(|| l[pre.len()..].to_string())
        })
    }
    /// A line `name: value` from the echo upstream's body.
    pub fn echoed(&self, name: &str) -> Option<String> {
        let pre = format!("{name}: ");
        self.body
            .lines()
            .find_map(|l| l.strip_prefix(&pre).map(str::to_string))
    }
    pub fn upstream(&self) -> String {
        self.body
            .lines()
            .next()
            .unwrap_or("")
            .trim_start_matches("addr=")
            .to_string()
    }
}

/// One request on a fresh connection; `None` on timeout or reset.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Option<Resp> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).ok()?;
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some(Resp {
        status,
        head: head.to_string(),
        body: body.to_string(),
    })
}

pub fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Resp {
    http(addr, "GET", path, headers, b"", Duration::from_secs(10)).expect("request failed")
}

/// Admin /stats value of `name` (0 if absent).
pub fn stat(gw: &Gateway, name: &str) -> i64 {
    let r = get(gw.admin, "/stats", &[]);
    r.body
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!("{name} "))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Waits (5 s at most) until counter `name` reaches `want`; returns its last value.
pub fn wait_stat(gw: &Gateway, name: &str, want: i64) -> i64 {
    let mut v = 0;
    wait_until(Duration::from_secs(5), || {
        v = stat(gw, name);
        v >= want
    });
    v
}

/// Clients blocked in a command (`BLPOP`) on `rs`, from `INFO clients`.
pub fn blocked_clients(rs: &RedisServer) -> Option<u64> {
    let mut info = Vec::new();
    ailb_testkit::encode_value(&rs.try_cmd(&["INFO", "clients"])?, &mut info);
    String::from_utf8_lossy(&info)
        .lines()
        .find_map(|l| l.strip_prefix("blocked_clients:")?.trim().parse().ok())
}

pub fn gateway(yaml: &str) -> Gateway {
    let cfg = Config::from_yaml(yaml, &[], PathBuf::from(".")).expect("config");
    start(cfg).expect("gateway start")
}

pub fn plugin_yaml(wasm: &std::path::Path, config: &str) -> String {
    format!("plugin:\n  wasm: {}\n  config: {config}\n", wasm.display())
}
