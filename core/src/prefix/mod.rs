//! `prefix_cache` policy core: request body → canonical blocks → chained prefix keys.
//!
//! Pure functions, no host calls. [`canonicalize`] turns an OpenAI Chat / Completions /
//! Responses or Anthropic Messages body into blocks (one per tool list, system prompt and
//! message; long ones cut into fixed-size pieces); [`chain_keys`] salts them with the model
//! and chains them into 8-byte keys; [`prefix_key`] names the Redis key of each. The plain-Envoy
//! build keeps those keys in [`local_index`] (shared data) and, where none is known, chooses by
//! [`chwbl`] on the key of the [`anchor`] block.

mod anchor;
mod block;
mod canon;
mod chain;
pub mod chwbl;
mod error;
mod json;
pub mod local_index;
mod message;
mod tokens;

pub use anchor::{anchor, anchor_of, Anchor};
pub use block::{StreamOptions, KIND_CONTINUATION, KIND_MESSAGE, KIND_PROMPT, KIND_TOOLS};
pub use canon::{canonicalize, Api, CanonConfig, Canonical};
pub use chain::{block_hash, chain_keys, key_hex, prefix_key, PrefixKey};
pub use error::CanonError;
pub use tokens::{PromptTokens, BYTES_PER_TOKEN};

#[cfg(test)]
mod tests;
