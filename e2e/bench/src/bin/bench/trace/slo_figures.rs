//! The SLO section's figures of one run (docs/trace-bench.md "The SLO section"), in trace
//! time: TTFT at the pod (`fake_ttft_us`, from the pod having the request to its first token,
//! as the trace bench measures it: the client's own TTFT also holds the gateway's and the
//! client's milliseconds, which the time compression multiplies by 50); end-to-end latency as
//! that TTFT plus the answer's streaming as the client saw it (first to last byte); TPOT as
//! that streaming ÷ (output tokens − 1), per full-size token; SLO attainment and goodput, shed
//! share, and the plugin's TTFT prediction error where its debug header gives its prediction.

use super::fleet::Scale;
use super::run::{pct, Run};
use crate::common::median;
use ailb_bench::trace::replay::{debug_field, Record};
use std::collections::BTreeMap;

/// The SLOs, trace time: TTFT in seconds, TPOT in seconds per full-size output token.
#[derive(Clone, Copy, Debug)]
pub struct Slo {
    pub ttft_s: f64,
    pub tpot_s: f64,
}

impl Slo {
    /// The same SLOs in whole wall milliseconds, as the plugin takes them (its `latencyModel`
    /// keys are whole numbers and it rounds the headers): every router and figure uses these.
    pub fn in_whole_wall_ms(&self, s: Scale) -> Slo {
        let whole = |ms: f64| ms.round().max(1.0);
        Slo {
            ttft_s: whole(self.ttft_wall_ms(s)) * s.time / 1e3,
            tpot_s: whole(self.tpot_wall_ms(s)) * s.tokens * s.time / 1e3,
        }
    }

    /// The TTFT SLO in wall milliseconds at scale `s` (what the plugin and the headers get).
    pub fn ttft_wall_ms(&self, s: Scale) -> f64 {
        self.ttft_s * 1e3 / s.time
    }

    /// The TPOT SLO in wall milliseconds per output token as the pods count them (scaled).
    pub fn tpot_wall_ms(&self, s: Scale) -> f64 {
        self.tpot_s * 1e3 / s.tokens / s.time
    }
}

/// One run's figures (seconds of trace time; shares in 0..1).
#[derive(Clone, Copy, Debug, Default)]
pub struct Figures {
    pub e2e_p50: f64,
    pub ttft_p50: f64,
    pub ttft_p95: f64,
    pub tpot_p99: f64,
    /// Requests meeting both SLOs over all sent (failed and shed ones miss).
    pub attainment: f64,
    /// Requests meeting both SLOs per second of the ladder.
    pub goodput: f64,
    /// Answered 429 or 503 over all sent.
    pub shed: f64,
    /// The median over pods of each pod's mean |predicted − measured| ÷ measured TTFT, where
    /// the debug header carries `predicted_ttft_ms`.
    pub ttft_mape: Option<f64>,
}

/// What an answered request took: TTFT at the pod, end to end, and TPOT per full-size token
/// (None under two output tokens), trace seconds.
#[derive(Clone, Copy)]
struct Took {
    ttft: f64,
    e2e: f64,
    tpot: Option<f64>,
}

fn took(r: &Record, s: Scale) -> Option<Took> {
    if r.error.is_some() || r.status != 200 {
        return None;
    }
    let ttft = r.ttft_pod?.as_secs_f64();
    let streaming = r.e2e?.saturating_sub(r.ttft_client?).as_secs_f64();
    let tpot = (r.output_tokens >= 2).then(|| streaming / (r.output_tokens - 1) as f64 * s.tokens);
    Some(Took {
        ttft,
        e2e: ttft + streaming,
        tpot,
    })
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// The figures of `run` against `slo` over a ladder of `span_s` trace seconds.
pub fn figures(run: &Run, slo: Slo, span_s: f64, s: Scale) -> Figures {
    let answered: Vec<Took> = run.records.iter().filter_map(|r| took(r, s)).collect();
    let e2e = sorted(answered.iter().map(|t| t.e2e).collect());
    let ttft = sorted(answered.iter().map(|t| t.ttft).collect());
    let tpot = sorted(answered.iter().filter_map(|t| t.tpot).collect());
    let met = answered
        .iter()
        .filter(|t| t.ttft <= slo.ttft_s && t.tpot.is_none_or(|p| p <= slo.tpot_s))
        .count();
    Figures {
        e2e_p50: pct(&e2e, 0.5),
        ttft_p50: pct(&ttft, 0.5),
        ttft_p95: pct(&ttft, 0.95),
        tpot_p99: pct(&tpot, 0.99),
        attainment: met as f64 / run.records.len().max(1) as f64,
        goodput: met as f64 / span_s,
        shed: run.shed_share(),
        ttft_mape: ttft_mape(run, s),
    }
}

/// Per pod, the mean absolute percentage error of the plugin's predicted TTFT (wall ms, its
/// debug header's `predicted_ttft_ms`) against the TTFT the client saw; the median over the
/// pods.
fn ttft_mape(run: &Run, s: Scale) -> Option<f64> {
    let mut per_pod: BTreeMap<usize, (f64, usize)> = BTreeMap::new();
    for r in &run.records {
        let predicted = debug_field(r.debug.as_deref(), "predicted_ttft_ms")
            .and_then(|v| v.parse::<f64>().ok());
        let (Some(predicted), Some(pod), Some(ttft), 200) =
            (predicted, r.pod, r.ttft_client, r.status)
        else {
            continue;
        };
        let measured_ms = ttft.as_secs_f64() * 1e3 / s.time;
        if measured_ms > 0.0 {
            let e = per_pod.entry(pod).or_default();
            e.0 += (predicted - measured_ms).abs() / measured_ms;
            e.1 += 1;
        }
    }
    let v: Vec<f64> = per_pod.values().map(|&(s, n)| s / n as f64).collect();
    (!v.is_empty()).then(|| median(&v))
}

/// Non-200 answers by status (0: no answer), for the log beside the shed share.
pub fn statuses(run: &Run) -> BTreeMap<u16, usize> {
    let mut m = BTreeMap::new();
    for r in run.records.iter().filter(|r| r.status != 200) {
        *m.entry(r.status).or_default() += 1;
    }
    m
}

impl Figures {
    pub fn line(&self, name: &str) -> String {
        format!(
            "{name:<16} e2e p50 {:.2} s, ttft p50 {:.3} p95 {:.2} s, tpot p99 {:.0} ms, slo met {:.3}, goodput {:.3}/s, shed {:.3}{}",
            self.e2e_p50,
            self.ttft_p50,
            self.ttft_p95,
            self.tpot_p99 * 1e3,
            self.attainment,
            self.goodput,
            self.shed,
            self.ttft_mape
                .map_or(String::new(), |m| format!(", ttft mape {m:.3}"))
        )
    }
}
