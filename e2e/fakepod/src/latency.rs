//! The latency histograms an engine keeps of the requests it serves (time to first token, time
//! per output token, end to end), filled from the fake pod's own timings in wall seconds, and
//! what each engine observes when:
//!
//! * vLLM V1 (vLLM 0.33.0, `vllm/v1/metrics/stats.py` `IterationStats.update_from_output` and
//!   `update_from_finished_request`): TTFT once per request at its first token (from arrival);
//!   an inter-token latency per decode step after the first; at the finish the end-to-end time
//!   and the request's mean time per output token (decode time ÷ (tokens − 1), 0 for one token).
//! * vLLM V0 (vLLM 0.7.3, `vllm/engine/llm_engine.py` `_get_stats`): TTFT and a time per output
//!   token per decode step as they happen, the end-to-end time at the finish.
//! * SGLang (0.5.23, `python/sglang/srt/managers/tokenizer_manager.py` `collect_metrics`): TTFT at
//!   the first output, then per output the time since the previous one spread over the tokens it
//!   carried (its inter-token latency); a streamed request gets an output per
//!   `--stream-interval` tokens, a non-streamed one every `SGLANG_FORCE_STREAM_INTERVAL` (50,
//!   `python/sglang/srt/environ.py`) and at its end. At the finish, the end-to-end time and the
//!   per-request TPOT (more than one token only). A prefill server of a P/D pair observes neither
//!   TTFT, inter-token latency nor TPOT.
//! * TensorRT-LLM (trtllm-serve, NVIDIA/TensorRT-LLM@050f80de `tensorrt_llm/metrics/collector.py`
//!   `log_request_metrics_dict`, `tensorrt_llm/metrics/perf_utils.py`): everything when the
//!   request finishes: TTFT, end to end (to the last token) and TPOT = (last − first token) ÷
//!   (tokens − 1), each only when positive.
//!
//! Rendering is in latency_page.rs.

use crate::config::EngineKind;
use crate::histogram::Histogram;
use crate::pd::Role;
use tokio::time::Instant;

/// vLLM V1 TTFT bounds (vLLM 0.33.0 `vllm/v1/metrics/buckets.py` TIME_TO_FIRST_TOKEN_BUCKETS);
/// trtllm-serve's TTFT default is the same list (`tensorrt_llm/metrics/collector.py`).
pub const VLLM_TTFT: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM V1 inter-token latency and per-request TPOT bounds (INTER_TOKEN_LATENCY_BUCKETS);
/// trtllm-serve's TPOT default too.
pub const VLLM_ITL: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM V1 end-to-end bounds (REQUEST_LATENCY_BUCKETS); trtllm-serve's e2e default too.
pub const VLLM_E2E: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
/// vLLM V0 (0.7.3 `vllm/engine/metrics.py` `Metrics`): TTFT, time per output token, e2e.
pub const V0_TTFT: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
pub const V0_TPOT: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];
pub const V0_E2E: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
];
/// SGLang 0.5.23 `python/sglang/srt/observability/metrics_collector.py`
/// `TokenizerMetricsCollector` defaults: TTFT, end to end, inter-token latency (also the
/// per-request TPOT's).
pub const SGLANG_TTFT: &[f64] = &[
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
    400.0,
];
pub const SGLANG_E2E: &[f64] = &[
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
    400.0, 600.0, 1200.0, 1800.0, 2400.0,
];
pub const SGLANG_ITL: &[f64] = &[
    0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2,
    0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0,
];

/// SGLang sends a non-streamed request's output to its tokenizer every this many tokens.
const SGLANG_FORCE_STREAM_INTERVAL: u64 = 50;

/// One engine's (one rank's) latency histograms. The per-request ones are kept apart by
/// whether the request streamed (index 1), SGLang's `is_streaming` label; the other dialects
/// expose their sum.
#[derive(Clone, Debug, PartialEq)]
pub struct Latency {
    pub ttft: [Histogram; 2],
    /// One observation per output token after the first: vLLM's inter-token latency (V0: its
    /// time per output token), SGLang's inter-token latency.
    pub itl: Histogram,
    /// Each finished request's mean time per output token.
    pub tpot: [Histogram; 2],
    pub e2e: [Histogram; 2],
}

