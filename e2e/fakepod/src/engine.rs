//! The simulated inference engine of one pod: FIFO admission under a concurrency limit, a prefix
//! cache consulted at admission, KV accounting, LoRA bookkeeping and the counters behind
//! `/metrics` and `/admin/state`.

use crate::cache::PrefixCache;
use crate::config::PodConfig;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Live counters and gauges. Peaks and counters are reset by `/admin/reset`.
#[derive(Debug, Default)]
struct State {
    running: usize,
    waiting: usize,
    peak_running: usize,
    peak_waiting: usize,
    requests_total: u64,
    prefix_queries_tokens: u64,
    prefix_hit_tokens: u64,
    prompt_tokens_total: u64,
    generation_tokens_total: u64,
    kv_tokens: u64,
    status: BTreeMap<String, u64>,
    lora_running: BTreeMap<String, usize>,
    lora_waiting: BTreeMap<String, usize>,
    /// `/metrics` pages served, by the request's query string; never reset (tests wait on it).
    metrics_served: BTreeMap<String, u64>,
}

/// Point-in-time copy of the engine state (the `/admin/state` JSON).
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct Snapshot {
    pub name: String,
    pub running: usize,
    pub waiting: usize,
    pub requests_total: u64,
    pub peak_running: usize,
    pub peak_waiting: usize,
    pub prefix_hit_tokens: u64,
    pub prefix_query_tokens: u64,
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    pub kv_tokens: u64,
    pub kv_usage: f64,
    pub cache_blocks_used: usize,
    pub cache_blocks_capacity: usize,
    /// Responses by status code, plus `reset`/`hang`/`reset-after-headers` for faults.
    pub status: BTreeMap<String, u64>,
    pub lora_running: Vec<String>,
    pub lora_waiting: Vec<String>,
}

/// One pod's engine, shared by all its connections.
#[derive(Debug)]
pub struct Engine {
    pub cfg: PodConfig,
    slots: Arc<Semaphore>,
    state: Mutex<State>,
    cache: Mutex<PrefixCache>,
}

/// What admission needs to know about a request.
#[derive(Debug, Clone)]
pub struct Job {
    pub prompt_tokens: u64,
    pub block_hashes: Vec<u64>,
    pub lora: Option<String>,
}

/// Outcome of admission, held while the request runs; dropping it frees the slot.
#[derive(Debug)]
pub struct Running {
    engine: Arc<Engine>,
    _permit: OwnedSemaphorePermit,
    lora: Option<String>,
    kv_held: u64,
    pub queue_wait: Duration,
    pub hit_tokens: u64,
}

/// Leaves the waiting queue: on admission, or when a queued request is cancelled.
struct WaitGuard<'a> {
    engine: &'a Engine,
    lora: Option<&'a str>,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        let mut st = self.engine.lock();
        st.waiting -= 1;
        if let Some(l) = self.lora {
            dec(&mut st.lora_waiting, l);
        }
    }
}

fn dec(map: &mut BTreeMap<String, usize>, key: &str) {
    if let Some(n) = map.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            map.remove(key);
        }
    }
}

impl Engine {
    pub fn new(cfg: PodConfig) -> Arc<Self> {
        Arc::new(Self {
            slots: Arc::new(Semaphore::new(cfg.max_running)),
            cache: Mutex::new(PrefixCache::new(cfg.cache_blocks)),
            state: Mutex::new(State::default()),
            cfg,
        })
    }

    // A poisoned lock only means a panic elsewhere; the counters are still usable.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_cache(&self) -> MutexGuard<'_, PrefixCache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts an incoming generation request (before faults, parsing or queueing).
    pub fn count_request(&self) {
        self.lock().requests_total += 1;
    }

    /// Counts a `/metrics` page served (after it was read) to a request with query `query`: a
    /// health checker may tag its path (`/metrics?gw=<gateway id>`), so a test can tell the
    /// rounds of several gateways apart.
    pub fn count_metrics_served(&self, query: &str) {
        *self
            .lock()
            .metrics_served
            .entry(query.to_string())
            .or_default() += 1;
    }

    /// `/metrics` pages served so far to requests with query `query`.
    pub fn metrics_served(&self, query: &str) -> u64 {
        self.lock().metrics_served.get(query).copied().unwrap_or(0)
    }

    /// Counts a final outcome (`"200"`, `"400"`, `"reset"`, ...).
    pub fn count_status(&self, status: &str) {
        *self.lock().status.entry(status.to_string()).or_default() += 1;
    }

    /// Whether `model` names one of this pod's LoRA adapters.
    pub fn lora_for(&self, model: Option<&str>) -> Option<String> {
        model
            .filter(|m| self.cfg.lora_adapters.iter().any(|a| a == m))
            .map(String::from)
    }

