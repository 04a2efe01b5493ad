//! The KV "network" between fake pods: what a prefill rank offers and a decode rank pulls.
//! Real engines move KV over NIXL/RDMA (vLLM, TensorRT-LLM) or SGLang's bootstrap server; the
//! fake pods run in one process, so they meet in this shared registry instead. Pods given one
//! `Fabric` (tests, or every pod of one `ailb-fakepod --pods N` process) can reach each other;
//! a decode pod on another fabric cannot, as a pod on another network cannot.

use super::stats::PdCounters;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// What the prefill side computed and holds for one request.
#[derive(Clone, Debug)]
pub struct Pinned {
    /// The prefill rank that holds the blocks (its pinned gauge follows them).
    pub owner: Arc<PdCounters>,
    /// Where the prefill rank said it can be reached (`remote_host` / `remote_port`).
    pub host: String,
    pub port: u16,
    /// The canonical prompt and its token count (TensorRT-LLM's decode request carries only
    /// token ids; the fake's decode pod answers as if it had the text).
    pub prompt: String,
    pub prompt_tokens: u64,
    pub block_hashes: Vec<u64>,
    pub expires: Instant,
}

/// A transfer's key: vLLM (`remote_engine_id`, `remote_request_id`), TensorRT-LLM (engine id,
/// `ctx_request_id`), or an SGLang bootstrap room (`host:port`, room).
pub type Key = (String, String);

#[derive(Debug, Default)]
struct Inner {
    held: Mutex<HashMap<Key, Pinned>>,
    /// Woken whenever something is offered (SGLang decode ranks wait for their room).
    offered: Notify,
}

#[derive(Clone, Debug, Default)]
pub struct Fabric(Arc<Inner>);

impl Fabric {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Pinned>> {
        let mut held = self.0.held.lock().unwrap_or_else(|e| e.into_inner());
        // Blocks nobody read in time are freed (vLLM `VLLM_NIXL_ABORT_REQUEST_TIMEOUT`, §1).
        let now = Instant::now();
        held.retain(|_, p| {
            let keep = p.expires > now;
            if !keep {
                release(p);
                PdCounters::bump(&p.owner.pins_expired, 1);
            }
            keep
        });
        held
    }

    /// Frees what expired (the pinned gauges then say what is really held).
    pub fn purge(&self) {
        drop(self.lock());
    }

    /// Offers `pinned` under `key` (an older offer under the same key is freed).
    pub fn offer(&self, key: Key, pinned: Pinned) {
        let c = &pinned.owner;
        PdCounters::bump(&c.pins_made, 1);
        PdCounters::bump(&c.pinned_blocks, pinned.block_hashes.len() as u64);
        if let Some(old) = self.lock().insert(key, pinned) {
            release(&old);
        }
        self.0.offered.notify_waiters();
    }

    /// The offer under `key`, left in place.
    pub fn peek(&self, key: &Key) -> Option<Pinned> {
        self.lock().get(key).cloned()
    }

    /// Reads and frees the offer under `key`: the prefill side lets its blocks go once the
    /// decode side has them.
    pub fn take(&self, key: &Key) -> Option<Pinned> {
        let p = self.lock().remove(key)?;
        release(&p);
        PdCounters::bump(&p.owner.pins_read, 1);
        Some(p)
    }

    /// [`Fabric::take`], waiting up to `limit` for the offer to appear (an SGLang decode rank
    /// waits for its prefill rank's KV of the room).
    pub async fn take_within(&self, key: &Key, limit: Duration) -> Option<Pinned> {
        let deadline = Instant::now() + limit;
        loop {
            let offered = self.0.offered.notified();
            tokio::pin!(offered);
            offered.as_mut().enable();
            if let Some(p) = self.take(key) {
                return Some(p);
            }
            if tokio::time::timeout_at(deadline, offered).await.is_err() {
                return self.take(key);
            }
        }
    }
}

fn release(p: &Pinned) {
    p.owner
        .pinned_blocks
        .fetch_sub(p.block_hashes.len() as u64, Ordering::Relaxed);
}
