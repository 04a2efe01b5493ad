//! The simulated inference engine of one pod: FIFO admission under a concurrency limit, a prefix
//! cache consulted at admission, KV accounting, LoRA bookkeeping and the counters behind
//! `/metrics` and `/admin/state`.
//!
//! Over 400 lines: the one engine state every request path shares, and each operation on it.

use crate::cache::PrefixCache;
use crate::config::PodConfig;
use crate::kv::{KvHold, KvPool};
use crate::lane::PrefillLane;
use crate::latency::Latency;
pub use crate::snapshot::Snapshot;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// `/admin/restart` calls (each empties the cache and moves the start time).
    restarts: u64,
    /// Unix time the engine (re)started: `process_start_time_seconds`.
    started_unix: f64,
}

/// One pod's engine, shared by all its connections.
#[derive(Debug)]
pub struct Engine {
    pub cfg: PodConfig,
    /// The share of requests that fail (`error_rate`, changed by [`Engine::set_error_rate`]),
    /// as f64 bits.
    error_rate: AtomicU64,
    slots: Arc<Semaphore>,
    state: Mutex<State>,
    cache: Mutex<PrefixCache>,
    /// `--prefill-tokens-per-s`: one prefill lane at that rate (lane.rs).
    lane: Option<PrefillLane>,
    /// `--kv-admission`: admission bounded by the KV capacity (kv.rs).
    kv: Option<KvPool>,
    /// TTFT, time per output token and end-to-end histograms of the requests served.
    latency: Mutex<Latency>,
}

/// What admission needs to know about a request.
#[derive(Debug, Clone)]
pub struct Job {
    pub prompt_tokens: u64,
    pub block_hashes: Vec<u64>,
    pub lora: Option<String>,
    /// Output tokens it will generate (reserved in the KV under `--kv-admission`).
    pub output_tokens: u64,
}

/// Outcome of admission, held while the request runs; dropping it frees the slot.
#[derive(Debug)]
pub struct Running {
    engine: Arc<Engine>,
    _permit: OwnedSemaphorePermit,
    _kv: Option<KvHold>,
    lora: Option<String>,
    kv_held: u64,
    pub queue_wait: Duration,
    /// Prompt tokens found in the prefix cache: at admission, or at the head of the prefill
    /// lane when the pod has one.
    pub hit_tokens: u64,
}

/// Leaves the waiting queue: on admission, or when a queued request is cancelled.
struct WaitGuard<'a> {
    engine: &'a Engine,
    lora: Option<&'a str>,
}

impl<'a> WaitGuard<'a> {
    /// Counts a request in `waiting` (and its adapter's waiting set) until dropped: when it is
    /// admitted, or cancelled while it waits.
    fn enter(engine: &'a Engine, lora: Option<&'a str>) -> Self {
        let mut st = engine.lock();
        st.waiting += 1;
        st.peak_waiting = st.peak_waiting.max(st.waiting);
        if let Some(l) = lora {
            *st.lora_waiting.entry(l.to_string()).or_default() += 1;
        }
        drop(st);
        WaitGuard { engine, lora }
    }
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

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
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
            error_rate: AtomicU64::new(cfg.error_rate.to_bits()),
            slots: Arc::new(Semaphore::new(cfg.max_running)),
            cache: Mutex::new(PrefixCache::new(cfg.cache_blocks)),
            latency: Mutex::new(Latency::new(cfg.engine)),
            state: Mutex::new(State {
                started_unix: unix_now(),
                ..State::default()
            }),
            lane: (cfg.prefill_tokens_per_s > 0.0)
                .then(|| PrefillLane::new(cfg.prefill_tokens_per_s)),
            kv: cfg
                .kv_admission
                .then(|| KvPool::new(cfg.kv_capacity_tokens, cfg.block_tokens)),
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

    /// The latency histograms, for a request's [`crate::latency::Timer`] to record into.
    pub fn latency(&self) -> MutexGuard<'_, Latency> {
        self.latency.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The share of generation requests that fail now.
    pub fn error_rate(&self) -> f64 {
        f64::from_bits(self.error_rate.load(Ordering::Relaxed))
    }

