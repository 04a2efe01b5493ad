//! The prefill lane of an engine-like pod (`--prefill-tokens-per-s`): one pod prefills at one
//! rate, so concurrent prompts share it. Requests enter FIFO; the one at the head looks its
//! prompt up in the prefix cache (so it sees every block committed by the prefills before it,
//! as vLLM's scheduler does when it schedules a waiting request), computes its uncached tokens,
//! and holds the lane for `uncached / rate`. A chunked-prefill engine interleaves rather than
//! serialises, but its prefill throughput is the same: the TTFT of a request is the uncached
//! tokens ahead of it plus its own over the rate, which is also what llm-d's TTFT estimate
//! (tokens in flight ÷ `peakPrefillThroughput`, docs/trace-bench.md) assumes.
//!
//! The lane keeps its end time as a deadline (`busy_until`), not as the sum of sleeps, so timer
//! slack does not accumulate from one prefill to the next.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::{Mutex as FifoLock, MutexGuard};
use tokio::time::Instant;

#[derive(Debug)]
pub struct PrefillLane {
    /// The rate, as f64 bits: a running pod's can change ([`PrefillLane::set_rate`]).
    tokens_per_s: AtomicU64,
    /// tokio's mutex is fair: waiters get the lane in arrival order.
    turn: FifoLock<()>,
    /// When the lane's last granted prefill ends.
    busy_until: Mutex<Instant>,
    /// Estimated uncached tokens of the requests waiting for the lane (their lookup is not
    /// done yet): what a router with full knowledge counts as queued work.
    queued_tokens: AtomicU64,
}

/// The lane held by one request, from its lookup to its commit.
pub struct LaneTurn<'a> {
    lane: &'a PrefillLane,
    _turn: MutexGuard<'a, ()>,
}

/// Undoes a waiter's queued estimate however its wait ends (granted or cancelled).
struct Queued<'a>(&'a AtomicU64, u64);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::Relaxed);
    }
}

impl PrefillLane {
    pub fn new(tokens_per_s: f64) -> Self {
        Self {
            tokens_per_s: AtomicU64::new(tokens_per_s.max(1.0).to_bits()),
            turn: FifoLock::new(()),
            busy_until: Mutex::new(Instant::now()),
            queued_tokens: AtomicU64::new(0),
        }
    }

    /// Time to prefill `tokens` at this lane's rate.
    pub fn duration(&self, tokens: u64) -> Duration {
        Duration::from_secs_f64(tokens as f64 / self.rate())
    }

    pub fn rate(&self) -> f64 {
        f64::from_bits(self.tokens_per_s.load(Ordering::Relaxed))
    }

    /// The pod now prefills at `tokens_per_s` (restarted on another GPU, serving another
    /// model): prefills granted from now on take the new time.
    pub fn set_rate(&self, tokens_per_s: f64) {
        let r = if tokens_per_s.is_finite() {
            tokens_per_s.max(1.0)
        } else {
            1.0
        };
        self.tokens_per_s.store(r.to_bits(), Ordering::Relaxed);
    }

    /// Waits for the lane; `estimate` (uncached tokens as the cache looks now) counts as
    /// queued work meanwhile.
    pub async fn enter(&self, estimate: u64) -> LaneTurn<'_> {
        self.queued_tokens.fetch_add(estimate, Ordering::Relaxed);
        let _queued = Queued(&self.queued_tokens, estimate);
        let turn = self.turn.lock().await;
        LaneTurn {
            lane: self,
            _turn: turn,
        }
    }

    /// Whether a prefill is running now.
    pub fn busy(&self) -> bool {
        *self.busy_until.lock().unwrap_or_else(|e| e.into_inner()) > Instant::now()
    }

    /// Work ahead of a request arriving now: the granted prefills' remaining time plus the
    /// queued estimate at this lane's rate.
    pub fn backlog(&self) -> Duration {
        let busy = *self.busy_until.lock().unwrap_or_else(|e| e.into_inner());
        busy.saturating_duration_since(Instant::now())
            + self.duration(self.queued_tokens.load(Ordering::Relaxed))
    }
}

impl LaneTurn<'_> {
    /// Prefills `uncached` tokens: the lane is busy until the previous prefill's end (or now)
    /// plus their time; returns when they are done.
    pub async fn prefill(&self, uncached: u64) {
        let end = {
            let mut busy = self
                .lane
                .busy_until
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            *busy = (*busy).max(Instant::now()) + self.lane.duration(uncached);
            *busy
        };
        tokio::time::sleep_until(end).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn prefills_are_serial_at_the_rate() {
        let lane = std::sync::Arc::new(PrefillLane::new(1000.0));
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let lane = lane.clone();
            tasks.push(tokio::spawn(async move {
                let turn = lane.enter(500).await;
                turn.prefill(500).await;
                Instant::now() - t0
            }));
        }
        tokio::task::yield_now().await;
        assert_eq!(lane.backlog(), Duration::from_millis(1500));
        let mut ends = Vec::new();
        for t in tasks {
            ends.push(t.await.unwrap());
        }
        ends.sort();
        let ms: Vec<u128> = ends.iter().map(|d| d.as_millis()).collect();
        assert_eq!(ms, [500, 1000, 1500]);
        assert_eq!(lane.backlog(), Duration::ZERO);
    }
}
