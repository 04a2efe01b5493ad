//! One router's replay of one workload on a bed (pods reset, Redis flushed first, so every
//! router starts cold on the same arrivals), and the figures taken from its records.

use super::fleet::Scale;
use super::peer::MAX_TTFT_PENALTY_S;
use crate::prefix::prefix_config;
use ailb_bench::trace::replay::{replay, Options, Record, Router, Target};
use ailb_bench::trace::workload::Workload;
use ailb_e2e::bed::Bed;
use ailb_e2e::envoy::Envoy;
use ailb_e2e::gateway::Gateway;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a run's requests reach the pods.
pub enum Via {
    /// The plugin (Higress build) in `n` emulator gateways sharing the bed's Redis, with these
    /// `lb_config` keys over prefix_cache's defaults (a router's own plugin config).
    Gateways { n: usize, lb: Value },
    /// The plugin (Envoy build) in one real Envoy (state per proxy, no Redis).
    Envoy { lb: Value },
    /// An in-process router sending straight to the pods.
    Router(Arc<dyn Router>),
}

/// The plugin as a user configures it, in `n` gateways: its defaults, with the token gate's
/// `maxTTFTPenaltyMs` (5,000 ms of trace time, llm-d's default) in the bench's compressed time.
pub fn plugin(n: usize, s: Scale) -> Via {
    Via::Gateways {
        n,
        lb: json!({ "maxTTFTPenaltyMs": penalty_ms(s) }),
    }
}

/// llm-d's 5,000 ms TTFT penalty in wall time at scale `s`.
pub fn penalty_ms(s: Scale) -> u64 {
    (MAX_TTFT_PENALTY_S * 1000.0 / s.time).round().max(1.0) as u64
}

pub use crate::common::bench;

pub struct Run {
    pub name: String,
    pub records: Vec<Record>,
    pub wall: Duration,
    /// Through emulator gateways: time in the plugin's VM per request (wall), µs, and VM calls per
    /// request, summed over the gateways (where a configuration's cost goes).
    pub vm: Option<(f64, f64)>,
}

/// The plugin's prefix_cache route config (what a user would configure), its debug header on,
/// with `lb` merged over it and then `AILB_TRACE_LB_CONFIG` (a JSON object) for trying out
/// plugin settings without editing the bench.
pub fn plugin_config(redis_port: u16, lb: &Value) -> Value {
    let mut c = prefix_config(redis_port);
    let mut extra = vec![json!({"debugHeader": "x-ai-lb-debug"}), lb.clone()];
    if let Ok(s) = std::env::var("AILB_TRACE_LB_CONFIG") {
        if let Ok(v) = serde_json::from_str::<Value>(&s) {
            extra.push(v);
        }
    }
    if let Some(obj) = c["lb_config"].as_object_mut() {
        for e in extra {
            if let Some(e) = e.as_object() {
                obj.extend(e.clone());
            }
        }
    }
    c
}

