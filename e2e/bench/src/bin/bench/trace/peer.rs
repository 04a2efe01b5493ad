//! The peer: an llm-d-style single-process scheduler, "sticky until saturated" (llm-d router's
//! default since 2026-08, docs/trace-bench.md "Routers"):
//!
//! * an approximate prefix index: for every pod, the block hashes of the requests it routed
//!   there, in an LRU as large as the pod's KV in blocks (llm-d's `autoTune` takes both the
//!   block size and the capacity from the engine); a request's score on a pod is its matched
//!   leading blocks over its blocks, both counted within the first `maxPrefixBlocksToMatch`;
//! * `prefix-cache-affinity-filter`: pods scoring at least `affinityThreshold` (0.8) are the
//!   sticky set; stickiness breaks when the best sticky pod's estimated TTFT exceeds the best
//!   other pod's by more than `maxTTFTPenaltyMs` (5,000), TTFT estimated as (tokens in flight
//!   + the request's uncached tokens) ÷ `peakPrefillThroughput`; 1 % of requests explore;
//! * `token-load-scorer` inside the set: the fewest tokens in flight;
//! * tokens in flight: the request's uncached prompt tokens (prompt × (1 − score)), booked at
//!   dispatch and released at its first streamed token.

use ailb_bench::trace::replay::{Dispatch, Router};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

pub const AFFINITY_THRESHOLD: f64 = 0.8;
pub const MAX_TTFT_PENALTY_S: f64 = 5.0;
pub const MAX_PREFIX_BLOCKS: usize = 256;

/// One pod's LRU of block hashes (llmd_predictor.rs keeps its index the same way).
#[derive(Default)]
pub(super) struct Lru {
    tick: u64,
    at: HashMap<u64, u64>,
    order: BTreeMap<u64, u64>,
}

impl Lru {
    pub(super) fn touch(&mut self, h: u64, cap: usize) {
        self.tick += 1;
        if let Some(old) = self.at.insert(h, self.tick) {
            self.order.remove(&old);
        }
        self.order.insert(self.tick, h);
        while self.at.len() > cap {
            let Some((_, v)) = self.order.pop_first() else {
                break;
            };
            self.at.remove(&v);
        }
    }

    pub(super) fn leading(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.at.contains_key(h))
            .count()
    }
}

struct State {
    index: Vec<Lru>,
    in_flight: Vec<f64>,
    /// Tokens booked per request, released at its first token.
    booked: HashMap<usize, (usize, f64)>,
}

pub struct LlmdStyle {
    /// Prefill tokens per second (trace time, scaled tokens): one calibrated number.
    peak_rate: f64,
    capacity_blocks: usize,
    state: Mutex<State>,
}

impl LlmdStyle {
    pub fn new(pods: usize, peak_rate: f64, capacity_blocks: usize) -> Self {
        LlmdStyle {
            peak_rate: peak_rate.max(1.0),
            capacity_blocks,
            state: Mutex::new(State {
                index: (0..pods).map(|_| Lru::default()).collect(),
                in_flight: vec![0.0; pods],
                booked: HashMap::new(),
            }),
        }
    }
}

/// A deterministic 1 % of requests.
fn explores(index: usize) -> bool {
    ailb_core::hash::SplitMix64(index as u64)
        .next_u64()
        .is_multiple_of(100)
}

impl Router for LlmdStyle {
    fn pick(&self, d: &Dispatch<'_>) -> usize {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let n = st.index.len();
        let hashes = &d.hashes[..d.hashes.len().min(MAX_PREFIX_BLOCKS)];
        let total = hashes.len().max(1) as f64;
        let score: Vec<f64> = st
            .index
            .iter()
            .map(|l| l.leading(hashes) as f64 / total)
            .collect();
        let ttft = |p: usize| {
            (st.in_flight[p] + d.prompt_tokens as f64 * (1.0 - score[p])) / self.peak_rate
        };
        let all: Vec<usize> = (0..n).collect();
        let sticky: Vec<usize> = all
            .iter()
            .copied()
            .filter(|&p| score[p] >= AFFINITY_THRESHOLD)
            .collect();
        let others: Vec<usize> = all
            .iter()
            .copied()
            .filter(|&p| score[p] < AFFINITY_THRESHOLD)
            .collect();
        let best = |set: &[usize]| set.iter().map(|&p| ttft(p)).fold(f64::INFINITY, f64::min);
        let saturated = !others.is_empty() && best(&sticky) - best(&others) > MAX_TTFT_PENALTY_S;
        let set = if sticky.is_empty() || saturated || explores(d.index) {
            &all
        } else {
            &sticky
        };
        // token-load-scorer: fewest tokens in flight; ties go round the fleet.
        let pod = (0..n)
            .map(|k| (d.index + k) % n)
            .filter(|p| set.contains(p))
            .min_by(|&a, &b| st.in_flight[a].total_cmp(&st.in_flight[b]))
            .unwrap_or(0);
        let tokens = d.prompt_tokens as f64 * (1.0 - score[pod]);
        st.in_flight[pod] += tokens;
        st.booked.insert(d.index, (pod, tokens));
        let cap = self.capacity_blocks;
        // Back to front, so a prompt's first blocks are the most recent (as the pods' LRU does).
        for &h in d.hashes.iter().take(MAX_PREFIX_BLOCKS).rev() {
            st.index[pod].touch(h, cap);
        }
        pod
    }

    fn first_token(&self, _: usize, index: usize) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((pod, tokens)) = st.booked.remove(&index) {
            st.in_flight[pod] = (st.in_flight[pod] - tokens).max(0.0);
        }
    }
}
