//! What a prefix_cache decision leaves for its response's verification (the engine-verified
//! index, docs/redis-data-model.md §5 "Engine-verified keys"; verified.rs reads it), and the
//! usage request added to a stream's body.

use crate::config::RouteConfig;
use crate::host::Host;
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
    pub fn new(prefix_bytes: Vec<u64>, injected: bool, index: Index) -> Expect {
        Expect {
            prefix_bytes,
            injected,
            matched: None,
            index,
        }
    }
}

/// Adds the usage request to a streamed Chat / Completions body that lacks `stream_options`
/// (replacing the buffered body and its `content-length`); whether it did. Responses and
/// Anthropic Messages streams end with their usage unasked, and their APIs may refuse a field
/// they do not define. A failed write leaves the body as it was: the stream is then not
/// verified.
pub fn ask_for_usage(host: &mut dyn Host, canon: &Canonical, body: &[u8]) -> bool {
    if !matches!(canon.api, Api::ChatCompletions | Api::Completions) {
        return false;
    }
    let Streamed::Injected(with_usage) = verify::inject::streamed_canonical(canon, body) else {
        return false;
    };
    if host.set_request_body(&with_usage).is_err() {
        return false;
    }
    // Only a body that had a length gets the new one (a chunked request has none).
    if host
        .request_header("content-length")
        .ok()
        .flatten()
        .is_some()
    {
        let _ = host.set_request_header("content-length", &with_usage.len().to_string());
    }
    true
}
