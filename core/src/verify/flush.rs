//! When a pod's shortfalls mean it lost everything (a flush or a restart the host list did not
//! show), not some conversations to eviction (docs/redis-data-model.md §5 "Engine-verified
//! keys", step 4). A pod evicting under memory pressure answers some predicted hits short and
//! keeps others; forgetting all it holds would drop the conversations it still serves. A pod
//! whose cache was emptied holds nothing of any conversation it was sent before, not even its
//! first engine block: so the pod-wide forget needs [`FLUSH_CONVERSATIONS`] answers from as
//! many unrelated conversations (distinct anchor keys), each with nothing of its own cached,
//! within [`FLUSH_WINDOW_MS`], and no answer between that found any of its conversation on the
//! pod. A single short answer changes nothing: that request has just recomputed its prompt on
//! the pod, and its pick already pointed the conversation's keys there.
//!
//! How long a run it takes depends on the other pods. Where the route's other pods keep what
//! is predicted on them, [`FLUSH_CONVERSATIONS`]; where they come back empty too (the fleet is
//! evicting: its KV is too small for its conversations), a run of old conversations coming back
//! empty on one pod is eviction's luck, and the run must be long enough that its odds at the
//! other pods' rate of empty answers are under [`CHANCE_RUN`] (at most [`MAX_RUN`]: a fleet
//! evicting more is never judged emptied by its answers; a restart still shows in the metrics,
//! prefix_cache/restarts.rs, and a missed flush costs little where hits are that rare). Pure:
//! the prefix_cache policy feeds it every verified prediction of its route
//! (policies/prefix_cache/verified.rs).

use super::{Shortfall, ENGINE_BLOCK_TOKENS};
use crate::hash;
use std::collections::{HashMap, VecDeque};

/// Unrelated conversations that must each come back with nothing cached: the requests in flight
/// on, or next sent to, an emptied pod all do, and a pod evicting by LRU keeps its recent
/// conversations and the first blocks of older ones, whose answers end the run. The least run:
/// forgetting a pod that still holds conversations costs far more than a pod's conversations
/// each coming back short once after a flush; a fleet short of KV asks for longer ones
/// ([`Flushes::answer`], docs/redis-data-model.md §5).
pub const FLUSH_CONVERSATIONS: usize = 8;
/// The span those answers must fall within: an emptied pod's next predicted hits come back
/// within the few seconds of their prefill.
pub const FLUSH_WINDOW_MS: u64 = 10_000;
/// The most pods followed (a route's pods come and go).
const MAX_PODS: usize = 4096;
/// The route's last predicted answers, every pod's, that say whether the fleet is evicting.
pub const FLEET_ANSWERS: usize = 128;
/// Other pods' answers among them needed to judge; with fewer, a run of
/// [`FLUSH_CONVERSATIONS`] is enough.
pub const FLEET_MIN_OTHERS: usize = 4;
/// The odds a run of empty answers may have by chance, at the other pods' rate of them.
pub const CHANCE_RUN: f64 = 1e-4;
/// The longest run asked for: a fleet evicting more than this allows is never judged emptied by
/// its answers (a 0.75 share of empty answers asks for 33).
pub const MAX_RUN: usize = 32;

/// One verified answer, as the rule reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    /// The conversation: its anchor block's chain key (the first block past the shared
    /// preamble, docs/redis-data-model.md §9 1.).
    pub conversation: u64,
    /// The pick predicted a hit on this pod.
    pub predicted: bool,
    pub verdict: Shortfall,
    pub cached_tokens: u64,
    /// The prompt's tokens before its anchor block: a preamble other conversations keep warm.
    pub preamble_tokens: u64,
    pub now_ms: u64,
}

impl Answer {
    /// Severely short, with not one engine block of the conversation's own cached.
    fn empty(&self) -> bool {
        self.verdict == Shortfall::Severe
            && self.cached_tokens < self.preamble_tokens.saturating_add(ENGINE_BLOCK_TOKENS)
    }
}

