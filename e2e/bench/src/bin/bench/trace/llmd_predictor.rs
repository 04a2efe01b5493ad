//! The llm-d-style reference with predicted latency: llm-d's predicted-latency scheduler in
//! one process (docs/trace-bench.md "The SLO section"), as its chart configures it by default
//! (`llm-d/llm-d-inference-scheduler`, `config/charts/epplib/templates/_config.yaml`, with the
//! latency predictor on): `strict-affinity-filter` (prefix score ≥ 0.99), then
//! `slo-headroom-tier-filter`, then `loose-affinity-filter` (≥ 0.80), then `latency-scorer`,
//! then `weighted-random-picker`.
//!
//! * One latency model for every pod, as llm-d's predictor assumes a homogeneous pool (its
//!   guide: "the predictor assumes a single pod shape"): TTFT = a + b · (prefill tokens in
//!   flight on the pod + this request's uncached tokens) + c · running requests, TPOT = d +
//!   e · running, fitted on the latest samples of the requests it routed (window_fit.rs; llm-d
//!   retrains XGBoost on a sliding window) and timed here: pick → first token → last.
//! * Prefix scores from an approximate index per pod (peer.rs's LRU of the blocks it routed),
//!   over the first 256 blocks; a request's uncached tokens are its prompt × (1 − score).
//! * Affinity filter (`prefixcacheaffinity`): keep the pods scoring at least the threshold
//!   unless none does, 1 % of requests skip it, and stickiness breaks when the best sticky
//!   pod's predicted TTFT exceeds the best other one's by more than 5,000 ms.
//! * Tier filter (`sloheadroomtier`): pods predicted to meet both SLOs, else the rest; when
//!   both exist 1 % of requests take the negative tier.
//! * Scorer (`scorer/latency`, default strategy `least`): positive headroom is scored so the
//!   pod closest to its SLOs scores highest (best fit: the rest stay free), TTFT headroom
//!   weighted 0.8 and TPOT 0.2, each normalised over the candidates; with only negative
//!   headroom, idle pods first, then the pods missing TPOT only, then TTFT only, then both,
//!   the smallest deficit scoring highest.
//! * Picker: a weighted random draw by score (A-Res, `picker/weightedrandom`).
//!
//! Random draws are seeded by the request's index, so a run is reproducible.

use super::peer::{Lru, MAX_PREFIX_BLOCKS};
use super::window_fit::WindowFit;
use ailb_bench::trace::replay::{Dispatch, Router};
use ailb_fakepod::rng::Rng;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

const STRICT_AFFINITY: f64 = 0.99;
const LOOSE_AFFINITY: f64 = 0.80;
const EXPLORE: f64 = 0.01;
const TTFT_WEIGHT: f64 = 0.8;
const TPOT_WEIGHT: f64 = 0.2;

/// What the predictor is told (all in wall time: it times requests itself).
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    pub slo_ttft_ms: f64,
    pub slo_tpot_ms: f64,
    /// `maxTTFTPenaltyMs` in wall time.
    pub penalty_ms: f64,
    /// Starting coefficients: TTFT ms at no load, ms per 1,000 prompt tokens (one calibrated
    /// rate for the fleet), ms per running request; TPOT ms at no load, ms per running request.
    pub ttft_prior: [f64; 3],
    pub tpot_prior: [f64; 2],
    pub capacity_blocks: usize,
}

/// A routed request until its last byte.
struct Open {
    pod: usize,
    booked: f64,
    ttft_x: [f64; 3],
    tpot_x: [f64; 2],
    predicted_ttft: f64,
    output_tokens: u64,
    sent: Instant,
    first: Option<Instant>,
}

struct State {
    index: Vec<Lru>,
    /// Uncached prompt tokens dispatched to each pod and not at their first token yet.
    in_flight: Vec<f64>,
    /// Requests dispatched to each pod and not done.
    running: Vec<usize>,
    ttft: WindowFit<3>,
    tpot: WindowFit<2>,
    open: HashMap<usize, Open>,
    /// Per pod: Σ |predicted − measured| / measured TTFT, and the count.
    ape: Vec<(f64, usize)>,
}

