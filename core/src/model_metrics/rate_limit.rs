//! `rate_limit` of Higress `endpoint_metrics`: if the chosen pod got more than `rate_limit` of the
//! last [`WINDOW`] decisions, another pod is picked (docs/model-server-metrics.md §4). Pure
//! sliding window; where it lives (per proxy rather than per VM) is the caller's business.

use std::collections::VecDeque;

/// Decisions remembered; Higress keeps the last 100 (its `FixedQueue`).
pub const WINDOW: usize = 100;

/// Sliding window of the last decisions, stored as address hashes (no allocation per decision).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateLimitWindow {
    recent: VecDeque<u64>,
}

impl RateLimitWindow {
    pub fn new() -> Self {
        Self::default()
    }

    /// Share (0..=1) of the remembered decisions that went to `addr`; 0 when empty.
    pub fn share(&self, addr: &str) -> f64 {
        if self.recent.is_empty() {
            return 0.0;
        }
        let h = addr_hash(addr);
        let hits = self.recent.iter().filter(|&&x| x == h).count();
        hits as f64 / self.recent.len() as f64
    }

    /// Whether sending one more request to `addr` would break the limit. `limit >= 1.0` is off,
    /// as in Higress (default 1.0). Counting the candidate decision itself keeps a single pod
    /// from taking every request of an empty window.
    pub fn would_exceed(&self, addr: &str, limit: f64) -> bool {
        if limit >= 1.0 || limit.is_nan() {
            return false;
        }
        let h = addr_hash(addr);
        let hits = self.recent.iter().filter(|&&x| x == h).count();
        let len = self.recent.len();
        // An empty or tiny window says nothing yet; judge once it holds a few decisions.
        if len < 10 {
            return false;
        }
        (hits + 1) as f64 / (len + 1) as f64 > limit
    }

    /// Remembers a decision, forgetting the oldest beyond [`WINDOW`].
    pub fn record(&mut self, addr: &str) {
        if self.recent.len() >= WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(addr_hash(addr));
    }

    /// The remembered decisions (oldest first), to keep the window in shared data.
    pub fn hashes(&self) -> Vec<u64> {
        self.recent.iter().copied().collect()
    }

    /// A window restored from [`Self::hashes`] (the newest [`WINDOW`] kept).
    pub fn from_hashes(h: &[u64]) -> Self {
        let skip = h.len().saturating_sub(WINDOW);
        Self {
            recent: h.iter().skip(skip).copied().collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.recent.len()
    }

    pub fn is_empty(&self) -> bool {
        self.recent.is_empty()
    }
}

/// FNV-1a 64: stable across VMs, so a window can be shared if the caller serialises it.
fn addr_hash(addr: &str) -> u64 {
    crate::hash::fnv1a(crate::hash::FNV_OFFSET, addr.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_is_bounded_and_counts_share() {
        let mut w = RateLimitWindow::new();
        for i in 0..250 {
            w.record(if i % 4 == 0 { "a:1" } else { "b:1" });
        }
        assert_eq!(w.len(), WINDOW);
        assert!((w.share("a:1") - 0.25).abs() < 1e-9);
        assert!((w.share("b:1") - 0.75).abs() < 1e-9);
        assert_eq!(w.share("c:1"), 0.0);
    }

    #[test]
    fn limit_off_at_one_and_checked_below() {
        let mut w = RateLimitWindow::new();
        for _ in 0..50 {
            w.record("a:1");
        }
        assert!(!w.would_exceed("a:1", 1.0));
        assert!(w.would_exceed("a:1", 0.5));
        assert!(!w.would_exceed("b:1", 0.5));
        assert!(!RateLimitWindow::new().would_exceed("a:1", 0.1));
    }
}
