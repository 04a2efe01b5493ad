//! When a pod's shortfalls mean it lost everything (a flush or a restart the host list did not
//! show), not some conversations to eviction (docs/redis-data-model.md §5 "Engine-verified
//! keys", step 4). A pod evicting under memory pressure answers some predicted hits short and
//! keeps others; forgetting all it holds would drop the conversations it still serves. A pod
//! whose cache was emptied holds nothing of any conversation it was sent before: every
//! predicted hit comes back with nothing of its conversation cached until it is refilled. So
//! the pod-wide forget needs [`FLUSH_CONVERSATIONS`] answers from as many unrelated
//! conversations (distinct anchor keys), each holding nothing of its own blocks, within
//! [`FLUSH_WINDOW_MS`] and with no answer between that found any of its conversation's blocks
//! on the pod. Otherwise a severe shortfall forgets only what it proved gone: its
//! conversation's blocks past what was cached. Pure: the balancer feeds it every verified
//! prediction and does what it answers (balancer/verify.rs).

use super::{Forget, Shortfall};
use std::collections::HashMap;

/// Unrelated conversations that must each come back with nothing cached: the requests in flight
/// on, or next sent to, an emptied pod all do, and a pod evicting by LRU keeps its recent
/// conversations, whose answers end the run.
pub const FLUSH_CONVERSATIONS: usize = 3;
/// The span those answers must fall within: an emptied pod's next predicted hits come back
/// within the few seconds of their prefill; a pod thrashing under memory pressure loses an old
/// conversation now and then.
pub const FLUSH_WINDOW_MS: u64 = 10_000;
/// The most pods followed (a route's pods come and go).
const MAX_PODS: usize = 4096;

/// One verified answer, as the rule reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    /// The conversation: its anchor block's chain key (the first block past the shared
    /// preamble, docs/redis-data-model.md §9 1.).
    pub conversation: u64,
    /// The pick predicted a hit on this pod.
    pub predicted: bool,
    pub verdict: Shortfall,
    /// The prompt's leading blocks the answer covers (`verify::held_blocks`).
    pub held: usize,
    /// The conversation's first own block, past the shared preamble (`prefixAnchor`).
    pub anchor: usize,
    pub now_ms: u64,
}

impl Answer {
    /// Severely short, with none of the conversation's own blocks held: at most the preamble,
    /// which other conversations keep warm.
    fn empty(&self) -> bool {
        self.verdict == Shortfall::Severe && self.held <= self.anchor
    }
}

/// Per pod, the conversations that came back empty since its last answer that held something.
#[derive(Debug, Default)]
pub struct Flushes {
    pods: HashMap<String, Vec<(u64, u64)>>,
}

impl Flushes {
    /// Takes `pod`'s answer; what the index is to forget: the pod (taken as emptied: the
    /// pod-wide generation bump), or after a severe shortfall its conversation's keys from the
    /// first block not held on (never before the anchor), or nothing.
    pub fn answer(&mut self, pod: &str, a: Answer) -> Option<Forget> {
        let own = Forget::From(a.held.max(a.anchor));
        let shortfall = (a.verdict == Shortfall::Severe).then_some(own);
        if !a.predicted {
            return None; // a miss says nothing of what the pod holds
        }
        if !a.empty() {
            // It held some of what was predicted: whatever fell short before was eviction.
            self.pods.remove(pod);
            return shortfall;
        }
        if self.pods.len() >= MAX_PODS && !self.pods.contains_key(pod) {
            self.pods.clear();
        }
        let run = self.pods.entry(pod.to_string()).or_default();
        run.retain(|&(c, at)| {
            c != a.conversation && a.now_ms.saturating_sub(at) <= FLUSH_WINDOW_MS
        });
        run.push((a.conversation, a.now_ms));
        if run.len() < FLUSH_CONVERSATIONS {
            return shortfall;
        }
        self.pods.remove(pod);
        Some(Forget::Pod)
    }