    /// A pod that starts or stops failing (clamped to [0, 1]): a black hole that heals.
    pub fn set_error_rate(&self, rate: f64) {
        let r = if rate.is_nan() {
            0.0
        } else {
            rate.clamp(0.0, 1.0)
        };
        self.error_rate.store(r.to_bits(), Ordering::Relaxed);
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

    /// Queues the job FIFO until a slot frees (and, under `--kv-admission`, until its KV fits),
    /// then takes its KV tokens. Without a prefill lane the prefix-cache lookup happens here,
    /// as vLLM's scheduler does when it schedules a waiting request; with one it happens at the
    /// head of the lane ([`Engine::lookup`]).
    pub async fn admit(self: &Arc<Self>, job: &Job) -> Running {
        let queued_at = Instant::now();
        let mut waiting = None;
        // A free slot is taken at once (tokio hands released permits to queued waiters first,
        // so this cannot jump the queue); only requests that really wait show in the gauge.
        let permit = match self.slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                waiting = Some(WaitGuard::enter(self, job.lora.as_deref()));
                self.acquire_slot().await
            }
        };
        let kv = match &self.kv {
            Some(pool) => {
                let need = job.prompt_tokens - self.peek(job) + job.output_tokens.div_ceil(2);
                if waiting.is_none() && !pool.fits(need) {
                    waiting = Some(WaitGuard::enter(self, job.lora.as_deref()));
                }
                Some(pool.admit(need).await)
            }
            None => None,
        };
        drop(waiting);
        let hit_tokens = if self.lane.is_none() {
            self.lookup(job)
        } else {
            0
        };
        {
            let mut st = self.lock();
            st.running += 1;
            st.peak_running = st.peak_running.max(st.running);
            st.kv_tokens += job.prompt_tokens;
            if let Some(l) = &job.lora {
                *st.lora_running.entry(l.clone()).or_default() += 1;
            }
        }
        Running {
            engine: self.clone(),
            _permit: permit,
            _kv: kv,
            lora: job.lora.clone(),
            kv_held: job.prompt_tokens,
            queue_wait: queued_at.elapsed(),
            hit_tokens,
        }
    }

    /// Prompt tokens of `job` in the prefix cache now, counted as vLLM V1 counts its prefix
    /// cache queries and hits.
    pub fn lookup(&self, job: &Job) -> u64 {
        let hit_tokens = self.peek(job);
        let mut st = self.lock();
        st.prefix_queries_tokens += job.prompt_tokens;
        st.prefix_hit_tokens += hit_tokens;
        st.prompt_tokens_total += job.prompt_tokens;
        hit_tokens
    }

    /// Prompt tokens of `job` in the prefix cache now, without counting a query.
    pub fn peek(&self, job: &Job) -> u64 {
        let blocks = self.lock_cache().leading_hits(&job.block_hashes) as u64;
        (blocks * self.cfg.block_tokens as u64).min(job.prompt_tokens)
    }

    /// Running and waiting requests now.
    pub fn gauges(&self) -> (usize, usize) {
        let st = self.lock();
        (st.running, st.waiting)
    }

    /// KV blocks held by running requests under `--kv-admission` (0 without).
    pub fn kv_held_blocks(&self) -> usize {
        self.kv.as_ref().map_or(0, KvPool::held)
    }

    /// The prefill lane, when the pod has one.
    pub fn lane(&self) -> Option<&PrefillLane> {
        self.lane.as_ref()
    }

    /// A slot, FIFO. The semaphore is never closed, so acquisition cannot fail; the fallback
    /// only keeps this panic-free.
    async fn acquire_slot(self: &Arc<Self>) -> OwnedSemaphorePermit {
        match self.slots.clone().acquire_owned().await {
            Ok(p) => p,
            Err(_) => std::future::pending().await,
        }
    }

    /// Duration of one decode step given the current batch size. With a prefill lane and
    /// `prefill_chunk_tokens`, a step taken while a prefill runs shares its forward pass with
    /// a chunk of that prefill (vLLM's chunked prefill, `max_num_batched_tokens`), so it lasts
    /// at least the chunk's time: the decode slowdown a prefill-heavy pod shows.
    pub fn decode_step(&self) -> Duration {
        let running = self.lock().running.max(1) as f64;
        let factor = 1.0 + self.cfg.decode_batch_penalty.max(0.0) * (running - 1.0);
        let step =
            Duration::from_nanos((self.cfg.decode_us_per_token as f64 * 1000.0 * factor) as u64);
        match &self.lane {
            Some(lane) if self.cfg.prefill_chunk_tokens > 0 && lane.busy() => {
                step.max(lane.duration(self.cfg.prefill_chunk_tokens))
            }
            _ => step,
        }
    }

    /// Snapshot for `/admin/state` and `/metrics`.
    pub fn snapshot(&self) -> Snapshot {
        let (used, cap) = {
            let c = self.lock_cache();
            (c.len(), c.capacity())
        };
        let latency = Some(self.latency().clone());
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
            restarts: st.restarts,
            started_unix: st.started_unix,
            latency,
            ..Snapshot::default()
        }
    }

    /// What a restarted engine keeps of its prefix cache: nothing. Counts the restart and moves
    /// the start time (`process_start_time_seconds`), which is how a router watching the pod's
    /// metrics can tell; requests in flight finish.
    pub fn restart(&self) {
        self.lock_cache().clear();
        let mut st = self.lock();
        st.restarts += 1;
        st.started_unix = unix_now().max(st.started_unix + 1e-3);
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
        self.latency().clear();
        if clear_cache {
            self.lock_cache().clear();
        }
    }
}

impl Running {
    /// Records the prompt's blocks in the cache once prefill is done.
    /// Under `--kv-admission` the cache keeps only the blocks running requests do not hold.
    pub fn commit_prompt(&self, block_hashes: &[u64]) {
        let room = self.engine.kv.as_ref().map(KvPool::cache_room);
        self.engine.lock_cache().insert_within(block_hashes, room);
    }

    /// Accounts `n` generated tokens (they now occupy KV space too).
    pub fn add_generated(&mut self, n: u64) {
        self.kv_held += n;
        let mut st = self.engine.lock();
        st.generation_tokens_total += n;
        st.kv_tokens += n;
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
