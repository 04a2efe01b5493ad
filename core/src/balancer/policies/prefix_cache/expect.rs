//! What a prefix_cache decision leaves for its response's verification (the engine-verified
//! index, docs/redis-data-model.md §5 "Engine-verified keys"; verified.rs reads it), and the
//! usage request added to a stream's body.

use crate::config::RouteConfig;
use crate::prefix::{Api, Canonical, PrefixKey};
use crate::redis::scripts::{Keys, PrefixChain};
use crate::verify::{self, inject::Streamed};
use std::rc::Rc;

/// What a prefix_cache decision leaves for its response's verification.
#[derive(Debug, Clone)]
pub struct Expect {
    /// `Canonical::prefix_bytes`: the prompt's size up to each block.
    pub prefix_bytes: Vec<u64>,
    /// The plugin added `stream_options.include_usage`: the usage event is taken out again.
    pub injected: bool,
    /// How many of the prompt's blocks the pick matched (Redis: known at its reply).
    pub matched: Option<usize>,
    /// The whole prompt's tokens as the plugin estimates them (`PromptTokens::total`): with
    /// the engine's own count from the answer, it converts the prediction into the engine's
    /// tokens (`verify::Prediction::in_engine_tokens`).
    pub estimated_prompt_tokens: u64,
    pub index: Index,
}

/// The index a shortfall corrects.
#[derive(Debug, Clone)]
pub enum Index {
    /// Higress: the chain keys sent (from block `anchor` on) in the route's `keys`.
    Redis {
        config: Rc<RouteConfig>,
        keys: Rc<Keys>,
        chain: Rc<PrefixChain>,
        anchor: usize,
    },
    /// Plain Envoy: the chain's keys and the positions read and recorded; the route config's
    /// policy holds the index.
    Local {
        keys: Vec<PrefixKey>,
        window: Vec<usize>,
    },
}

impl Expect {
    pub fn new(
        prefix_bytes: Vec<u64>,
        estimated_prompt_tokens: u64,
        injected: bool,
        index: Index,
    ) -> Expect {
        Expect {
            prefix_bytes,
            injected,
            matched: None,
            estimated_prompt_tokens,
            index,
        }
    }
}

/// A streamed Chat / Completions body that lacks `stream_options`, with the usage request
/// added (None: leave the body as it is). Responses and Anthropic Messages streams end with
/// their usage unasked, and their APIs may refuse a field they do not define. The rewritten
/// body goes in the request's placement (publish.rs): it reaches the engine only with the
/// verifying holding that takes the usage event out again.
pub fn with_usage_asked(canon: &Canonical, body: &[u8]) -> Option<Vec<u8>> {
    if !matches!(canon.api, Api::ChatCompletions | Api::Completions) {
        return None;
    }
    match verify::inject::streamed_canonical(canon, body) {
        Streamed::Injected(with_usage) => Some(with_usage),
        _ => None,
    }
}