pub struct LlmdPredictor {
    setup: Setup,
    state: Mutex<State>,
}

/// One candidate's prediction.
#[derive(Clone, Copy)]
struct Candidate {
    pod: usize,
    score: f64,
    ttft: f64,
    tpot: f64,
    running: usize,
}

impl Candidate {
    fn ttft_headroom(&self, s: &Setup) -> f64 {
        s.slo_ttft_ms - self.ttft
    }
    fn tpot_headroom(&self, s: &Setup) -> f64 {
        s.slo_tpot_ms - self.tpot
    }
    fn positive(&self, s: &Setup) -> bool {
        self.ttft_headroom(s) >= 0.0 && self.tpot_headroom(s) >= 0.0
    }
}

impl LlmdPredictor {
    pub fn new(pods: usize, setup: Setup) -> Self {
        LlmdPredictor {
            setup,
            state: Mutex::new(State {
                index: (0..pods).map(|_| Lru::default()).collect(),
                in_flight: vec![0.0; pods],
                running: vec![0; pods],
                ttft: WindowFit::new(setup.ttft_prior),
                tpot: WindowFit::new(setup.tpot_prior),
                open: HashMap::new(),
                ape: vec![(0.0, 0); pods],
            }),
        }
    }

    /// Mean absolute percentage error of its TTFT predictions, per pod (None without samples).
    pub fn ttft_mape(&self) -> Vec<Option<f64>> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.ape
            .iter()
            .map(|&(s, n)| (n > 0).then(|| s / n as f64))
            .collect()
    }

    /// The fitted coefficients, TTFT then TPOT.
    pub fn coefficients(&self) -> ([f64; 3], [f64; 2]) {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        (st.ttft.coefficients(), st.tpot.coefficients())
    }
}

/// `prefix-cache-affinity-filter` over `set`.
fn affinity(set: Vec<Candidate>, threshold: f64, s: &Setup, rng: &mut Rng) -> Vec<Candidate> {
    if set.len() <= 1 || rng.chance(EXPLORE) {
        return set;
    }
    let (sticky, other): (Vec<Candidate>, Vec<Candidate>) =
        set.iter().copied().partition(|c| c.score >= threshold);
    if sticky.is_empty() {
        return set;
    }
    let best = |v: &[Candidate]| v.iter().map(|c| c.ttft).fold(f64::INFINITY, f64::min);
    if !other.is_empty() && best(&sticky) - best(&other) > s.penalty_ms {
        return set;
    }
    sticky
}

/// `slo-headroom-tier-filter` over `set`.
fn tier(set: Vec<Candidate>, s: &Setup, rng: &mut Rng) -> Vec<Candidate> {
    let (pos, neg): (Vec<Candidate>, Vec<Candidate>) = set.into_iter().partition(|c| c.positive(s));
    match (pos.is_empty(), neg.is_empty()) {
        (false, false) if rng.chance(EXPLORE) => neg,
        (false, _) => pos,
        (true, _) => neg,
    }
}

