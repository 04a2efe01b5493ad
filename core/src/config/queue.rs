//! The waiting queue (docs/sessions-and-queues.md "Waiting queue"): instead of refusing a request for want of room
//! (every endpoint at its cap, or its class cap), hold it for up to `queueTimeoutMs` and admit it
//! when capacity frees, highest class first; at most `maxQueued` wait per VM.

use super::error::ConfigError;
use super::raw::RawLbConfig;
use super::read::Reader;

/// `maxQueued` when absent: per VM (worker), so a gateway of N workers holds N times this.
pub const DEFAULT_MAX_QUEUED: u64 = 256;
/// The longest wait accepted: a held request keeps its client connection and buffers.
pub const MAX_QUEUE_TIMEOUT_MS: u64 = 300_000;
pub const MAX_MAX_QUEUED: u64 = 100_000;

/// The route's waiting queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queue {
    /// How long a request may wait for room before it gets the 429 it would have got at once.
    pub timeout_ms: u64,
    /// How many requests may wait in one VM; the next one is refused at once, as without a queue.
    pub max_queued: u64,
}

impl Queue {
    /// `queueTimeoutMs` absent or 0: no queue (refuse at once, as before).
    pub(super) fn read(
        raw: &RawLbConfig,
        r: &mut Reader<'_>,
    ) -> Result<Option<Queue>, ConfigError> {
        let timeout = r.own("queueTimeoutMs", &raw.queue_timeout_ms)?.unwrap_or(0);
        let max = r.own("maxQueued", &raw.max_queued)?;
        if timeout == 0 {
            if max.is_some() {
                return Err(r.err("maxQueued", "needs `queueTimeoutMs` (the queue is off)"));
            }
            return Ok(None);
        }
        if timeout > MAX_QUEUE_TIMEOUT_MS {
            return Err(r.err(
                "queueTimeoutMs",
                format!("{timeout} ms is outside 0-{MAX_QUEUE_TIMEOUT_MS} (0: no queue)"),
            ));
        }
        let max_queued = max.unwrap_or(DEFAULT_MAX_QUEUED);
        if !(1..=MAX_MAX_QUEUED).contains(&max_queued) {
            return Err(r.err(
                "maxQueued",
                format!("{max_queued} is outside 1-{MAX_MAX_QUEUED}"),
            ));
        }
        Ok(Some(Queue {
            timeout_ms: timeout,
            max_queued,
        }))
    }
}
