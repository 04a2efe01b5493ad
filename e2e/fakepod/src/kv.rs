//! KV-cache admission of an engine-like pod (`--kv-admission`): a request is admitted only when
//! the KV blocks it will write fit beside those of the requests already running; otherwise it
//! waits, FIFO, as vLLM's waiting queue does when the KV cache is full. Blocks a request finds
//! in the prefix cache are shared, not charged. It writes its uncached prompt tokens, and its
//! output grows one token per step: vLLM admits on the prompt and preempts a request when a
//! decode step finds no free block; this model has no preemption and instead holds, for the
//! whole request, its uncached prompt plus half its output (the output's mean occupancy;
//! docs/trace-bench.md).
//!
//! The prefix cache lives in the same KV: while requests hold blocks, the cache may keep only
//! the rest ([`KvPool::cache_room`]).

use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Debug)]
pub struct KvPool {
    blocks: usize,
    block_tokens: usize,
    free: Arc<Semaphore>,
}

/// Blocks held by one running request, given back when it is dropped.
#[derive(Debug)]
pub struct KvHold {
    _permit: Option<OwnedSemaphorePermit>,
}

impl KvPool {
    /// A pool of `capacity_tokens` in blocks of `block_tokens`.
    pub fn new(capacity_tokens: u64, block_tokens: usize) -> Self {
        let block_tokens = block_tokens.max(1);
        let blocks = (capacity_tokens as usize / block_tokens).min(Semaphore::MAX_PERMITS);
        Self {
            blocks,
            block_tokens,
            free: Arc::new(Semaphore::new(blocks)),
        }
    }

    /// Blocks `tokens` need, at most the whole pool (a request larger than the pod still
    /// runs, alone, rather than waiting forever).
    fn blocks_for(&self, tokens: u64) -> u32 {
        let b = (tokens as usize)
            .div_ceil(self.block_tokens)
            .min(self.blocks);
        u32::try_from(b).unwrap_or(u32::MAX)
    }

    /// Whether `tokens` fit now (no one waits and the blocks are free).
    pub fn fits(&self, tokens: u64) -> bool {
        self.free.available_permits() >= self.blocks_for(tokens) as usize
    }

    /// Waits FIFO until `tokens` fit, then holds them.
    pub async fn admit(&self, tokens: u64) -> KvHold {
        let n = self.blocks_for(tokens);
        // The semaphore is never closed; the fallback only keeps this panic-free.
        KvHold {
            _permit: self.free.clone().acquire_many_owned(n).await.ok(),
        }
    }

    /// Blocks free for the prefix cache now (the pool less what running requests hold).
    pub fn cache_room(&self) -> usize {
        self.free.available_permits()
    }

    /// Blocks held by running requests.
    pub fn held(&self) -> usize {
        self.blocks - self.free.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn admission_waits_for_room_and_frees_on_drop() {
        let pool = Arc::new(KvPool::new(100, 10));
        let a = pool.admit(65).await; // 7 blocks
        assert_eq!((pool.held(), pool.cache_room()), (7, 3));
        let p = pool.clone();
        let waiter = tokio::spawn(async move { p.admit(40).await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "4 blocks do not fit beside 7");
        drop(a);
        let b = waiter.await.unwrap();
        assert_eq!(pool.held(), 4);
        drop(b);
        // Larger than the pod: runs alone.
        let big = pool.admit(10_000).await;
        assert_eq!(pool.cache_room(), 0);
        drop(big);
    }
}