impl Latency {
    pub fn new(kind: EngineKind) -> Self {
        let (ttft, itl, tpot, e2e) = match kind {
            EngineKind::VllmV1 | EngineKind::TrtLlm => (VLLM_TTFT, VLLM_ITL, VLLM_ITL, VLLM_E2E),
            EngineKind::VllmV0 => (V0_TTFT, V0_TPOT, V0_TPOT, V0_E2E),
            EngineKind::Sglang => (SGLANG_TTFT, SGLANG_ITL, SGLANG_ITL, SGLANG_E2E),
        };
        let two = |b| [Histogram::new(b), Histogram::new(b)];
        Self {
            ttft: two(ttft),
            itl: Histogram::new(itl),
            tpot: two(tpot),
            e2e: two(e2e),
        }
    }

    /// Forgets every observation (`/admin/reset`, with the other counters).
    pub fn clear(&mut self) {
        let all = self
            .ttft
            .iter_mut()
            .chain(&mut self.tpot)
            .chain(&mut self.e2e);
        all.chain([&mut self.itl]).for_each(Histogram::clear);
    }
}

/// The two halves of a by-streaming pair as one histogram.
pub fn both(pair: &[Histogram; 2]) -> Histogram {
    let mut h = pair[0].clone();
    h.merge(&pair[1]);
    h
}

/// One request's timings as its engine records them, from its arrival to its last token.
#[derive(Debug)]
pub struct Timer {
    kind: EngineKind,
    /// An SGLang prefill server (P/D): no TTFT, inter-token latency or TPOT.
    sglang_prefill: bool,
    stream: bool,
    /// Output tokens the request makes.
    total: u64,
    arrived: Instant,
    first: Option<Instant>,
    /// When the last tokens were decoded.
    last: Instant,
    /// SGLang: tokens carried by the outputs so far (0: none yet) and when the last one left.
    out: (u64, Instant),
}

fn secs(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}

impl Timer {
    pub fn new(kind: EngineKind, role: Role, stream: bool, total: u64, arrived: Instant) -> Self {
        Self {
            kind,
            sglang_prefill: kind == EngineKind::Sglang && role == Role::Prefill,
            stream,
            total,
            arrived,
            first: None,
            last: arrived,
            out: (0, arrived),
        }
    }

    fn vllm(&self) -> bool {
        matches!(self.kind, EngineKind::VllmV1 | EngineKind::VllmV0)
    }

    /// Output tokens `[from, to)` were decoded, the last at `now` (one decode step each, equal
    /// within the group); with the request's last token, it is finished.
    pub fn tokens(&mut self, lat: &mut Latency, from: u64, to: u64, now: Instant) {
        let s = usize::from(self.stream);
        let n = to.saturating_sub(from);
        if from == 0 {
            self.first = Some(now);
            let ttft = secs(now - self.arrived);
            if self.vllm() || (self.kind == EngineKind::Sglang && !self.sglang_prefill) {
                lat.ttft[s].observe(ttft);
            }
        } else if self.vllm() && n > 0 {
            lat.itl.observe_n(secs(now - self.last) / n as f64, n);
        }
        if self.kind == EngineKind::Sglang && !self.sglang_prefill {
            for (k, at) in self.sglang_outputs(from, to, now) {
                let (sent, sent_at) = self.out;
                if sent > 0 && k > sent {
                    let m = k - sent;
                    lat.itl.observe_n(secs(at - sent_at) / m as f64, m);
                }
                self.out = (k, at);
            }
        }
        self.last = now;
        if to >= self.total {
            self.finished(lat, now);
        }
    }

    /// The outputs SGLang's scheduler sends its tokenizer while tokens `[from, to)` are
    /// decoded: (tokens so far, when).
    fn sglang_outputs(&self, from: u64, to: u64, now: Instant) -> Vec<(u64, Instant)> {
        if self.stream {
            return vec![(to, now)];
        }
        let every = SGLANG_FORCE_STREAM_INTERVAL;
        let step = (now - self.last) / (to - from).max(1) as u32;
        let mut out: Vec<(u64, Instant)> = (from / every + 1..)
            .map(|i| i * every)
            .take_while(|k| *k <= to)
            .map(|k| (k, self.last + step * (k - from) as u32))
            .collect();
        if to == self.total && !to.is_multiple_of(every) {
            out.push((to, now));
        }
        out
    }

