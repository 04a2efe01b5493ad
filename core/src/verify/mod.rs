//! The engine-verified prefix index (docs/redis-data-model.md §5 "Engine-verified keys", §9):
//! engines tell every client how much of its prompt they had cached
//! (`usage.prompt_tokens_details.cached_tokens`), so a prefix_cache route reads that number at
//! the end of a 2xx response ([`usage`]), asks for it on a stream that did not
//! ([`inject`], taken out again by [`sse`]), and compares it with the prefix its pick
//! predicted the pod holds ([`judge`]). A severe shortfall means the pod lost cache the index
//! thought it had (eviction, restart); only a pod found emptied ([`flush`]) has its generation
//! bumped, so its older index entries stop matching. Pure: the balancer
//! (`balancer/verify.rs`) does the host calls.

pub mod answer_id;
pub mod flush;
pub mod inject;
pub mod sse;
pub mod usage;

use crate::config::BYTES_PER_TOKEN;
pub use usage::{Tokens, Usage};

/// What the pick predicted, in approximate tokens (bytes / [`BYTES_PER_TOKEN`], as the chain
/// knows its blocks' sizes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Prediction {
    /// The matched prefix: the pod is thought to hold this much of the prompt (0: a miss).
    pub tokens: u64,
    /// The same prefix without its deepest block.
    pub tokens_but_last: u64,
}

impl Prediction {
    /// The prediction of a match on the prompt's first `blocks` blocks, whose sizes are
    /// `prefix_bytes` (`prefix_bytes[n]`: the bytes of the first `n` blocks,
    /// `Canonical::prefix_bytes`).
    pub fn at(prefix_bytes: &[u64], blocks: usize) -> Prediction {
        if blocks == 0 {
            return Prediction::default();
        }
        let at = |n: usize| prefix_bytes.get(n).copied().unwrap_or(0) / BYTES_PER_TOKEN;
        Prediction {
            tokens: at(blocks),
            tokens_but_last: at(blocks - 1),
        }
    }

    /// The prediction in the engine's tokens: the plugin counts [`BYTES_PER_TOKEN`] bytes a
    /// token, the engine's tokenizer may not (on the real-engine tests' English words llama.cpp
    /// counted about a fifth fewer, so every hit read as a mild shortfall; docs/real-engines.md).
    /// Each answer says how many tokens the engine made of the whole prompt, so the prediction
    /// is scaled by that over the plugin's `estimated` count of the same prompt. A ratio past
    /// 4× either way is no tokenizer's: the prediction is kept as it is.
    pub fn in_engine_tokens(self, estimated: u64, engine_prompt: u64) -> Prediction {
        if estimated == 0 || engine_prompt == 0 {
            return self;
        }
        let ratio = engine_prompt as f64 / estimated as f64;
        if !(0.25..=4.0).contains(&ratio) {
            return self;
        }
        let scale = |t: u64| (t as f64 * ratio).round() as u64;
        Prediction {
            tokens: scale(self.tokens),
            tokens_but_last: scale(self.tokens_but_last),
        }
    }
}

/// The largest KV block an engine caches in, tokens: vLLM's default `block_size` is 16, some
/// of its attention backends need 64; SGLang's radix cache holds single tokens. An engine that
/// holds a whole prefix reports it short of its last, partial block and of its last token, so a
/// matched prefix whose deepest plugin block (a short last message) is under this can be held
/// whole and still be reported short of that block.
pub const ENGINE_BLOCK_TOKENS: u64 = 64;

/// How an engine's answer compares with the prediction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shortfall {
    /// It had what was predicted, within one block — the plugin's deepest matched block or an
    /// engine block ([`ENGINE_BLOCK_TOKENS`]), whichever is longer (an engine caches whole
    /// blocks and recomputes the last token) — or nothing was predicted.
    None,
    /// More than one block short but at least half there: counted, nothing changes (a
    /// partial eviction the next turn repairs by itself).
    Mild,
    /// Under half the predicted prefix and more than one block short: the pod lost what the
    /// index says it holds.
    Severe,
}

/// The shortfall rule.
pub fn judge(predicted: Prediction, cached_tokens: u64) -> Shortfall {
    let as_predicted = predicted
        .tokens_but_last
        .min(predicted.tokens.saturating_sub(ENGINE_BLOCK_TOKENS));
    if predicted.tokens == 0 || cached_tokens >= as_predicted {
        Shortfall::None
    } else if cached_tokens.saturating_mul(2) < predicted.tokens {
        Shortfall::Severe
    } else {
        Shortfall::Mild
    }
}

/// One routed response being watched: its tail, and, when the plugin asked for the stream's
/// usage, the filter that takes the usage event out again.
#[derive(Debug, Default)]
pub struct Watch {
    tail: usage::Tail,
    filter: Option<sse::UsageFilter>,
}

impl Watch {
    /// `injected`: the plugin added `include_usage` to this request.
    pub fn new(injected: bool) -> Watch {
        Watch {
            tail: usage::Tail::default(),
            filter: injected.then(sse::UsageFilter::default),
        }
    }

    /// A response body chunk: what to forward instead, if anything changes.
    pub fn chunk(&mut self, chunk: &[u8], end: bool) -> Option<Vec<u8>> {
        self.tail.push(chunk);
        self.filter.as_mut()?.filter(chunk, end)
    }

