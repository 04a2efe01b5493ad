//! Deterministic approximate tokenizer and prefix-block hashing.
//!
//! Real tokenizers are model specific and heavy; routing quality only needs a token count that
//! scales with prompt length and token identities that make equal prefixes hash equally. So:
//!
//! * The request is rendered to a **canonical prompt text**. Chat: every message becomes
//!   `role\ncontent\n` (content-part arrays are flattened by concatenating the `text` of their
//!   parts; non-text parts contribute nothing). Completions: `prompt` as a string, or the elements
//!   of a prompt array (strings, or numbers for pre-tokenised prompts) each followed by `\n`.
//!   Responses (`instructions`, `input`) and Anthropic Messages (`system`, `messages`) render
//!   like Chat, the instructions / system prompt as a `system` turn first.
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
    /// OpenAI Responses API (`POST /v1/responses`).
    Responses,
    /// Anthropic Messages API (`POST /v1/messages`).
    Messages,
}

impl ApiKind {
    /// The API served at `path` (after any route prefix), if any.
    pub fn of_path(path: &str) -> Option<ApiKind> {
        match path {
            "/v1/chat/completions" => Some(ApiKind::Chat),
            "/v1/completions" => Some(ApiKind::Completions),
            "/v1/responses" => Some(ApiKind::Responses),
            "/v1/messages" => Some(ApiKind::Messages),
            _ => None,
        }
    }
}

/// Appends one `role\ncontent\n` turn; `content` is a string or an array of parts whose
/// `text` fields are concatenated (images, tool calls and other parts contribute nothing).
fn push_turn(out: &mut String, role: &str, content: Option<&Value>) {
    out.push_str(role);
    out.push('\n');
    match content {
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

/// Chat-style turns of `messages` (Chat and Anthropic Messages share the shape).
fn push_messages(out: &mut String, body: &Value) -> Result<(), String> {
    let msgs = body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or("'messages' must be an array")?;
    for m in msgs {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        push_turn(out, role, m.get("content"));
    }
    Ok(())
}

/// Renders the canonical prompt text of a request body, or says why the body has no prompt.
pub fn canonical_prompt(kind: ApiKind, body: &Value) -> Result<String, String> {
    let mut out = String::new();
    match kind {
        ApiKind::Chat => push_messages(&mut out, body)?,
        ApiKind::Completions => match body.get("prompt") {
            Some(Value::String(s)) => out.push_str(s),
            Some(Value::Array(items)) => {
                for it in items {
                    match it {
                        Value::String(s) => out.push_str(s),
                        other => out.push_str(&other.to_string()),
                    }
                    out.push('\n');
                }
            }
            _ => return Err("'prompt' must be a string or an array".into()),
        },
        ApiKind::Responses => {
            if let Some(i) = body.get("instructions").filter(|v| v.is_string()) {
                push_turn(&mut out, "system", Some(i));
            }
            match body.get("input") {
                Some(s @ Value::String(_)) => push_turn(&mut out, "user", Some(s)),
                Some(Value::Array(items)) => {
                    for it in items {
                        let role = it.get("role").and_then(Value::as_str).unwrap_or("user");
                        // A function call's output carries its text in `output`.
                        let content = it.get("content").or_else(|| it.get("output"));
                        push_turn(&mut out, role, content);
                    }
                }
                _ => return Err("'input' must be a string or an array".into()),
            }
        }
        ApiKind::Messages => {
            if let Some(system) = body.get("system") {
                push_turn(&mut out, "system", Some(system));
            }
            push_messages(&mut out, body)?;
        }
    }
    Ok(out)
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
    fn responses_and_messages_render_like_chat() {
        let chat = json!({"messages":[
            {"role":"system","content":"be brief"},
            {"role":"user","content":"hi"}
        ]});
        let chat = canonical_prompt(ApiKind::Chat, &chat).unwrap();
        let responses = json!({"instructions":"be brief",
            "input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}]});
        assert_eq!(
            canonical_prompt(ApiKind::Responses, &responses).unwrap(),
            chat
        );
        let short = json!({"instructions":"be brief","input":"hi"});
        assert_eq!(canonical_prompt(ApiKind::Responses, &short).unwrap(), chat);
        let messages = json!({"system":[{"type":"text","text":"be brief"}],
            "messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]});
        assert_eq!(
            canonical_prompt(ApiKind::Messages, &messages).unwrap(),
            chat
        );
        assert!(canonical_prompt(ApiKind::Responses, &json!({"input": 3})).is_err());
        assert!(canonical_prompt(ApiKind::Messages, &json!({"system": "x"})).is_err());
        assert_eq!(ApiKind::of_path("/v1/messages"), Some(ApiKind::Messages));
        assert_eq!(ApiKind::of_path("/v1/embeddings"), None);
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
