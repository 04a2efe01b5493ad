//! Emulator gateway processes (`ailb-gateway`) and a tiny blocking HTTP client for tests.

use ailb_testkit::TempFile;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

pub const ROUTE: &str = "llm-route";
pub const CLUSTER: &str = "outbound|8000||llm.static";

/// The Envoy cluster name the plugin derives from `serviceFQDN: redis.static`.
pub fn redis_cluster(port: u16) -> String {
    format!("outbound|{port}||redis.static")
}

/// A `global_least_request` plugin config for the Redis on `port`, plus `extra` lb_config keys.
pub fn glr_config(port: u16, extra: Value) -> Value {
    let mut lb = json!({"serviceFQDN": "redis.static", "servicePort": port, "timeout": 1000});
    if let (Some(lb), Some(extra)) = (lb.as_object_mut(), extra.as_object()) {
        lb.extend(extra.clone());
    }
    json!({"lb_policy": "global_least_request", "lb_config": lb})
}

/// What one emulator process runs.
#[derive(Clone, Debug)]
pub struct GatewaySpec {
    pub id: String,
    pub workers: usize,
    pub redis_port: u16,
    pub redis_no_host: bool,
    pub pods: Vec<String>,
    /// `None`: no plugin, the cluster's own LB only.
    pub plugin: Option<(PathBuf, Value)>,
    pub cluster_lb: String,
    pub upstream_timeout_ms: u64,
    pub buffer_limit_bytes: usize,
    pub log_level: String,
    /// Active health check of the pods' cluster (e.g. `store_metrics: true` for endpoint_metrics).
    pub health_check: Option<Value>,
    /// Further clusters (e.g. an `original_dst` scrape cluster).
    pub extra_clusters: Vec<Value>,
    /// The route's `retry_policy` (Envoy's field names: `retry_on`, `num_retries`,
    /// `retriable_status_codes`, `per_try_timeout_ms`; e2e/gateway README); None: no retries.
    pub retry_policy: Option<Value>,
}

impl GatewaySpec {
    pub fn new(id: &str, redis_port: u16, pods: &[String], plugin: Option<Value>) -> GatewaySpec {
        GatewaySpec {
            id: id.into(),
            workers: 2,
            redis_port,
            redis_no_host: false,
            pods: pods.to_vec(),
            plugin: plugin.map(|c| (crate::plugin_wasm(), c)),
            cluster_lb: "round_robin".into(),
            upstream_timeout_ms: 30_000,
            buffer_limit_bytes: 10 * 1024 * 1024,
            log_level: "warn".into(),
            health_check: None,
            extra_clusters: Vec::new(),
            retry_policy: None,
        }
    }

    pub fn config(&self) -> Value {
        let endpoints: Vec<Value> = self
            .pods
            .iter()
            .map(|a| json!({"address": a, "health": "Healthy"}))
            .collect();
        let mut cfg = json!({
            "listen": "127.0.0.1:0",
            "admin": "127.0.0.1:0",
            "workers": self.workers,
            "gateway_id": self.id,
            "log_level": self.log_level,
            "buffer_limit_bytes": self.buffer_limit_bytes,
            "redis_clusters": [{"name": redis_cluster(self.redis_port), "address": format!("127.0.0.1:{}", self.redis_port), "no_host": self.redis_no_host}],
            "clusters": [{"name": CLUSTER, "lb_policy": self.cluster_lb, "timeout_ms": self.upstream_timeout_ms, "endpoints": endpoints}],
            "routes": [{"name": ROUTE, "match": {"prefix": "/"}, "cluster": CLUSTER}],
        });
        if let Some(clusters) = cfg["clusters"].as_array_mut() {
            if let (Some(hc), Some(first)) = (&self.health_check, clusters.first_mut()) {
                first["health_check"] = hc.clone();
            }
            clusters.extend(self.extra_clusters.iter().cloned());
        }
        if let (Some(policy), Some(route)) = (&self.retry_policy, cfg["routes"].get_mut(0)) {
            route["retry_policy"] = policy.clone();
        }
        if let (Some((wasm, config)), Some(obj)) = (&self.plugin, cfg.as_object_mut()) {
            obj.insert("plugin".into(), json!({"wasm": wasm, "config": config}));
        }
        cfg
    }
}

static EMULATOR: OnceLock<&'static str> = OnceLock::new();

/// Makes every [`Gateway`] this process starts run the e2e binary `name` instead of
/// `ailb-gateway`: `ailb-bench` sets `ailb-bench-gateway`, the emulator with its profiling
/// switches (e2e/bench). Set once, before the first gateway starts; false if it was set.
pub fn use_emulator(name: &'static str) -> bool {
    EMULATOR.set(name).is_ok()
}

pub struct Gateway {
    pub id: String,
    /// `http://127.0.0.1:PORT`
    pub url: String,
    pub admin: String,
    child: Child,
    logs: Arc<Mutex<Vec<String>>>,
    _config: TempFile,
}

impl Gateway {
    /// Starts the process and waits for its READY line. A rejected plugin config makes the
    /// emulator exit; the error carries its log.
    pub fn start(spec: &GatewaySpec) -> anyhow::Result<Gateway> {
        Self::start_config(&spec.config(), &spec.id)
    }