    /// The request's last token was decoded at `now`: what its engine records at the finish.
    fn finished(&self, lat: &mut Latency, now: Instant) {
        let s = usize::from(self.stream);
        let e2e = secs(now - self.arrived);
        let decode = self.first.map_or(0.0, |f| secs(self.last - f));
        let per_token = (self.total > 1).then(|| decode / (self.total - 1) as f64);
        match self.kind {
            EngineKind::VllmV1 => {
                lat.e2e[s].observe(e2e);
                lat.tpot[s].observe(per_token.unwrap_or(0.0));
            }
            EngineKind::VllmV0 => lat.e2e[s].observe(e2e),
            EngineKind::Sglang => {
                lat.e2e[s].observe(e2e);
                match per_token {
                    Some(t) if t > 0.0 && !self.sglang_prefill => lat.tpot[s].observe(t),
                    _ => {}
                }
            }
            EngineKind::TrtLlm => {
                let ttft = self.first.map_or(0.0, |f| secs(f - self.arrived));
                let positive = |v: f64| (v > 0.0).then_some(v);
                if let Some(v) = positive(e2e) {
                    lat.e2e[s].observe(v);
                }
                if let Some(v) = positive(ttft) {
                    lat.ttft[s].observe(v);
                }
                if let Some(v) = per_token.and_then(positive) {
                    lat.tpot[s].observe(v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Feeds `total` tokens one per 10 ms after a 100 ms TTFT, in groups of `interval`.
    fn run(kind: EngineKind, role: Role, stream: bool, total: u64, interval: u64) -> Latency {
        let mut lat = Latency::new(kind);
        let t0 = Instant::now();
        let mut t = Timer::new(kind, role, stream, total, t0);
        let at = |k: u64| t0 + Duration::from_millis(100 + 10 * (k - 1));
        t.tokens(&mut lat, 0, 1, at(1));
        let mut from = 1;
        while from < total {
            let to = (from + interval).min(total);
            t.tokens(&mut lat, from, to, at(to));
            from = to;
        }
        lat
    }

    #[test]
    fn each_engine_observes_what_it_observes() {
        let v1 = run(EngineKind::VllmV1, Role::Colocated, false, 11, 4);
        assert_eq!((v1.ttft[0].count(), v1.itl.count()), (1, 10));
        assert!((v1.itl.sum() - 0.1).abs() < 1e-9, "{}", v1.itl.sum());
        assert!((v1.tpot[0].sum() - 0.01).abs() < 1e-9);
        assert!((v1.e2e[0].sum() - 0.2).abs() < 1e-9);
        let one = run(EngineKind::VllmV1, Role::Colocated, true, 1, 1);
        assert_eq!((one.tpot[1].count(), one.tpot[1].sum()), (1, 0.0));
        // SGLang, streamed: every output; not streamed: at 50, 100 and the end only.
        let sg = run(EngineKind::Sglang, Role::Colocated, true, 11, 4);
        assert_eq!(
            (sg.ttft[1].count(), sg.itl.count(), sg.tpot[1].count()),
            (1, 10, 1)
        );
        let quiet = run(EngineKind::Sglang, Role::Colocated, false, 40, 1);
        assert_eq!((quiet.ttft[0].count(), quiet.itl.count()), (1, 0));
        let long = run(EngineKind::Sglang, Role::Colocated, false, 120, 3);
        assert_eq!(long.itl.count(), 70, "from the 50th token's output on");
        assert!((long.itl.sum() - 0.7).abs() < 1e-9, "{}", long.itl.sum());
        let prefill = run(EngineKind::Sglang, Role::Prefill, false, 1, 1);
        assert_eq!(prefill.ttft[0].count() + prefill.tpot[0].count(), 0);
        assert_eq!(prefill.e2e[0].count(), 1);
        // TensorRT-LLM: all at the finish, no TPOT for one token.
        let trt = run(EngineKind::TrtLlm, Role::Colocated, false, 1, 1);
        assert_eq!((trt.ttft[0].count(), trt.tpot[0].count()), (1, 0));
        let mut lat = run(EngineKind::VllmV0, Role::Colocated, false, 3, 1);
        assert_eq!((lat.itl.count(), both(&lat.e2e).count()), (2, 1));
        lat.clear();
        assert_eq!(lat, Latency::new(EngineKind::VllmV0));
    }
}
