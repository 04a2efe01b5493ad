//! Aggregation of outcomes into the run summary.

use super::client::Outcome;
use crate::engine::Snapshot;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// Percentiles of a sample in milliseconds (nearest-rank); all zero when empty.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Percentiles {
    pub n: usize,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    pub fn of(durations: impl Iterator<Item = Duration>) -> Self {
        let mut v: Vec<f64> = durations.map(|d| d.as_secs_f64() * 1000.0).collect();
        if v.is_empty() {
            return Self::default();
        }
        v.sort_by(f64::total_cmp);
        let rank = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Self {
            n: v.len(),
            mean: v.iter().sum::<f64>() / v.len() as f64,
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: v[v.len() - 1],
        }
    }
}

/// Server-side view of the fake pods after the run (from `/admin/state`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PodReport {
    pub pods: Vec<Snapshot>,
    /// Sum of hit tokens / sum of queried tokens over all pods.
    pub prefix_hit_rate: f64,
    /// Largest queue any pod saw.
    pub max_peak_waiting: usize,
    /// Max / mean of per-pod served requests (1.0 = perfectly even).
    pub imbalance: f64,
}

impl PodReport {
    pub fn from_pods(pods: Vec<Snapshot>) -> Self {
        let q: u64 = pods.iter().map(|p| p.prefix_query_tokens).sum();
        let h: u64 = pods.iter().map(|p| p.prefix_hit_tokens).sum();
        let counts: Vec<u64> = pods.iter().map(|p| p.requests_total).collect();
        let mean = counts.iter().sum::<u64>() as f64 / counts.len().max(1) as f64;
        Self {
            prefix_hit_rate: if q == 0 { 0.0 } else { h as f64 / q as f64 },
            max_peak_waiting: pods.iter().map(|p| p.peak_waiting).max().unwrap_or(0),
            imbalance: if mean > 0.0 {
                counts.iter().copied().max().unwrap_or(0) as f64 / mean
            } else {
                0.0
            },
            pods,
        }
    }
}

/// Result of one load run (also the CLI's JSON).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub workload: String,
    pub seed: u64,
    pub targets: Vec<String>,
    /// Digest of the planned request sequence; equal seeds and settings give equal digests.
    pub sequence: String,
    pub count: usize,
    pub ok: usize,
    /// Failed requests by kind (`status:503`, `reset`, `truncated`, `timeout`, ...).
    pub errors: BTreeMap<String, usize>,
    /// Client-side aborts that were planned (also counted under `errors.aborted`).
    pub aborted: usize,
    /// Over successful requests.
    pub ttft_ms: Percentiles,
    pub latency_ms: Percentiles,
    /// Responses per `x-pod` header value (any status).
    pub per_pod: BTreeMap<String, usize>,
    /// Requests per target URL.
    pub per_target: BTreeMap<String, usize>,
    pub wall_s: f64,
    pub rps: f64,
    /// Present when admin URLs were given.
    pub pods: Option<PodReport>,
}

impl Summary {
    pub fn build(
        workload: &str,
        seed: u64,
        targets: &[String],
        sequence: String,
        outcomes: &[Outcome],
        wall: Duration,
    ) -> Self {
        let mut s = Summary {
            workload: workload.into(),
            seed,
            targets: targets.to_vec(),
            sequence,
            count: outcomes.len(),
            wall_s: wall.as_secs_f64(),
            ..Summary::default()
        };
        for o in outcomes {
            match &o.error {
                None => s.ok += 1,
                Some(kind) => {
                    *s.errors.entry(kind.clone()).or_default() += 1;
                    if kind == "aborted" {
                        s.aborted += 1;
                    }
                }
            }
            if let Some(p) = &o.pod {
                *s.per_pod.entry(p.clone()).or_default() += 1;
            }
            if let Some(t) = targets.get(o.target) {
                *s.per_target.entry(t.clone()).or_default() += 1;
            }
        }
        let ok = || outcomes.iter().filter(|o| o.error.is_none());
        s.ttft_ms = Percentiles::of(ok().filter_map(|o| o.ttft));
        s.latency_ms = Percentiles::of(ok().map(|o| o.latency));
        s.rps = if s.wall_s > 0.0 {
            s.count as f64 / s.wall_s
        } else {
            0.0
        };
        s
    }

    /// One human-readable line.
    pub fn line(&self) -> String {
        let errors = if self.errors.is_empty() {
            "none".to_string()
        } else {
            self.errors
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let pods = self
            .per_pod
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut line = format!(
            "{} seed={} n={} ok={} err=[{errors}] ttft p50/p90/p99={:.1}/{:.1}/{:.1}ms \
             lat p50/p90/p99={:.1}/{:.1}/{:.1}ms wall={:.2}s pods=[{pods}]",
            self.workload,
            self.seed,
            self.count,
            self.ok,
            self.ttft_ms.p50,
            self.ttft_ms.p90,
            self.ttft_ms.p99,
            self.latency_ms.p50,
            self.latency_ms.p90,
            self.latency_ms.p99,
            self.wall_s,
        );
        if let Some(p) = &self.pods {
            line.push_str(&format!(
                " hit={:.1}% peak_wait={} imbalance={:.2}",
                p.prefix_hit_rate * 100.0,
                p.max_peak_waiting,
                p.imbalance
            ));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let p = Percentiles::of((1..=100).map(Duration::from_millis));
        assert_eq!((p.p50, p.p90, p.p99, p.max), (50.0, 90.0, 99.0, 100.0));
        assert_eq!(Percentiles::of(std::iter::empty()).n, 0);
    }
}