/// `latency-scorer`, strategy `least`: the candidates to score and their scores.
fn scores(set: &[Candidate], s: &Setup) -> Vec<(usize, f64)> {
    let pos: Vec<Candidate> = set.iter().copied().filter(|c| c.positive(s)).collect();
    let bucket: Vec<Candidate> = if !pos.is_empty() {
        pos
    } else if set.iter().any(|c| c.running == 0) {
        set.iter().copied().filter(|c| c.running == 0).collect()
    } else {
        let ttft_neg = |c: &Candidate| c.ttft_headroom(s) < 0.0;
        let tpot_neg = |c: &Candidate| c.tpot_headroom(s) < 0.0;
        let buckets: [Vec<Candidate>; 3] = [
            set.iter()
                .copied()
                .filter(|c| tpot_neg(c) && !ttft_neg(c))
                .collect(),
            set.iter()
                .copied()
                .filter(|c| ttft_neg(c) && !tpot_neg(c))
                .collect(),
            set.iter()
                .copied()
                .filter(|c| ttft_neg(c) && tpot_neg(c))
                .collect(),
        ];
        buckets
            .into_iter()
            .find(|b| !b.is_empty())
            .unwrap_or_else(|| set.to_vec())
    };
    let range = |f: &dyn Fn(&Candidate) -> f64| {
        let v: Vec<f64> = bucket.iter().map(f).collect();
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lo, hi - lo)
    };
    let (t_lo, t_range) = range(&|c| c.ttft_headroom(s).abs());
    let (p_lo, p_range) = range(&|c| c.tpot_headroom(s).abs());
    let (mut a, mut b) = (TTFT_WEIGHT, TPOT_WEIGHT);
    // A dimension all candidates share says nothing: the other decides alone.
    if t_range <= 1e-9 && p_range > 1e-9 {
        (a, b) = (0.0, 1.0);
    } else if p_range <= 1e-9 && t_range > 1e-9 {
        (a, b) = (1.0, 0.0);
    }
    let norm = |h: f64, lo: f64, r: f64| if r > 1e-9 { (h - lo) / r } else { 0.5 };
    bucket
        .iter()
        .map(|c| {
            let combined = a * norm(c.ttft_headroom(s).abs(), t_lo, t_range)
                + b * norm(c.tpot_headroom(s).abs(), p_lo, p_range);
            // "least": closest to the SLO (or the smallest deficit) scores highest.
            (c.pod, (((1.0 - combined) * 100.0).floor() + 1.0) / 100.0)
        })
        .collect()
}

/// `weighted-random-picker`: the largest u^(1/w).
fn weighted_pick(scored: &[(usize, f64)], rng: &mut Rng) -> Option<usize> {
    scored
        .iter()
        .map(|&(p, w)| (p, (1.0 - rng.f64()).powf(1.0 / w.max(1e-9))))
        .max_by(|x, y| x.1.total_cmp(&y.1))
        .map(|(p, _)| p)
}

impl Router for LlmdPredictor {
    fn pick(&self, d: &Dispatch<'_>) -> usize {
        let s = &self.setup;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut rng = Rng::derive(0x11d, &[d.index as u64]);
        let hashes = &d.hashes[..d.hashes.len().min(MAX_PREFIX_BLOCKS)];
        let total = hashes.len().max(1) as f64;
        let prompt = d.prompt_tokens as f64;
        let features = |st: &State, p: usize, score: f64| {
            let uncached = prompt * (1.0 - score);
            let running = st.running[p] as f64;
            (
                uncached,
                [1.0, (st.in_flight[p] + uncached) / 1000.0, running],
                [1.0, running],
            )
        };
        let candidates: Vec<Candidate> = (0..st.index.len())
            .map(|p| {
                let score = st.index[p].leading(hashes) as f64 / total;
                let (_, tx, px) = features(&st, p, score);
                Candidate {
                    pod: p,
                    score,
                    ttft: st.ttft.predict(&tx),
                    tpot: st.tpot.predict(&px),
                    running: st.running[p],
                }
            })
            .collect();
        let set = affinity(candidates.clone(), STRICT_AFFINITY, s, &mut rng);
        let set = tier(set, s, &mut rng);
        let set = affinity(set, LOOSE_AFFINITY, s, &mut rng);
        let c = weighted_pick(&scores(&set, s), &mut rng)
            .and_then(|p| candidates.iter().find(|c| c.pod == p).copied())
            .unwrap_or(candidates[d.index % candidates.len()]);
        let (uncached, ttft_x, tpot_x) = features(&st, c.pod, c.score);
        st.in_flight[c.pod] += uncached;
        st.running[c.pod] += 1;
        st.open.insert(
            d.index,
            Open {
                pod: c.pod,
                booked: uncached,
                ttft_x,
                tpot_x,
                predicted_ttft: c.ttft,
                output_tokens: d.output_tokens,
                sent: Instant::now(),
                first: None,
            },
        );
        let cap = s.capacity_blocks;
        // Back to front, so a prompt's first blocks are the most recent (as the pods' LRU does).
        for &h in d.hashes.iter().take(MAX_PREFIX_BLOCKS).rev() {
            st.index[c.pod].touch(h, cap);
        }
        c.pod
    }

