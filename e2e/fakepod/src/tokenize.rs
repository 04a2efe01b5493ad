//! Deterministic approximate tokenizer and prefix-block hashing.
//!
//! Real tokenizers are model specific and heavy; routing quality only needs a token count that
//! scales with prompt length and token identities that make equal prefixes hash equally. So:
//!
//! * The request is rendered to a **canonical prompt text**. Chat: every message becomes
//!   `role\ncontent\n` (content-part arrays are flattened by concatenating the `text` of their
//!   parts; non-text parts contribute nothing). Completions: `prompt` as a string, or the elements
//!   of a prompt array (strings, or numbers for pre-tokenised prompts) each followed by `\n`.
//! * Tokens are consecutive **4-byte chunks** of that UTF-8 text (the last one zero-padded), so a
//!   prompt of `b` bytes has `max(1, ceil(b / 4))` tokens — about what BPE tokenizers give for
//!   English text, and exactly what the load generator assumes when it sizes prompts.
//! * KV blocks are `block_tokens` consecutive tokens; only full blocks are cacheable (as in vLLM).
//!   Block `i`'s hash chains over block `i-1`'s hash, so it identifies the whole prefix up to and
//!   including block `i`. The chain is seeded with the model (LoRA adapter) name because vLLM
//!   keys its cache by adapter too.

use ailb_core::hash::{fnv1a, FNV_OFFSET};
use serde_json::Value;

/// Bytes of canonical prompt text per approximate token.
pub const BYTES_PER_TOKEN: usize = 4;

/// Which OpenAI endpoint a body was sent to (they carry the prompt differently).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiKind {
    Chat,
    Completions,
}

/// Renders the canonical prompt text of a request body, or says why the body has no prompt.
pub fn canonical_prompt(kind: ApiKind, body: &Value) -> Result<String, String> {
    match kind {
        ApiKind::Chat => {
            let msgs = body
                .get("messages")
                .and_then(Value::as_array)
                .ok_or("'messages' must be an array")?;
            let mut out = String::new();
            for m in msgs {
                let role = m.get("role").and_then(Value::as_str).unwrap_or("");
                out.push_str(role);
                out.push('\n');
                match m.get("content") {
                    Some(Value::String(s)) => out.push_str(s),
                    Some(Value::Array(parts)) => {
                        for p in parts {
                            if let Some(t) = p.get("text").and_then(Value::as_str) {
                                out.push_str(t);
                            }
                        }
                    }
                    _ => {}
                }
                out.push('\n');
            }
            Ok(out)
        }
        ApiKind::Completions => match body.get("prompt") {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(Value::Array(items)) => {
                let mut out = String::new();
                for it in items {
                    match it {
                        Value::String(s) => out.push_str(s),
                        other => out.push_str(&other.to_string()),
                    }
                    out.push('\n');
                }
                Ok(out)
            }
            _ => Err("'prompt' must be a string or an array".into()),
        },
    }
}

/// Splits text into approximate token ids (4-byte little-endian chunks, at least one token).
pub fn tokenize(text: &str) -> Vec<u32> {
    let bytes = text.as_bytes();
    if bytes.is_empty() {
        return vec![0];
    }
    bytes
        .chunks(BYTES_PER_TOKEN)
        .map(|c| {
            let mut b = [0u8; 4];
            b[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(b)
        })
        .collect()
}

/// Chained hashes of the full blocks of `tokens`; `namespace` (model/adapter) seeds the chain.
/// FNV-1a: stable across builds and platforms (std's hasher is not guaranteed to be).
pub fn block_hashes(namespace: &str, tokens: &[u32], block_tokens: usize) -> Vec<u64> {
    let mut prev = fnv1a(FNV_OFFSET, namespace.as_bytes());
    tokens
        .chunks_exact(block_tokens.max(1))
        .map(|blk| {
            let mut buf = Vec::with_capacity(8 + blk.len() * 4);
            buf.extend_from_slice(&prev.to_le_bytes());
            for t in blk {
                buf.extend_from_slice(&t.to_le_bytes());
            }
            prev = fnv1a(FNV_OFFSET, &buf);
            prev
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chat_rendering_and_count() {
        let body = json!({"messages":[
            {"role":"system","content":"abcd"},
            {"role":"user","content":[{"type":"text","text":"ef"},{"type":"image_url"},{"type":"text","text":"gh"}]}
        ]});
        let text = canonical_prompt(ApiKind::Chat, &body).unwrap();
        assert_eq!(text, "system\nabcd\nuser\nefgh\n");
        assert_eq!(tokenize(&text).len(), text.len().div_ceil(4));
        assert!(canonical_prompt(ApiKind::Chat, &json!({"prompt":"x"})).is_err());
    }

    #[test]
    fn completions_prompt_forms() {
        assert_eq!(
            canonical_prompt(ApiKind::Completions, &json!({"prompt":"hi"})).unwrap(),
            "hi"
        );
        assert_eq!(
            canonical_prompt(ApiKind::Completions, &json!({"prompt":["a", 7]})).unwrap(),
            "a\n7\n"
        );
        assert_eq!(tokenize(""), vec![0]);
    }

    #[test]
    fn block_chain_identifies_prefix() {
        let a = tokenize(&"x".repeat(64 * 3));
        let mut b = a.clone();
        b[20] ^= 1; // differs inside block 1
        let ha = block_hashes("m", &a, 16);
        let hb = block_hashes("m", &b, 16);
        assert_eq!(ha.len(), 3);
        assert_eq!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1]);
        assert_ne!(ha[2], hb[2], "later blocks depend on the whole prefix");
        assert_ne!(block_hashes("lora", &a, 16)[0], ha[0]);
    }

    #[test]
    fn block_hashes_are_pinned() {
        // Recorded before fakepod switched to ailb_core's FNV-1a: pods' cache keys must not
        // change.
        let t = tokenize("The quick brown fox jumps over the lazy dog.");
        assert_eq!(
            block_hashes("fake-model", &t, 4),
            [6992263805554249105, 8727603779955784125]
        );
    }
}