    /// At the end of the response: the token counts it reported.
    pub fn tokens(&self) -> Tokens {
        self.tail.tokens()
    }

    /// At the end of the response: the answer's own id, from its head (answer_id.rs).
    pub fn answer_id(&self) -> Option<String> {
        answer_id::answer_id(self.tail.head())
    }

    /// Whether it takes the usage event out of the stream (every chunk must pass it).
    pub fn filtering(&self) -> bool {
        self.filter.is_some()
    }

    /// Whether the head is all the bytes it keeps ([`usage::HEAD_BYTES`]).
    pub fn head_full(&self) -> bool {
        self.tail.head().len() >= usage::HEAD_BYTES
    }

    /// Usage-only events taken out of the stream.
    pub fn removed(&self) -> u32 {
        self.filter.as_ref().map_or(0, |f| f.removed)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_prediction_is_scaled_to_the_engines_tokens() {
        let p = Prediction {
            tokens: 1000,
            tokens_but_last: 900,
        };
        // The engine counted 800 tokens where the plugin estimated 1000: a whole hit of 800
        // cached tokens is as predicted once scaled, a mild shortfall without.
        assert_eq!(judge(p, 800), Shortfall::Mild);
        let scaled = p.in_engine_tokens(1250, 1000);
        assert_eq!((scaled.tokens, scaled.tokens_but_last), (800, 720));
        assert_eq!(judge(scaled, 790), Shortfall::None);
        assert_eq!(judge(scaled, 300), Shortfall::Severe);
        // Nothing to scale by, or no tokenizer's ratio: unchanged.
        assert_eq!(p.in_engine_tokens(0, 1000), p);
        assert_eq!(p.in_engine_tokens(1000, 0), p);
        assert_eq!(p.in_engine_tokens(1000, 5000), p);
        assert_eq!(p.in_engine_tokens(1000, 200), p);
        assert_eq!(
            Prediction::default().in_engine_tokens(10, 20),
            Prediction::default()
        );
    }

    use super::*;

    #[test]
    fn predictions_come_from_the_chains_prefix_sizes() {
        let bytes = [0, 2448, 4496, 6544];
        assert_eq!(Prediction::at(&bytes, 0), Prediction::default());
        assert_eq!(
            Prediction::at(&bytes, 2),
            Prediction {
                tokens: 1124,
                tokens_but_last: 612,
            }
        );
        assert_eq!(
            Prediction::at(&bytes, 9).tokens,
            0,
            "past the chain: nothing"
        );
    }

    #[test]
    fn the_shortfall_rule() {
        let p = Prediction {
            tokens: 2000,
            tokens_but_last: 1500,
        };
        assert_eq!(judge(p, 1990), Shortfall::None, "within the last block");
        assert_eq!(judge(p, 1500), Shortfall::None);
        assert_eq!(judge(p, 2500), Shortfall::None, "more than predicted");
        assert_eq!(judge(p, 1499), Shortfall::Mild);
        assert_eq!(judge(p, 1000), Shortfall::Mild, "half is still mild");
        assert_eq!(judge(p, 999), Shortfall::Severe);
        assert_eq!(judge(p, 0), Shortfall::Severe, "a restarted pod");
        assert_eq!(judge(Prediction::default(), 0), Shortfall::None, "a miss");
        let one_block = Prediction {
            tokens: 500,
            tokens_but_last: 0,
        };
        assert_eq!(
            judge(one_block, 0),
            Shortfall::None,
            "one block short at most"
        );
    }

    /// A perfect hit whose deepest matched block is a short last message (2 tokens): the engine
    /// held the whole prefix and reports its whole 16-token blocks less the last token, 1,024 of
    /// 1,027, under the prediction less that block (1,025). Counted `shortfall_mild` before.
    #[test]
    fn a_perfect_hit_on_a_short_last_message_is_no_shortfall() {
        let bytes = [0, 4100, 4108];
        let p = Prediction::at(&bytes, 2);
        assert_eq!((p.tokens, p.tokens_but_last), (1027, 1025));
        let engine_cached = (p.tokens - 1) / 16 * 16;
        assert_eq!(engine_cached, 1024);
        assert_eq!(judge(p, engine_cached), Shortfall::None);
        assert_eq!(judge(p, p.tokens - ENGINE_BLOCK_TOKENS), Shortfall::None);
        assert_eq!(
            judge(p, p.tokens - ENGINE_BLOCK_TOKENS - 1),
            Shortfall::Mild,
            "more than an engine block short"
        );
    }

    #[test]
    fn a_watch_scans_and_filters_the_original_bytes() {
        let usage = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":90,\"prompt_tokens_details\":{\"cached_tokens\":64}}}\n\n";
        let mut w = Watch::new(true);
        let (a, b) = usage.split_at(30);
        assert_eq!(w.chunk(a.as_bytes(), false), Some(Vec::new()));
        assert_eq!(w.chunk(b.as_bytes(), false), Some(Vec::new()));
        assert_eq!(w.chunk(b"data: [DONE]\n\n", true), None);
        assert_eq!(
            w.tokens().cache_report(),
            Some(Usage {
                prompt_tokens: 90,
                cached_tokens: 64
            })
        );
        assert_eq!(w.removed(), 1);
        let mut untouched = Watch::new(false);
        assert_eq!(untouched.chunk(usage.as_bytes(), true), None);
        assert_eq!(untouched.removed(), 0);
    }
}
