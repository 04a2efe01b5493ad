//! Process-wide state shared by all worker VMs, the admin server and health checkers:
//! clusters and endpoints (health, counters, stored metrics), shared data, plugin metrics.

use crate::config::{ClusterCfg, Config};
use crate::health::Health;
use anyhow::{bail, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// One upstream endpoint; counters are process-wide (admin `/admin/upstreams`).
pub struct Endpoint {
    pub address: String,
    health: AtomicU8,
    pub requests_total: AtomicU64,
    pub active: AtomicI64,
    pub peak_active: AtomicI64,
    /// Last active health-check body when `store_metrics` is on.
    pub hc_metrics: Mutex<Option<String>>,
    pub static_metrics: String,
}

impl Endpoint {
    pub fn new(address: &str, health: Health, static_metrics: &str) -> Endpoint {
        Endpoint {
            address: address.to_string(),
            health: AtomicU8::new(health as u8),
            requests_total: AtomicU64::new(0),
            active: AtomicI64::new(0),
            peak_active: AtomicI64::new(0),
            hc_metrics: Mutex::new(None),
            static_metrics: static_metrics.to_string(),
        }
    }
    pub fn health(&self) -> Health {
        Health::from_u8(self.health.load(Relaxed))
    }
    pub fn set_health(&self, h: Health) {
        self.health.store(h as u8, Relaxed)
    }
    pub fn metrics_text(&self) -> String {
        if let Some(m) = self
            .hc_metrics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            return m.clone();
        }
        self.static_metrics.clone()
    }
    /// Count a request sent to this endpoint; the returned guard un-counts it on drop.
    pub fn begin_request(self: &Arc<Self>) -> ActiveGuard {
        self.requests_total.fetch_add(1, Relaxed);
        let now = self.active.fetch_add(1, Relaxed) + 1;
        self.peak_active.fetch_max(now, Relaxed);
        ActiveGuard(self.clone())
    }
}

pub struct ActiveGuard(pub Arc<Endpoint>);
impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Relaxed);
    }
}

pub struct Cluster {
    pub cfg: ClusterCfg,
    pub endpoints: Vec<Arc<Endpoint>>,
    /// ORIGINAL_DST hosts created on demand.
    pub dynamic: Mutex<HashMap<String, Arc<Endpoint>>>,
}