    /// Starts a gateway from a full emulator config (e.g. a spec's config, edited).
    pub fn start_config(config: &Value, id: &str) -> anyhow::Result<Gateway> {
        Self::start_config_env(config, id, &[])
    }

    /// [`Gateway::start_config`] with extra environment variables for the emulator process
    /// (the bench's switches such as `AILB_COLD_ENTRIES`, with [`use_emulator`]).
    pub fn start_config_env(
        config: &Value,
        id: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Gateway> {
        let path = std::env::temp_dir().join(format!(
            "ailb-gw-{}-{}-{}.yaml",
            id,
            std::process::id(),
            ailb_testkit::free_port()
        ));
        std::fs::write(&path, serde_json::to_string_pretty(config)?)?;
        // Removed however this returns: a gateway that did not start too.
        let config_file = TempFile(path.clone());
        let emulator = EMULATOR.get().copied().unwrap_or("ailb-gateway");
        let mut child = Command::new(crate::e2e_bin(emulator))
            .arg("--config")
            .arg(&path)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let logs = Arc::new(Mutex::new(Vec::new()));
        if let Some(err) = child.stderr.take() {
            let logs = logs.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    if std::env::var_os("AILB_E2E_VERBOSE").is_some() {
                        eprintln!("{line}");
                    }
                    if let Ok(mut l) = logs.lock() {
                        l.push(line);
                    }
                }
            });
        }
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
            for _ in lines {} // keep draining so the child never blocks on stdout
        });
        let ready = rx.recv_timeout(Duration::from_secs(30));
        let field = |line: &str, key: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .map(str::to_string)
        };
        match ready {
            Ok(line) if line.starts_with("READY") => {
                let listen = field(&line, "listen=").unwrap_or_default();
                let admin = field(&line, "admin=").unwrap_or_default();
                Ok(Gateway {
                    id: id.to_string(),
                    url: format!("http://{listen}"),
                    admin: format!("http://{admin}"),
                    child,
                    logs,
                    _config: config_file,
                })
            }
            other => {
                let _ = child.kill();
                let status = child.wait().ok();
                std::thread::sleep(Duration::from_millis(100));
                let log = logs.lock().map(|l| l.join("\n")).unwrap_or_default();
                anyhow::bail!("gateway {id} did not start ({other:?}, exit {status:?}):\n{log}")
            }
        }
    }

    /// SIGKILL: no on_done, no releases — what a crashed gateway leaves behind.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory of the process (`VmRSS` of /proc/<pid>/status), in KiB.
    pub fn rss_kb(&self) -> anyhow::Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no VmRSS for gateway {}", self.id))
    }

    pub fn logs(&self) -> String {
        self.logs.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// Plugin and gateway counters from the admin `/stats` page (`name value` lines).
    pub fn stats(&self) -> BTreeMap<String, i64> {
        let (_, _, body) = http(&self.admin, "GET", "/stats", &[], b"").unwrap_or_default();
        String::from_utf8_lossy(&body)
            .lines()
            .filter_map(|l| {
                let (k, v) = l.rsplit_once([' ', ':'])?;
                Some((
                    k.trim().trim_end_matches(':').to_string(),
                    v.trim().parse().ok()?,
                ))
            })
            .collect()
    }

    pub fn stat(&self, name: &str) -> i64 {
        self.stats().get(name).copied().unwrap_or(0)
    }

    pub fn admin_post(&self, path: &str) -> anyhow::Result<u16> {
        Ok(http(&self.admin, "POST", path, &[], b"")?.0)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Status, lower-cased headers and body of a response.
pub type Response = (u16, Vec<(String, String)>, Vec<u8>);

/// One HTTP/1.1 request with `Connection: close`; `Host` is the server's address unless
/// `headers` name one (e.g. to match a `_match_domain_` rule).
pub fn http(
    base: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> anyhow::Result<Response> {
    let mut s = open(base, method, path, headers, body)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    parse_response(&raw)
}

/// Sends the request [`http`] sends and returns the connection unread: for a client that reads
/// part of the answer, or gives up and drops it.
pub fn open(
    base: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> anyhow::Result<TcpStream> {
    let host = base.trim_start_matches("http://");
    let mut s = TcpStream::connect(host)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("host: {host}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    // A small request goes in one write: a proxy that answers at request headers (403, 429)
    // and closes would otherwise find the body arriving after it closed, and its RST would
    // discard the response before it is read. Large bodies stay streamed (envoy_body tests).
    if body.len() <= 64 * 1024 {
        let mut one = req.into_bytes();
        one.extend_from_slice(body);
        s.write_all(&one)?;
    } else {
        s.write_all(req.as_bytes())?;
        s.write_all(body)?;
    }
    Ok(s)
}

/// Status, lower-cased headers and (de-chunked) body of a whole response.
pub fn parse_response(raw: &[u8]) -> anyhow::Result<Response> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("no response head"))?;
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let hdrs: Vec<(String, String)> = lines
        .filter_map(|l| {
            l.split_once(':')
                .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        })
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if hdrs
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    Ok((status, hdrs, body))
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).trim(), 16).unwrap_or(0);
        if size == 0 || b.len() < eol + 2 + size {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[(eol + 4 + size).min(b.len())..];
    }
    out
}
