//! Which problems of which pod's metrics were already logged: a pod that emits NaN on every
//! scrape is logged once per metric, not once per scrape, and a fleet of broken pods is logged
//! at most [`LINES_PER_WINDOW`] lines per [`WINDOW_MS`] (the counters still count every text).
//! Pure bookkeeping; the caller writes the line.

use std::collections::HashMap;

/// Lines let through per window.
pub const LINES_PER_WINDOW: u32 = 10;
/// Rate-limit window.
pub const WINDOW_MS: u64 = 10_000;
/// Pods remembered before the memory is dropped wholesale (endpoint churn).
const MAX_PODS: usize = 4096;
/// Problems remembered per pod.
const MAX_KEYS: usize = 32;

#[derive(Debug, Default)]
pub struct NoteLog {
    /// Pod → problems already logged for it.
    seen: HashMap<String, Vec<String>>,
    /// Start of the current window: the first line let through in it.
    window_start_ms: Option<u64>,
    lines_in_window: u32,
}

impl NoteLog {
    pub fn new() -> Self {
        Self::default()
    }

    /// The problems of `keys` not yet logged for `pod`, when the rate limit lets a line through
    /// at `now_ms`; they are then remembered. Empty: write nothing (all logged already, or the
    /// limit is reached and they are tried again with the pod's next text).
    pub fn admit(&mut self, pod: &str, keys: &[String], now_ms: u64) -> Vec<String> {
        let known = self.seen.get(pod);
        let fresh: Vec<String> = keys
            .iter()
            .filter(|k| !known.is_some_and(|s| s.contains(k)))
            .cloned()
            .collect();
        if fresh.is_empty() {
            return fresh;
        }
        if self
            .window_start_ms
            .is_none_or(|t| now_ms.saturating_sub(t) >= WINDOW_MS)
        {
            self.window_start_ms = Some(now_ms);
            self.lines_in_window = 0;
        }
        if self.lines_in_window >= LINES_PER_WINDOW {
            return Vec::new();
        }
        self.lines_in_window += 1;
        if self.seen.len() >= MAX_PODS && !self.seen.contains_key(pod) {
            self.seen.clear();
        }
        let entry = self.seen.entry(pod.to_owned()).or_default();
        for k in &fresh {
            if entry.len() < MAX_KEYS {
                entry.push(k.clone());
            }
        }
        fresh
    }

    /// `pod`'s text had none of these problems: a later recurrence is logged again.
    pub fn clear(&mut self, pod: &str) {
        self.seen.remove(pod);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(k: &[&str]) -> Vec<String> {
        k.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn once_per_pod_and_problem() {
        let mut n = NoteLog::new();
        let nan = keys(&["vllm:num_requests_waiting: NaN or Inf"]);
        assert_eq!(n.admit("a", &nan, 0), nan);
        assert!(
            n.admit("a", &nan, 1).is_empty(),
            "second scrape: already said"
        );
        assert_eq!(n.admit("b", &nan, 2), nan, "another pod");
        let both = keys(&[
            "vllm:num_requests_waiting: NaN or Inf",
            "vllm:kv_cache_usage_perc: out of range",
        ]);
        assert_eq!(
            n.admit("a", &both, 3),
            keys(&["vllm:kv_cache_usage_perc: out of range"])
        );
        n.clear("a");
        assert_eq!(n.admit("a", &nan, 4), nan, "recurred after a clean text");
    }

    #[test]
    fn rate_limited_per_window_and_retried_later() {
        let mut n = NoteLog::new();
        let k = keys(&["x: NaN or Inf"]);
        for i in 0..LINES_PER_WINDOW {
            assert_eq!(n.admit(&format!("p{i}"), &k, 100), k);
        }
        assert!(n.admit("late", &k, 200).is_empty(), "over the limit");
        assert!(n.admit("late", &k, 100 + WINDOW_MS - 1).is_empty());
        assert_eq!(
            n.admit("late", &k, 100 + WINDOW_MS),
            k,
            "not lost: logged in the next window"
        );
    }
}