pub fn run(bed: &Bed, name: &str, w: &Workload, via: Via, opts: Options) -> anyhow::Result<Run> {
    bed.reset_pods();
    bed.redis.cmd(&["FLUSHALL"]);
    let mut gateways = Vec::new();
    let mut envoy = None;
    let target = match via {
        Via::Gateways { n, lb } => {
            let plugin = plugin_config(bed.redis.port, &lb);
            for i in 0..n {
                let mut spec = bed.spec(&format!("trace-{name}-{i}"), Some(plugin.clone()));
                spec.upstream_timeout_ms = 600_000;
                gateways.push(Gateway::start(&spec)?);
            }
            Target::Urls(gateways.iter().map(|g| g.url.clone()).collect())
        }
        Via::Envoy { lb } => {
            let pods = bed.pod_addrs();
            let mut c = json!({"lb_policy": "prefix_cache", "lb_config": {"endpoints": pods}});
            if let (Some(o), Some(e)) = (c["lb_config"].as_object_mut(), lb.as_object()) {
                o.extend(e.clone());
            }
            let e = Envoy::start(&pods, &c);
            let url = e.url.clone();
            envoy = Some(e);
            Target::Urls(vec![url])
        }
        Via::Router(r) => Target::Router(r),
    };
    let t = Instant::now();
    let records = bed.rt.block_on(replay(w, &bed.pods, target, opts));
    let vm = (!gateways.is_empty()).then(|| {
        let sum = |k: &str| gateways.iter().map(|g| g.stat(k)).sum::<i64>() as f64;
        let n = records.len().max(1) as f64;
        (
            sum("gateway.vm_call_ns") / 1e3 / n,
            sum("gateway.vm_calls") / n,
        )
    });
    if std::env::var_os("AILB_PROF").is_some() {
        let n = records.len().max(1) as i64;
        for (k, v) in gateways.iter().flat_map(|g| g.stats()) {
            if k.starts_with("prof.") && k.ends_with(".ns") {
                eprintln!("  {k} {} ns per request", v / n);
            }
        }
    }
    let run = Run {
        name: name.into(),
        records,
        wall: t.elapsed(),
        vm,
    };
    drop(gateways);
    drop(envoy);
    eprintln!("trace {}: {}", w.name, run.line());
    Ok(run)
}

/// Nearest-rank percentile of `v` (sorted), NaN when empty.
pub fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1]
}

impl Run {
    pub fn ok(&self) -> impl Iterator<Item = &Record> {
        self.records.iter().filter(|r| r.error.is_none())
    }

    /// Cached over prompt tokens, as the pods reported them (token-weighted).
    pub fn hit(&self) -> f64 {
        let (c, p) = self.ok().fold((0u64, 0u64), |(c, p), r| {
            (c + r.cached_tokens, p + r.prompt_tokens)
        });
        c as f64 / p.max(1) as f64
    }

    /// Pod-side TTFTs of answered requests, trace seconds, sorted.
    pub fn ttfts(&self) -> Vec<f64> {
        self.ttfts_where(|_| true)
    }

    pub fn ttfts_where(&self, f: impl Fn(&Record) -> bool) -> Vec<f64> {
        let mut v: Vec<f64> = self
            .ok()
            .filter(|r| f(r))
            .filter_map(|r| r.ttft_pod.map(|d| d.as_secs_f64()))
            .collect();
        v.sort_by(f64::total_cmp);
        v
    }

    pub fn ttft(&self, p: f64) -> f64 {
        pct(&self.ttfts(), p)
    }

    /// Requests per pod, max over mean.
    pub fn load_max_over_mean(&self, pods: usize) -> f64 {
        let mut n = vec![0usize; pods];
        for r in self.ok() {
            if let Some(p) = r.pod.filter(|&p| p < pods) {
                n[p] += 1;
            }
        }
        let mean = n.iter().sum::<usize>() as f64 / pods.max(1) as f64;
        n.iter().copied().max().unwrap_or(0) as f64 / mean.max(f64::MIN_POSITIVE)
    }

    /// Requests answered 429 or 503 (shed by a router or a pod) over all sent.
    pub fn shed_share(&self) -> f64 {
        let shed = self
            .records
            .iter()
            .filter(|r| matches!(r.status, 429 | 503))
            .count();
        shed as f64 / self.records.len().max(1) as f64
    }

    pub fn errors(&self) -> usize {
        self.records.iter().filter(|r| r.error.is_some()).count()
    }

    pub fn line(&self) -> String {
        let vm = self.vm.map_or(String::new(), |(us, calls)| {
            format!(", vm {us:.0} us {calls:.0} calls per request")
        });
        format!(
            "{:<16} n {:>5} err {:>3} hit {:.3} ttft p50 {:.2} p90 {:.2} p99 {:.2} s, wall {:.1} s{vm}",
            self.name,
            self.records.len(),
            self.errors(),
            self.hit(),
            self.ttft(0.5),
            self.ttft(0.9),
            self.ttft(0.99),
            self.wall.as_secs_f64()
        )
    }
}
