//! `rate_limit` of Higress `endpoint_metrics`: if the chosen pod got more than `rate_limit` of the
//! last [`WINDOW`] decisions, another pod is picked (docs/model-server-metrics.md §4). Higress PR
//! #4260's `window_size` / `window_seconds` make the window that many decisions, none older
//! than that many seconds. Pure sliding window; where it lives (per proxy rather than per VM)
//! is the caller's business.

use std::collections::VecDeque;

/// Decisions remembered by default; Higress keeps the last 100 (its `FixedQueue`).
pub const WINDOW: usize = 100;
/// The window judges once it holds this many decisions (or is full, if smaller).
const JUDGE_FROM: usize = 10;

/// Sliding window of the last decisions, stored as address hashes with the time of each (no
/// allocation per decision).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitWindow {
    /// (address hash, decision time ms), oldest first.
    recent: VecDeque<(u64, u64)>,
    capacity: usize,
    /// The time new decisions are recorded at.
    now_ms: u64,
}

impl Default for RateLimitWindow {
    fn default() -> Self {
        Self {
            recent: VecDeque::new(),
            capacity: WINDOW,
            now_ms: 0,
        }
    }
}

impl RateLimitWindow {
    pub fn new() -> Self {
        Self::default()
    }

    /// A window restored from [`Self::entries`] at `now_ms`: of `capacity` decisions at most
    /// (the newest kept), none older than `max_age_ms` when given.
    pub fn restore(
        entries: &[(u64, u64)],
        capacity: usize,
        max_age_ms: Option<u64>,
        now_ms: u64,
    ) -> Self {
        let capacity = capacity.max(1);
        let fresh = |at: u64| max_age_ms.is_none_or(|age| now_ms.saturating_sub(at) <= age);
        let kept: Vec<(u64, u64)> = entries
            .iter()
            .copied()
            .filter(|(_, at)| fresh(*at))
            .collect();
        let skip = kept.len().saturating_sub(capacity);
        Self {
            recent: kept.into_iter().skip(skip).collect(),
            capacity,
            now_ms,
        }
    }

    /// Share (0..=1) of the remembered decisions that went to `addr`; 0 when empty.
    pub fn share(&self, addr: &str) -> f64 {
        if self.recent.is_empty() {
            return 0.0;
        }
        hits(&self.recent, addr) as f64 / self.recent.len() as f64
    }

    /// Whether sending one more request to `addr` would break the limit. `limit >= 1.0` is off,
    /// as in Higress (default 1.0). Counting the candidate decision itself keeps a single pod
    /// from taking every request of an empty window.
    pub fn would_exceed(&self, addr: &str, limit: f64) -> bool {
        if limit >= 1.0 || limit.is_nan() {
            return false;
        }
        let len = self.recent.len();
        // An empty or tiny window says nothing yet; judge once it holds a few decisions.
        if len < JUDGE_FROM.min(self.capacity) {
            return false;
        }
        (hits(&self.recent, addr) + 1) as f64 / (len + 1) as f64 > limit
    }

    /// Remembers a decision, forgetting the oldest beyond the window's size.
    pub fn record(&mut self, addr: &str) {
        while self.recent.len() >= self.capacity {
            self.recent.pop_front();
        }
        self.recent.push_back((addr_hash(addr), self.now_ms));
    }

    /// The remembered decisions (oldest first), to keep the window in shared data.
    pub fn entries(&self) -> Vec<(u64, u64)> {
        self.recent.iter().copied().collect()
    }

    pub fn len(&self) -> usize {
        self.recent.len()
    }

    pub fn is_empty(&self) -> bool {
        self.recent.is_empty()
    }
}

fn hits(recent: &VecDeque<(u64, u64)>, addr: &str) -> usize {
    let h = addr_hash(addr);
    recent.iter().filter(|(x, _)| *x == h).count()
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

    /// Higress PR #4260: `window_size` decisions at most, none older than `window_seconds`.
    /// Before, the window kept the last 100 whatever their age, so an hour-old burst still
    /// moved picks off a pod.
    #[test]
    fn size_and_age_bound_the_window() {
        let mut w = RateLimitWindow::restore(&[], 20, Some(60_000), 1_000);
        for _ in 0..30 {
            w.record("a:1");
        }
        assert_eq!(w.len(), 20);
        assert!(w.would_exceed("a:1", 0.5));
        // A minute later the same decisions have aged out.
        let later = RateLimitWindow::restore(&w.entries(), 20, Some(60_000), 61_001);
        assert!(later.is_empty() && !later.would_exceed("a:1", 0.5));
        let kept = RateLimitWindow::restore(&w.entries(), 20, Some(60_000), 61_000);
        assert_eq!(kept.len(), 20);
        // Without an age, as Higress's released plugin: kept however old.
        assert_eq!(
            RateLimitWindow::restore(&w.entries(), 100, None, u64::MAX).len(),
            20
        );
        // A window smaller than 10 judges once full.
        let mut small = RateLimitWindow::restore(&[], 4, None, 0);
        for _ in 0..4 {
            small.record("a:1");
        }
        assert!(small.would_exceed("a:1", 0.5));
    }
}
