//! The references that run in the bench process and send straight to the pods: round robin,
//! O3 full-knowledge least load, O2 the capacity-bounded oracle, and any of them over the
//! data-parallel ranks of a fleet ([`Ranked`]); the llm-d-style peer is in peer.rs
//! (docs/trace-bench.md "Routers").

use ailb_bench::trace::replay::{Dispatch, Router};
use ailb_fakepod::engine::Engine;
use ailb_fakepod::probe::probe;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// What a Kubernetes Service does: the next pod.
pub struct RoundRobin {
    next: AtomicUsize,
    n: usize,
}

impl RoundRobin {
    pub fn new(n: usize) -> Self {
        RoundRobin {
            next: AtomicUsize::new(0),
            n: n.max(1),
        }
    }
}

impl Router for RoundRobin {
    fn pick(&self, _: &Dispatch<'_>) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.n
    }
}

/// O3: the pod with the fewest requests in flight, counted exactly (every request of the run
/// goes through this router); ties go round the fleet from the request's index.
pub struct LeastLoad {
    in_flight: Mutex<Vec<usize>>,
}

impl LeastLoad {
    pub fn new(n: usize) -> Self {
        LeastLoad {
            in_flight: Mutex::new(vec![0; n]),
        }
    }
}

impl Router for LeastLoad {
    fn pick(&self, d: &Dispatch<'_>) -> usize {
        let mut f = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        let n = f.len();
        let pod = (0..n)
            .map(|k| (d.index + k) % n)
            .min_by_key(|&p| f[p])
            .unwrap_or(0);
        f[pod] += 1;
        pod
    }

    fn done(&self, pod: usize, _: usize) {
        let mut f = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        f[pod] = f[pod].saturating_sub(1);
    }
}

/// O2: sees every pod's true cache contents, prefill backlog and KV (fakepod's probe,
/// in-process) and sends the request where its first token comes soonest: among the pods that
/// would admit it at once (its uncached tokens and half its output fit in the free KV, nobody
/// waiting), else among all, the least prefill backlog plus its own uncached tokens at that
/// pod's rate; ties to the pod with fewer running requests. The prompts it sent
/// to a pod that are still waiting for their prefill count as cached there too: the pod's
/// prefill lane is FIFO, so they are in its cache by the time this request's prefill starts.
pub struct Oracle {
    engines: Vec<Arc<Engine>>,
    /// Per pod: request index → its block hashes, until its first token.
    pending: Mutex<Vec<HashMap<usize, Vec<u64>>>>,
}

impl Oracle {
    pub fn new(engines: Vec<Arc<Engine>>) -> Self {
        let n = engines.len();
        Oracle {
            engines,
            pending: Mutex::new(vec![HashMap::new(); n]),
        }
    }
}

fn leading(a: &[u64], b: &[u64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Router for Oracle {
    fn pick(&self, d: &Dispatch<'_>) -> usize {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let mut best = (true, f64::INFINITY, usize::MAX, 0);
        for (i, e) in self.engines.iter().enumerate() {
            let p = probe(e, d.prompt_tokens, d.hashes);
            let bt = e.cfg.block_tokens as u64;
            let queued = pending[i]
                .values()
                .map(|h| leading(h, d.hashes))
                .max()
                .unwrap_or(0) as u64;
            let cached = p.cached_tokens.max((queued * bt).min(p.prompt_tokens));
            let rate = e.cfg.prefill_tokens_per_s.max(1.0);
            let ttft = p.backlog.as_secs_f64() + (p.prompt_tokens - cached) as f64 / rate;
            let load = p.running + p.waiting;
            let need = (p.prompt_tokens - cached + d.output_tokens.div_ceil(2)).div_ceil(bt);
            let capacity = e.cfg.kv_capacity_tokens / bt;
            let blocked = p.waiting > 0 || p.kv_held_blocks as u64 + need > capacity;
            let key = (blocked, ttft, load, i);
            if (key.0, key.1, key.2) < (best.0, best.1, best.2) {
                best = key;
            }
        }
        pending[best.3].insert(d.index, d.hashes.to_vec());
        best.3
    }

    fn first_token(&self, pod: usize, index: usize) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending[pod].remove(&index);
    }
}

/// A router whose endpoints are the data-parallel ranks of a fleet, `ranks` per pod: its
/// endpoint `i` is rank `i % ranks` of pod `i / ranks`, which the replay sends with the rank
/// header (e.g. O2 over every rank's engine, in that order).
pub struct Ranked<R> {
    pub inner: R,
    pub ranks: usize,
}

impl<R: Router> Router for Ranked<R> {
    fn pick(&self, d: &Dispatch<'_>) -> usize {
        self.inner.pick(d)
    }

    fn first_token(&self, endpoint: usize, index: usize) {
        self.inner.first_token(endpoint, index)
    }

    fn done(&self, endpoint: usize, index: usize) {
        self.inner.done(endpoint, index)
    }

    fn ranks_per_pod(&self) -> usize {
        self.ranks
    }
}
