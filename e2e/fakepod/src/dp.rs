//! Data-parallel ranks behind one port (`--dp-ranks N`): each rank is an engine of its own
//! (queue, prefill lane, prefix cache, counters), as each DP rank of vLLM or SGLang is. The
//! rank is read from the request as the engine reads it (docs/disaggregated-serving.md §5);
//! without one the pod picks as the engine's own balancer does.

use crate::config::{EngineKind, PodConfig};
use crate::engine::{Engine, Snapshot};
use crate::pd::RankPd;
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// One rank: its engine and its P/D side.
#[derive(Debug)]
pub struct Rank {
    pub index: usize,
    pub engine: Arc<Engine>,
    pub pd: Arc<RankPd>,
}

/// A pod's ranks (one for a pod without DP).
#[derive(Debug)]
pub struct Ranks {
    pub list: Vec<Rank>,
    /// Where the next balancer scan or round robin starts.
    next: AtomicUsize,
}

impl Ranks {
    /// `cfg.dp_ranks` ranks of the pod listening on `addr`.
    pub fn new(cfg: &PodConfig, addr: SocketAddr) -> Self {
        let n = cfg.dp_ranks.max(1);
        let list = (0..n)
            .map(|i| Rank {
                index: i,
                engine: Engine::new(cfg.clone()),
                pd: Arc::new(RankPd::new(&cfg.name, cfg.role, cfg.pd.clone(), addr, i, n)),
            })
            .collect();
        Self {
            list,
            next: AtomicUsize::new(0),
        }
    }

    pub fn first(&self) -> &Rank {
        &self.list[0]
    }

    /// The rank that serves a request with rank header `header` (`X-data-parallel-rank`,
    /// any case) and body `body`; `Err` is a 400's message.
    pub fn pick(
        &self,
        kind: EngineKind,
        header: Option<&str>,
        body: &Value,
    ) -> Result<&Rank, String> {
        let n = self.list.len();
        let i = match kind {
            // vLLM `_get_data_parallel_rank`: `int(header)`, a non-integer silently ignored;
            // `InputProcessor.process_inputs` refuses a rank out of range (§5). TensorRT-LLM
            // has no rank header: its attention-DP ranks are balanced internally (modelled
            // like vLLM's balancer; unverified).
            EngineKind::VllmV1 | EngineKind::VllmV0 | EngineKind::TrtLlm => {
                let asked = header
                    .filter(|_| kind != EngineKind::TrtLlm)
                    .and_then(|h| h.trim().parse::<i64>().ok());
                match asked {
                    Some(r) if r < 0 || r as usize >= n => {
                        return Err(format!("data_parallel_rank {r} is out of range [0, {n})."))
                    }
                    Some(r) => r as usize,
                    None => self.least_loaded(),
                }
            }
            EngineKind::Sglang => self.sglang(header, body)?,
        };
        Ok(&self.list[i])
    }

    /// SGLang (§5): the header overrides the body's `routed_dp_rank` (deprecated alias
    /// `data_parallel_rank`); a non-integer header is a 400; a rank out of range is "not
    /// active". With one rank there is no DP controller, and a rank is ignored (unverified).
    /// Without a rank: `bootstrap_room % dp_size` in P/D (`follow_bootstrap_room`), else
    /// round robin (the controller's default method; unverified for current releases).
    fn sglang(&self, header: Option<&str>, body: &Value) -> Result<usize, String> {
        let n = self.list.len();
        let from_header = match header {
            Some(h) => Some(
                h.trim()
                    .parse::<i64>()
                    .map_err(|_| format!("Invalid X-Data-Parallel-Rank header: {h:?}"))?,
            ),
            None => None,
        };
        let field = ["routed_dp_rank", "data_parallel_rank"]
            .iter()
            .find_map(|k| body.get(*k).filter(|v| !v.is_null()));
        let from_body = match field {
            Some(v) => Some(
                v.as_i64()
                    .ok_or("routed_dp_rank: Input should be a valid integer")?,
            ),
            None => None,
        };
        Ok(match from_header.or(from_body) {
            Some(_) if n == 1 => 0,
            Some(r) if r < 0 || r as usize >= n => {
                return Err(format!("DP rank {r} is not active."))
            }
            Some(r) => r as usize,
            None => match body.get("bootstrap_room").and_then(Value::as_u64) {
                Some(room) => (room % n as u64) as usize,
                None => self.next.fetch_add(1, Ordering::Relaxed) % n,
            },
        })
    }

