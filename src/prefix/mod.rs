//! `prefix_cache` policy core: request body → canonical blocks → chained prefix keys.
//!
//! Pure functions, no host calls. [`canonicalize`] turns an OpenAI Chat / Completions /
//! Responses or Anthropic Messages body into blocks (one per tool list, system prompt and
//! message; long ones cut into fixed-size pieces); [`chain_keys`] salts them with the model
//! and chains them into 8-byte keys; [`prefix_key`] names the Redis key of each.

mod canon;
mod chain;
mod json;

pub use canon::{
    canonicalize, Api, CanonConfig, CanonError, Canonical, KIND_CONTINUATION, KIND_MESSAGE,
    KIND_PROMPT, KIND_TOOLS,
};
pub use chain::{block_hash, chain_keys, key_hex, prefix_key, PrefixKey};

#[cfg(test)]
mod tests;