/// Per pod, the conversations that came back empty since its last answer that held something;
/// and the route's last predicted answers.
#[derive(Debug, Default)]
pub struct Flushes {
    pods: HashMap<String, Vec<(u64, u64)>>,
    /// (pod, held something) of the last [`FLEET_ANSWERS`] predicted answers, pods hashed.
    fleet: VecDeque<(u64, bool)>,
}

impl Flushes {
    /// Takes `pod`'s answer; whether the pod is now taken as emptied (the pod-wide forget: its
    /// generation bumped).
    pub fn answer(&mut self, pod: &str, a: Answer) -> bool {
        if !a.predicted {
            return false; // a miss says nothing of what the pod holds
        }
        let id = hash::fnv1a(hash::FNV_OFFSET, pod.as_bytes());
        if !a.empty() {
            // It held some of its conversation: whatever fell short before was eviction.
            self.remember(id, true);
            self.pods.remove(pod);
            return false;
        }
        // Judged by the other pods' answers before this one.
        let needed = self.run_needed(id);
        self.remember(id, false);
        if self.pods.len() >= MAX_PODS && !self.pods.contains_key(pod) {
            self.pods.clear();
        }
        let run = self.pods.entry(pod.to_string()).or_default();
        run.retain(|&(c, at)| {
            c != a.conversation && a.now_ms.saturating_sub(at) <= FLUSH_WINDOW_MS
        });
        run.push((a.conversation, a.now_ms));
        if needed.is_none_or(|n| run.len() < n) {
            return false;
        }
        self.pods.remove(pod);
        true
    }

    /// One more of the route's predicted answers: its pod, and whether it held something.
    fn remember(&mut self, pod: u64, held: bool) {
        if self.fleet.len() >= FLEET_ANSWERS {
            self.fleet.pop_front();
        }
        self.fleet.push_back((pod, held));
    }

    /// The run of empty answers that makes `pod` emptied: [`FLUSH_CONVERSATIONS`], or more
    /// when the other pods' recent predicted answers come back empty too, so that a run as long
    /// by chance at their rate has odds under [`CHANCE_RUN`]; None when no run is that unlikely
    /// within [`MAX_RUN`].
    fn run_needed(&self, pod: u64) -> Option<usize> {
        let (empty, others) = self
            .fleet
            .iter()
            .filter(|(p, _)| *p != pod)
            .fold((0u32, 0u32), |(e, n), (_, held)| {
                (e + u32::from(!*held), n + 1)
            });
        if (others as usize) < FLEET_MIN_OTHERS || empty == 0 {
            return Some(FLUSH_CONVERSATIONS);
        }
        if empty == others {
            return None; // no run is unlikely where every answer comes back empty
        }
        let rate = f64::from(empty) / f64::from(others);
        let n = (CHANCE_RUN.ln() / rate.ln()).ceil();
        (n <= MAX_RUN as f64).then(|| FLUSH_CONVERSATIONS.max(n as usize))
    }

