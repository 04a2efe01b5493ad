//! prefix_cache's prefill booking as a routed request holds it (docs/redis-data-model.md §13).

use crate::redis::scripts::Booked;

/// prefix_cache: the uncached prompt tokens a pick booked on its endpoint until the first
/// response bytes, which also time the endpoint's prefill rate (docs/redis-data-model.md §13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Booking {
    pub booked: Booked,
    /// When the pick was planned (host clock, ms): the first bytes' time from it is the TTFT
    /// of a streamed request (`timed`); other responses start after the whole answer.
    pub since_ms: u64,
    pub timed: bool,
}

/// Fewer tokens than this do not time a prefill: the fixed costs (network, scheduling, the
/// first decode step) would dominate the sample.
const MIN_TIMED_TOKENS: u64 = 1024;

impl Booking {
    /// The prefill rate (tokens/s) a streamed request's first bytes at `now_ms` show: the
    /// tokens its endpoint had booked ahead of it and its own, over its time to first bytes.
    /// 0: no sample.
    pub fn rate_sample(&self, now_ms: u64) -> u64 {
        let tokens = self.booked.ahead.saturating_add(self.booked.tokens);
        let ttft_ms = now_ms.saturating_sub(self.since_ms);
        if !self.timed || tokens < MIN_TIMED_TOKENS || ttft_ms == 0 {
            return 0;
        }
        tokens.saturating_mul(1000) / ttft_ms
    }
}