    /// vLLM's `DPLBAsyncMPClient`: the engine with the lowest `waiting × 4 + running`, ties to
    /// the first in scan order. vLLM adds its own dispatches to the engines' published counts
    /// so that a burst spreads; the fake reads live gauges and starts each scan one rank
    /// further instead (a simplification with the same effect on ties).
    fn least_loaded(&self) -> usize {
        let n = self.list.len();
        if n == 1 {
            return 0;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n)
            .map(|k| (start + k) % n)
            .min_by_key(|&i| {
                let (running, waiting) = self.list[i].engine.gauges();
                waiting * 4 + running
            })
            .unwrap_or(0)
    }

    /// The pod's `/admin/state`: its one engine's snapshot, or with several ranks their sums
    /// plus each rank's own; P/D counters when the pod has a role.
    pub fn snapshot(&self) -> Snapshot {
        let first = self.first();
        first.pd.cfg.fabric.purge();
        let role = first.pd.role;
        let with_pd = |r: &Rank| {
            let mut s = r.engine.snapshot();
            if role != crate::pd::Role::Colocated {
                s.pd = Some(r.pd.counters.stats(role.name()));
            }
            s
        };
        if self.list.len() == 1 {
            return with_pd(first);
        }
        let ranks: Vec<Snapshot> = self
            .list
            .iter()
            .map(|r| Snapshot {
                rank: Some(r.index),
                ..with_pd(r)
            })
            .collect();
        let mut total = Snapshot {
            ranks: Vec::new(),
            rank: None,
            ..ranks[0].clone()
        };
        for s in &ranks[1..] {
            add(&mut total, s);
        }
        total.kv_usage = ranks.iter().map(|s| s.kv_usage).sum::<f64>() / ranks.len() as f64;
        total.ranks = ranks;
        total
    }

    /// `/admin/reset` on every rank.
    pub fn reset(&self, clear_cache: bool) {
        for r in &self.list {
            r.engine.reset(clear_cache);
            r.pd.counters.reset();
        }
    }

    /// `/admin/restart` on every rank.
    pub fn restart(&self) {
        for r in &self.list {
            r.engine.restart();
        }
    }
}

/// Adds rank `s` to the pod's total `t`.
fn add(t: &mut Snapshot, s: &Snapshot) {
    t.running += s.running;
    t.waiting += s.waiting;
    t.requests_total += s.requests_total;
    t.peak_running += s.peak_running;
    t.peak_waiting += s.peak_waiting;
    t.prefix_hit_tokens += s.prefix_hit_tokens;
    t.prefix_query_tokens += s.prefix_query_tokens;
    t.prompt_tokens_total += s.prompt_tokens_total;
    t.generation_tokens_total += s.generation_tokens_total;
    t.kv_tokens += s.kv_tokens;
    t.cache_blocks_used += s.cache_blocks_used;
    t.cache_blocks_capacity += s.cache_blocks_capacity;
    for (k, v) in &s.status {
        *t.status.entry(k.clone()).or_default() += v;
    }
    for l in &s.lora_running {
        if !t.lora_running.contains(l) {
            t.lora_running.push(l.clone());
        }
    }
    for l in &s.lora_waiting {
        if !t.lora_waiting.contains(l) {
            t.lora_waiting.push(l.clone());
        }
    }
    if let (Some(tp), Some(sp)) = (&mut t.pd, &s.pd) {
        tp.add(sp);
    }
}