    fn first_token(&self, _: usize, index: usize) {
        let now = Instant::now();
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(o) = st.open.get_mut(&index) else {
            return;
        };
        if o.first.is_some() {
            return;
        }
        o.first = Some(now);
        let (pod, booked, x, predicted) = (o.pod, o.booked, o.ttft_x, o.predicted_ttft);
        let ttft = (now - o.sent).as_secs_f64() * 1e3;
        st.in_flight[pod] = (st.in_flight[pod] - booked).max(0.0);
        if ttft > 0.0 {
            st.ape[pod].0 += (predicted - ttft).abs() / ttft;
            st.ape[pod].1 += 1;
        }
        st.ttft.add(x, ttft);
    }

    fn done(&self, _: usize, index: usize) {
        let now = Instant::now();
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(o) = st.open.remove(&index) else {
            return;
        };
        st.running[o.pod] = st.running[o.pod].saturating_sub(1);
        if let (Some(first), true) = (o.first, o.output_tokens >= 2) {
            let tpot = (now - first).as_secs_f64() * 1e3 / (o.output_tokens - 1) as f64;
            st.tpot.add(o.tpot_x, tpot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> Setup {
        Setup {
            slo_ttft_ms: 100.0,
            slo_tpot_ms: 10.0,
            penalty_ms: 1000.0,
            ttft_prior: [0.0; 3],
            tpot_prior: [0.0; 2],
            capacity_blocks: 16,
        }
    }

    fn c(pod: usize, ttft: f64, tpot: f64, running: usize) -> Candidate {
        Candidate {
            pod,
            score: 0.0,
            ttft,
            tpot,
            running,
        }
    }

    #[test]
    fn best_fit_among_pods_meeting_the_slos_else_the_least_deficit() {
        let s = setup();
        // Both meet the SLOs: the one closest to them (pod 1) scores highest.
        let sc = scores(&[c(0, 10.0, 2.0, 3), c(1, 90.0, 9.0, 3)], &s);
        assert!(sc[1].1 > sc[0].1, "{sc:?}");
        // Only one meets them: it is the only one scored.
        let sc = scores(&[c(0, 10.0, 2.0, 3), c(1, 190.0, 9.0, 3)], &s);
        assert_eq!(sc.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0]);
        // None does: an idle pod first, whatever its prediction.
        let sc = scores(&[c(0, 500.0, 20.0, 0), c(1, 150.0, 12.0, 2)], &s);
        assert_eq!(sc.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0]);
        // None idle: the pods missing TPOT only, and the smallest deficit scores highest.
        let sc = scores(
            &[
                c(0, 500.0, 20.0, 1),
                c(1, 50.0, 30.0, 2),
                c(2, 50.0, 12.0, 2),
            ],
            &s,
        );
        assert_eq!(sc.len(), 2);
        assert!(sc.iter().find(|x| x.0 == 2).unwrap().1 > sc.iter().find(|x| x.0 == 1).unwrap().1);
    }

    #[test]
    fn the_tier_filter_keeps_the_pods_meeting_the_slos() {
        let s = setup();
        let set = vec![c(0, 10.0, 2.0, 1), c(1, 190.0, 9.0, 1)];
        let kept: usize = (0..1000)
            .filter(|&i| {
                tier(set.clone(), &s, &mut Rng::new(i))
                    .first()
                    .map(|c| c.pod)
                    == Some(0)
            })
            .count();
        // 1 % explore the other tier.
        assert!((970..=999).contains(&kept), "{kept}");
    }
}