    /// Conversations counted toward `pod`'s flush now.
    pub fn pending(&self, pod: &str) -> usize {
        self.pods.get(pod).map_or(0, Vec::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer of conversation `c` predicted in full (blocks 0..10, anchor 1) that held `held`
    /// blocks.
    fn answer(c: u64, verdict: Shortfall, held: usize, now_ms: u64) -> Answer {
        Answer {
            conversation: c,
            predicted: true,
            verdict,
            held,
            anchor: 1,
            now_ms,
        }
    }

    fn empty(c: u64, now_ms: u64) -> Answer {
        answer(c, Shortfall::Severe, 1, now_ms)
    }

    const OWN: Option<Forget> = Some(Forget::From(1));

    #[test]
    fn unrelated_conversations_all_empty_at_once_forget_the_pod() {
        let mut f = Flushes::default();
        assert_eq!(f.answer("p", empty(1, 0)), OWN);
        assert_eq!(f.answer("p", empty(2, 100)), OWN);
        assert_eq!(f.answer("q", empty(3, 150)), OWN, "another pod's answer");
        assert_eq!(f.answer("p", empty(3, 200)), Some(Forget::Pod));
        assert_eq!(f.pending("p"), 0, "started afresh after the bump");
        assert_eq!(f.pending("q"), 1);
    }

    #[test]
    fn a_shortfall_forgets_its_conversation_past_what_was_held() {
        let mut f = Flushes::default();
        let partial = answer(1, Shortfall::Severe, 4, 0);
        assert_eq!(f.answer("p", partial), Some(Forget::From(4)));
        let preamble_only = answer(2, Shortfall::Severe, 0, 0);
        assert_eq!(f.answer("p", preamble_only), OWN, "never before the anchor");
        for v in [Shortfall::Mild, Shortfall::None] {
            assert_eq!(f.answer("p", answer(3, v, 8, 0)), None, "{v:?}");
        }
    }

    #[test]
    fn one_conversation_short_again_and_again_is_eviction() {
        let mut f = Flushes::default();
        for t in 0..10 {
            assert_eq!(f.answer("p", empty(7, t * 100)), OWN);
        }
        assert_eq!(f.pending("p"), 1);
    }

    #[test]
    fn an_answer_that_held_something_ends_the_run() {
        let mut f = Flushes::default();
        f.answer("p", empty(1, 0));
        f.answer("p", empty(2, 10));
        // Partly evicted (severe, but some of its own blocks held), mildly short, as predicted.
        for held in [
            answer(3, Shortfall::Severe, 2, 20),
            answer(3, Shortfall::Mild, 1, 20),
            answer(3, Shortfall::None, 9, 20),
        ] {
            assert_ne!(f.answer("p", held), Some(Forget::Pod));
            assert_eq!(f.pending("p"), 0);
            f.answer("p", empty(1, 30));
            f.answer("p", empty(2, 40));
        }
        // A miss predicted nothing: it neither counts nor ends the run.
        let miss = Answer {
            predicted: false,
            ..empty(9, 50)
        };
        assert_eq!(f.answer("p", miss), None);
        assert_eq!(f.answer("p", empty(3, 60)), Some(Forget::Pod));
    }

    #[test]
    fn empties_spread_over_longer_than_the_window_are_eviction() {
        let mut f = Flushes::default();
        let step = FLUSH_WINDOW_MS / 2 + 1;
        for c in 0..10 {
            assert_eq!(f.answer("p", empty(c, c * step)), OWN, "conversation {c}");
        }
        assert_eq!(f.pending("p"), 2);
    }

    #[test]
    fn pods_followed_are_bounded() {
        let mut f = Flushes::default();
        for p in 0..MAX_PODS + 10 {
            f.answer(&format!("10.0.0.{p}:8000"), empty(1, 0));
        }
        assert!(f.pods.len() <= MAX_PODS);
    }
}
