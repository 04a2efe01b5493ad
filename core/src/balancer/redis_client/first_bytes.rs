//! prefix_cache's first response bytes, batched per route (docs/redis-data-model.md §13): a
//! request's booked prefill tokens go back when its first bytes arrive, in one call for up to
//! [`BATCH`] requests, or for those that waited [`MAX_WAIT_MS`] by the next request's end.
//! A booking still in a batch when its stream ends goes back with its lease (release.lua); one
//! whose batch is lost goes back with its lease too, or with the lease's reclaim.

use super::{LeaseKeys, RedisClient, Release};
use crate::balancer::pick::Booking;
use crate::balancer::telemetry::Telemetry;
use crate::config::{PluginConfig, PolicyConfig, RouteConfig};
use crate::host::Host;
use crate::redis::scripts::Keys;
use std::rc::Rc;

/// Requests per first-bytes call: an eighth of a Redis call per request under load.
pub const BATCH: usize = 8;
/// How long a first-bytes entry may wait for its batch to fill: a booking outliving its
/// prefill makes its endpoint look busier than it is.
pub const MAX_WAIT_MS: u64 = 20;
/// Fewer tokens than this do not time a prefill: the fixed costs (network, scheduling, the
/// first decode step) would dominate the sample.
pub const MIN_TIMED_TOKENS: u64 = 1024;

/// The root tick a config needs for its first bytes (0: none): a prefix_cache route with Redis
/// sends a waiting batch within a tick of [`MAX_WAIT_MS`] even when no other stream ends.
pub fn tick_ms(config: &PluginConfig) -> u32 {
    let prefix = |c: &&Rc<RouteConfig>| {
        c.redis.is_some() && matches!(c.policy, PolicyConfig::PrefixCache(_))
    };
    if config.all().any(|c| prefix(&c)) {
        MAX_WAIT_MS as u32
    } else {
        0
    }
}

/// One route's first bytes not yet sent.
pub(super) struct Batch {
    config: Rc<RouteConfig>,
    keys: Rc<Keys>,
    /// (lease id, endpoint, rate sample) triples, as prefill_done.lua reads them.
    done: Vec<String>,
    since_ms: u64,
}

/// The prefill rate (tokens/s) a streamed request's first bytes show: the tokens its endpoint
/// had booked ahead of it and its own, over its time to first bytes. 0: no sample.
pub fn rate_sample(booking: &Booking, now_ms: u64) -> u64 {
    let tokens = booking.booked.ahead.saturating_add(booking.booked.tokens);
    let ttft_ms = now_ms.saturating_sub(booking.since_ms);
    if !booking.timed || tokens < MIN_TIMED_TOKENS || ttft_ms == 0 {
        return 0;
    }
    tokens.saturating_mul(1000) / ttft_ms
}

impl RedisClient {
    /// Queues `booking`'s first bytes, and sends the batches that are full or waited long.
    pub fn first_bytes(
        &mut self,
        host: &mut dyn Host,
        tel: &mut Telemetry,
        config: &Rc<RouteConfig>,
        keys: Rc<Keys>,
        booking: Booking,
    ) {
        let now = host.now_ms();
        let at = match self.batches.iter().position(|b| b.keys == keys) {
            Some(at) => at,
            None => {
                self.batches.push(Batch {
                    config: config.clone(),
                    keys,
                    done: Vec::with_capacity(3 * BATCH),
                    since_ms: now,
                });
                self.batches.len() - 1
            }
        };
        if let Some(batch) = self.batches.get_mut(at) {
            if batch.done.is_empty() {
                batch.since_ms = now;
            }
            let sample = rate_sample(&booking, now);
            batch
                .done
                .extend([booking.lease_id, booking.endpoint, sample.to_string()]);
        }
        self.flush_first_bytes(host, tel);
    }

    /// Sends every batch that is full or has waited [`MAX_WAIT_MS`].
    pub fn flush_first_bytes(&mut self, host: &mut dyn Host, tel: &mut Telemetry) {
        let now = host.now_ms();
        let due = |b: &Batch| {
            !b.done.is_empty()
                && (b.done.len() >= 3 * BATCH || now.saturating_sub(b.since_ms) >= MAX_WAIT_MS)
        };
        if !self.batches.iter().any(due) {
            return;
        }
        let (send, keep): (Vec<Batch>, Vec<Batch>) =
            std::mem::take(&mut self.batches).into_iter().partition(due);
        self.batches = keep;
        for b in send {
            let rel = Release {
                config: b.config,
                keys: LeaseKeys::FirstBytes(b.keys),
                members: b.done,
                by_sha: true,
            };
            self.send_release(host, tel, rel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::scripts::Booked;

    fn booking(ahead: u64, tokens: u64, since_ms: u64, timed: bool) -> Booking {
        Booking {
            lease_id: "r1".into(),
            endpoint: "10.0.0.1:8000".into(),
            booked: Booked { ahead, tokens },
            since_ms,
            timed,
        }
    }

    #[test]
    fn a_streamed_prefill_of_enough_tokens_is_timed() {
        // 3,000 tokens ahead and 5,000 of its own in 500 ms: 16,000 tokens/s.
        assert_eq!(rate_sample(&booking(3000, 5000, 1000, true), 1500), 16_000);
        assert_eq!(
            rate_sample(&booking(0, 5000, 1000, false), 1500),
            0,
            "not streamed"
        );
        assert_eq!(
            rate_sample(&booking(0, 500, 1000, true), 1500),
            0,
            "too few tokens"
        );
        assert_eq!(
            rate_sample(&booking(0, 5000, 1000, true), 1000),
            0,
            "no time"
        );
        assert_eq!(
            rate_sample(&booking(0, 5000, 2000, true), 1000),
            0,
            "clock back"
        );
    }
}
