//! prefix_cache's first response bytes, batched per route (docs/redis-data-model.md §13): a
//! request's booked prefill tokens go back when its first bytes arrive, in one call for up to
//! [`BATCH`] requests, or for those that waited [`MAX_WAIT_MS`] by the next request's end.
//! A booking still in a batch when its stream ends goes back with its lease (release.lua); one
//! whose batch is lost goes back with its lease too, or with the lease's reclaim. The batches
//! are kept here; the Redis client sends the ones [`Batches::due`] hands it.

use crate::balancer::pick::{Booking, Lease};
use crate::config::{PluginConfig, RouteConfig};
use crate::redis::scripts::Keys;
use std::rc::Rc;

/// Requests per first-bytes call: an eighth of a Redis call per request under load.
pub const BATCH: usize = 8;
/// How long a first-bytes entry may wait for its batch to fill: a booking outliving its
/// prefill makes its endpoint look busier than it is.
pub const MAX_WAIT_MS: u64 = 20;
/// The root tick a config needs for its first bytes (0: none): a prefix_cache route with Redis
/// sends a waiting batch within a tick of [`MAX_WAIT_MS`] even when no other stream ends.
pub fn tick_ms(config: &PluginConfig) -> u32 {
    let prefix = |c: &&Rc<RouteConfig>| c.redis.is_some() && c.prefix().is_some();
    if config.all().any(|c| prefix(&c)) {
        MAX_WAIT_MS as u32
    } else {
        0
    }
}

/// One route's first bytes not yet sent.
pub struct Batch {
    pub config: Rc<RouteConfig>,
    pub keys: Rc<Keys>,
    /// (lease id, endpoint, rate sample) triples, as prefill_done.lua reads them.
    pub done: Vec<String>,
    since_ms: u64,
}

/// Every route's batch of this VM.
#[derive(Default)]
pub struct Batches(Vec<Batch>);

impl Batches {
    /// Adds `lease`'s first bytes at `now_ms`, with its booking's rate sample.
    pub fn add(&mut self, lease: &Lease, booking: Booking, now_ms: u64) {
        let Some((id, endpoint)) = lease.id_and_endpoint() else {
            return; // not a member the plugin wrote: its release gives the booking back
        };
        let at = match self.0.iter().position(|b| b.keys == lease.keys) {
            Some(at) => at,
            None => {
                self.0.push(Batch {
                    config: lease.config.clone(),
                    keys: lease.keys.clone(),
                    done: Vec::with_capacity(3 * BATCH),
                    since_ms: now_ms,
                });
                self.0.len() - 1
            }
        };
        if let Some(batch) = self.0.get_mut(at) {
            if batch.done.is_empty() {
                batch.since_ms = now_ms;
            }
            let sample = booking.rate_sample(now_ms);
            batch
                .done
                .extend([id.to_string(), endpoint.to_string(), sample.to_string()]);
        }
    }

    /// Whether any first bytes wait for their call: the clock is read only then.
    pub fn waiting(&self) -> bool {
        self.0.iter().any(|b| !b.done.is_empty())
    }

    /// Takes out the batches that are full or have waited [`MAX_WAIT_MS`] by `now_ms`.
    pub fn due(&mut self, now_ms: u64) -> Vec<Batch> {
        let due = |b: &Batch| {
            !b.done.is_empty()
                && (b.done.len() >= 3 * BATCH || now_ms.saturating_sub(b.since_ms) >= MAX_WAIT_MS)
        };
        if !self.0.iter().any(due) {
            return Vec::new();
        }
        let (send, keep) = std::mem::take(&mut self.0).into_iter().partition(due);
        self.0 = keep;
        send
    }
}