impl Cluster {
    pub fn find(&self, addr: &str) -> Option<Arc<Endpoint>> {
        self.endpoints.iter().find(|e| e.address == addr).cloned()
    }
    pub fn dynamic_endpoint(&self, addr: &str) -> Arc<Endpoint> {
        let mut d = self.dynamic.lock().unwrap_or_else(|e| e.into_inner());
        d.entry(addr.to_string())
            .or_insert_with(|| Arc::new(Endpoint::new(addr, Health::Healthy, "")))
            .clone()
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MetricKind {
    Counter,
    Gauge,
    Histogram,
}

pub struct Metric {
    pub name: String,
    pub kind: MetricKind,
    pub value: AtomicI64,
    pub count: AtomicU64,
}

/// A request whose response has not begun: counted as a client abort if dropped so.
pub struct PendingResponse(Option<Arc<Shared>>);

impl PendingResponse {
    pub fn new(shared: Arc<Shared>) -> PendingResponse {
        PendingResponse(Some(shared))
    }

    /// The handler answered (a response, or a reset it counted itself).
    pub fn answered(mut self) {
        self.0 = None;
    }
}

impl Drop for PendingResponse {
    fn drop(&mut self) {
        if let Some(shared) = &self.0 {
            shared.counters.client_aborts.fetch_add(1, Relaxed);
        }
    }
}

/// Gateway-level counters shown by `/stats`.
#[derive(Default)]
pub struct Counters {
    pub requests: AtomicU64,
    pub local_replies: AtomicU64,
    /// The router's 503 for a request whose last try failed before its response (connect
    /// failure or reset); a try that was retried is not counted here.
    pub upstream_5xx_local: AtomicU64,
    /// Retries (router.rs), counted when scheduled as Envoy counts `upstream_rq_retry`; a
    /// retry whose try then answered what is not retried: `upstream_rq_retry_success`; a
    /// retriable answer with no retry left: `upstream_rq_retry_limit_exceeded`.
    pub upstream_rq_retry: AtomicU64,
    pub upstream_rq_retry_success: AtomicU64,
    pub upstream_rq_retry_limit_exceeded: AtomicU64,
    pub client_aborts: AtomicU64,
    /// Routed to a cluster the gateway does not have (a `cluster_header` route): 503.
    pub cluster_not_found: AtomicU64,
    pub streams_destroyed: AtomicU64,
    pub redis_calls: AtomicU64,
    pub redis_failures: AtomicU64,
    pub vm_traps: AtomicU64,
    pub vm_reloads: AtomicU64,
    /// Wall time spent inside VM calls (plugin code plus the host calls it makes), for the
    /// per-request plugin CPU benchmark.
    pub vm_call_ns: AtomicU64,
    /// The worker threads' CPU time inside VM calls, when bench instruments read the thread's
    /// CPU clock (`crate::instrument`): wall time less the time other threads ran meanwhile.
    pub vm_call_cpu_ns: AtomicU64,
    /// VM entries (exports called), so a figure can say how many entries its time took.
    pub vm_calls: AtomicU64,
}

/// key → (value, CAS).
pub type SharedData = HashMap<Vec<u8>, (Vec<u8>, u32)>;

pub struct Shared {
    pub cfg: Config,
    pub clusters: HashMap<String, Arc<Cluster>>,
    pub shared_data: Mutex<SharedData>,
    pub metrics: Mutex<Vec<Arc<Metric>>>,
    pub counters: Counters,
    pub log_level: i32,
    pub plugin_config: Vec<u8>,
}

impl Shared {
    pub fn new(cfg: Config) -> Result<Arc<Shared>> {
        let mut clusters = HashMap::new();
        for c in &cfg.clusters {
            let mut eps = Vec::new();
            for e in &c.endpoints {
                eps.push(Arc::new(Endpoint::new(
                    &e.address,
                    Health::parse(&e.health)?,
                    &e.metrics,
                )));
            }
            let cl = Cluster {
                cfg: c.clone(),
                endpoints: eps,
                dynamic: Mutex::new(HashMap::new()),
            };
            clusters.insert(c.name.clone(), Arc::new(cl));
        }
        let log_level = parse_log_level(&cfg.log_level)?;
        let plugin_config = cfg.plugin_config_bytes()?;
        Ok(Arc::new(Shared {
            cfg,
            clusters,
            shared_data: Mutex::new(HashMap::new()),
            metrics: Mutex::new(Vec::new()),
            counters: Counters::default(),
            log_level,
            plugin_config,
        }))
    }

    /// Same name → same id in every VM (Envoy stats are process-wide).
    pub fn define_metric(&self, kind: MetricKind, name: &str) -> u32 {
        let mut m = self.metrics.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = m.iter().position(|x| x.name == name) {
            return i as u32 + 1;
        }
        m.push(Arc::new(Metric {
            name: name.to_string(),
            kind,
            value: AtomicI64::new(0),
            count: AtomicU64::new(0),
        }));
        m.len() as u32
    }

    pub fn metric(&self, id: u32) -> Option<Arc<Metric>> {
        let m = self.metrics.lock().unwrap_or_else(|e| e.into_inner());
        m.get((id as usize).checked_sub(1)?).cloned()
    }

    /// Shared data with CAS: `cas == 0` writes unconditionally; otherwise it must equal the
    /// current CAS. Returns the status code.
    pub fn set_shared(&self, key: &[u8], value: &[u8], cas: u32) -> i32 {
        let mut m = self.shared_data.lock().unwrap_or_else(|e| e.into_inner());
        match m.get_mut(key) {
            Some(entry) => {
                if cas != 0 && cas != entry.1 {
                    return crate::abi::status::CAS_MISMATCH;
                }
                entry.0 = value.to_vec();
                entry.1 = entry.1.wrapping_add(1).max(1);
            }
            // Envoy inserts a missing key whatever the CAS says.
            None => {
                m.insert(key.to_vec(), (value.to_vec(), 1));
            }
        }
        crate::abi::status::OK
    }

    pub fn get_shared(&self, key: &[u8]) -> Option<(Vec<u8>, u32)> {
        let m = self.shared_data.lock().unwrap_or_else(|e| e.into_inner());
        m.get(key).cloned()
    }
}

/// Envoy/proxy-wasm levels: trace 0, debug 1, info 2, warn 3, error 4, critical 5.
pub fn parse_log_level(s: &str) -> Result<i32> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "trace" => 0,
        "debug" => 1,
        "info" => 2,
        "warn" | "warning" => 3,
        "error" => 4,
        "critical" | "off" => 5,
        _ => bail!("log_level must be trace|debug|info|warn|error|critical"),
    })
}

pub fn level_name(l: i32) -> &'static str {
    match l {
        0 => "trace",
        1 => "debug",
        2 => "info",
        3 => "warn",
        4 => "error",
        _ => "critical",
    }
}