    /// Queues the job FIFO until a slot frees, then does the prefix-cache lookup (as vLLM's
    /// scheduler does when it schedules a waiting request) and takes its KV tokens.
    pub async fn admit(self: &Arc<Self>, job: &Job) -> Running {
        let queued_at = Instant::now();
        // A free slot is taken at once (tokio hands released permits to queued waiters first,
        // so this cannot jump the queue); only requests that really wait show in the gauge.
        let permit = match self.slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => self.wait_for_slot(job.lora.as_deref()).await,
        };
        let hits_blocks = self.lock_cache().leading_hits(&job.block_hashes) as u64;
        let hit_tokens = (hits_blocks * self.cfg.block_tokens as u64).min(job.prompt_tokens);
        {
            let mut st = self.lock();
            st.running += 1;
            st.peak_running = st.peak_running.max(st.running);
            st.prefix_queries_tokens += job.prompt_tokens;
            st.prefix_hit_tokens += hit_tokens;
            st.prompt_tokens_total += job.prompt_tokens;
            st.kv_tokens += job.prompt_tokens;
            if let Some(l) = &job.lora {
                *st.lora_running.entry(l.clone()).or_default() += 1;
            }
        }
        Running {
            engine: self.clone(),
            _permit: permit,
            lora: job.lora.clone(),
            kv_held: job.prompt_tokens,
            queue_wait: queued_at.elapsed(),
            hit_tokens,
        }
    }

    /// Queues FIFO for a slot, visible in `waiting` (and the adapter's waiting set) meanwhile.
    async fn wait_for_slot(self: &Arc<Self>, lora: Option<&str>) -> OwnedSemaphorePermit {
        {
            let mut st = self.lock();
            st.waiting += 1;
            st.peak_waiting = st.peak_waiting.max(st.waiting);
            if let Some(l) = lora {
                *st.lora_waiting.entry(l.to_string()).or_default() += 1;
            }
        }
        // Dropped (undoing the gauges) when the slot is granted or the request is cancelled.
        let _guard = WaitGuard { engine: self, lora };
        // tokio's semaphore is fair (FIFO), which is the vLLM waiting-queue order. It is never
        // closed, so acquisition cannot fail; the fallback only keeps this panic-free.
        match self.slots.clone().acquire_owned().await {
            Ok(p) => p,
            Err(_) => std::future::pending().await,
        }
    }

    /// Duration of one decode step given the current batch size.
    pub fn decode_step(&self) -> Duration {
        let running = self.lock().running.max(1) as f64;
        let factor = 1.0 + self.cfg.decode_batch_penalty.max(0.0) * (running - 1.0);
        Duration::from_nanos((self.cfg.decode_us_per_token as f64 * 1000.0 * factor) as u64)
    }

    /// Snapshot for `/admin/state` and `/metrics`.
    pub fn snapshot(&self) -> Snapshot {
        let (used, cap) = {
            let c = self.lock_cache();
            (c.len(), c.capacity())
        };
        let st = self.lock();
        Snapshot {
            name: self.cfg.name.clone(),
            running: st.running,
            waiting: st.waiting,
            requests_total: st.requests_total,
            peak_running: st.peak_running,
            peak_waiting: st.peak_waiting,
            prefix_hit_tokens: st.prefix_hit_tokens,
            prefix_query_tokens: st.prefix_queries_tokens,
            prompt_tokens_total: st.prompt_tokens_total,
            generation_tokens_total: st.generation_tokens_total,
            kv_tokens: st.kv_tokens,
            kv_usage: (st.kv_tokens as f64 / self.cfg.kv_capacity_tokens.max(1) as f64).min(1.0),
            cache_blocks_used: used,
            cache_blocks_capacity: cap,
            status: st.status.clone(),
            lora_running: st.lora_running.keys().cloned().collect(),
            lora_waiting: st.lora_waiting.keys().cloned().collect(),
        }
    }

    /// Zeroes counters; peaks restart from the current gauges. The cache is kept unless asked.
    pub fn reset(&self, clear_cache: bool) {
        {
            let mut st = self.lock();
            st.requests_total = 0;
            st.prefix_queries_tokens = 0;
            st.prefix_hit_tokens = 0;
            st.prompt_tokens_total = 0;
            st.generation_tokens_total = 0;
            st.status.clear();
            st.peak_running = st.running;
            st.peak_waiting = st.waiting;
        }
        if clear_cache {
            self.lock_cache().clear();
        }
    }
}

impl Running {
    /// Records the prompt's blocks in the cache once prefill is done.
    pub fn commit_prompt(&self, block_hashes: &[u64]) {
        self.engine.lock_cache().insert(block_hashes);
    }

    /// Accounts one generated token (it now occupies KV space too).
    pub fn add_generated(&mut self) {
        self.kv_held += 1;
        let mut st = self.engine.lock();
        st.generation_tokens_total += 1;
        st.kv_tokens += 1;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut st = self.engine.lock();
        st.running -= 1;
        st.kv_tokens -= self.kv_held;
        if let Some(l) = &self.lora {
            dec(&mut st.lora_running, l);
        }
    }
}