    /// Conversations counted toward `pod`'s flush now.
    pub fn pending(&self, pod: &str) -> usize {
        self.pods.get(pod).map_or(0, Vec::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer of conversation `c` (a 100-token preamble before its anchor block) that cached
    /// `cached` tokens.
    fn answer(c: u64, verdict: Shortfall, cached: u64, now_ms: u64) -> Answer {
        Answer {
            conversation: c,
            predicted: true,
            verdict,
            cached_tokens: cached,
            preamble_tokens: 100,
            now_ms,
        }
    }

    fn empty(c: u64, now_ms: u64) -> Answer {
        answer(c, Shortfall::Severe, 100, now_ms)
    }

    /// Conversations `from..from + n` come back empty on `pod`, at `now_ms`: whether the last
    /// one flushed it.
    fn empties(f: &mut Flushes, pod: &str, from: u64, n: usize, now_ms: u64) -> bool {
        (from..from + n as u64)
            .map(|c| f.answer(pod, empty(c, now_ms)))
            .last()
            .unwrap_or(false)
    }

    #[test]
    fn unrelated_conversations_all_empty_at_once_forget_the_pod() {
        let mut f = Flushes::default();
        let n = FLUSH_CONVERSATIONS;
        assert!(!empties(&mut f, "p", 0, n - 2, 0));
        assert!(
            !f.answer("p", answer(99, Shortfall::Severe, 0, 100)),
            "nothing at all"
        );
        assert!(!f.answer("q", empty(1_000, 150)), "another pod's answer");
        assert!(f.answer("p", empty(1_000, 200)));
        assert_eq!(f.pending("p"), 0, "started afresh after the bump");
        assert_eq!(f.pending("q"), 1);
    }

    #[test]
    fn one_conversation_short_again_and_again_is_eviction() {
        let mut f = Flushes::default();
        for t in 0..10 {
            assert!(!f.answer("p", empty(7, t * 100)));
        }
        assert_eq!(f.pending("p"), 1);
    }

    #[test]
    fn an_answer_that_held_something_ends_the_run() {
        let mut f = Flushes::default();
        let n = FLUSH_CONVERSATIONS;
        // One engine block of its own held (an LRU keeps a prompt's first blocks longest),
        // mildly short, as predicted.
        for held in [
            answer(99, Shortfall::Severe, 100 + ENGINE_BLOCK_TOKENS, 20),
            answer(99, Shortfall::Mild, 0, 20),
            answer(99, Shortfall::None, 900, 20),
        ] {
            assert!(!empties(&mut f, "p", 0, n - 1, 0));
            assert!(!f.answer("p", held));
            assert_eq!(f.pending("p"), 0);
        }
        assert!(!empties(&mut f, "p", 0, n - 1, 30));
        // A miss predicted nothing: it neither counts nor ends the run.
        let miss = Answer {
            predicted: false,
            ..empty(99, 50)
        };
        assert!(!f.answer("p", miss));
        assert!(f.answer("p", empty(99, 60)));
    }

    #[test]
    fn empties_spread_over_longer_than_the_window_are_eviction() {
        let mut f = Flushes::default();
        let step = FLUSH_WINDOW_MS / (FLUSH_CONVERSATIONS as u64 - 1) + 1;
        for c in 0..3 * FLUSH_CONVERSATIONS as u64 {
            assert!(!f.answer("p", empty(c, c * step)), "conversation {c}");
        }
        assert_eq!(f.pending("p"), FLUSH_CONVERSATIONS - 1);
    }

    /// The run asked for grows with the other pods' share of empty answers: 8 while they hold
    /// what is predicted, as long as makes its odds by chance under 1 in 10,000 while they
    /// evict, and never past [`MAX_RUN`].
    #[test]
    fn the_run_asked_for_follows_the_other_pods_share_of_empty_answers() {
        let held = |c: u64| answer(c, Shortfall::None, 900, 0);
        // q and r answer `empty_of_eight` empty of every eight, again and again; then p's run.
        let run_for = |empty_of_eight: usize| {
            let mut f = Flushes::default();
            for c in 0..(FLEET_ANSWERS / 8) as u64 {
                for k in 0..8 {
                    let pod = if k % 2 == 0 { "q" } else { "r" };
                    let a = if k < empty_of_eight {
                        empty(1_000 + 8 * c + k as u64, 0)
                    } else {
                        held(c)
                    };
                    f.answer(pod, a);
                }
            }
            (0..MAX_RUN as u64 + 1)
                .position(|c| f.answer("p", empty(c, 10)))
                .map(|at| at + 1)
        };
        assert_eq!(run_for(0), Some(FLUSH_CONVERSATIONS), "the others hold");
        // 1e-4 at a quarter empty: 7 (so 8); at half: 14 (0.5^14 < 1e-4 < 0.5^13), or 13 as
        // p's own answers push the oldest of the others' (four empty) out of the window.
        assert_eq!(run_for(2), Some(FLUSH_CONVERSATIONS));
        assert!(matches!(run_for(4), Some(13 | 14)), "{:?}", run_for(4));
        // Seven of eight: 0.875^32 > 1e-4.
        assert_eq!(run_for(7), None);
        assert_eq!(run_for(8), None, "every answer empty");
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
