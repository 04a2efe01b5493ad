//! The block a conversation is known by: the first block after the shared preamble (tools list,
//! system / developer prompt), i.e. the first user message, prompt or other item. Every turn of
//! a conversation carries the same blocks up to and including it, so its chain key names the
//! conversation from its first request on, while the preamble alone is shared by many
//! (docs/redis-data-model.md §9).

use super::block::{KIND_CONTINUATION, KIND_MESSAGE, KIND_TOOLS};

/// Roles whose messages belong to the shared preamble.
const PREAMBLE_ROLES: &[&[u8]] = &[b"system", b"developer"];

/// Which block a plain-Envoy prefix_cache route knows a request by (`prefixAnchor`,
/// docs/redis-data-model.md §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Anchor {
    /// The first block after the preamble: each conversation hashes on its own, so the
    /// conversations sharing a system prompt spread over the pods.
    #[default]
    Conversation,
    /// The last block of the preamble: every conversation sharing a system prompt (and tools)
    /// hashes to the same pod, within the bounded load. A request with no preamble is known by
    /// its first block, as with `Conversation`.
    Preamble,
}

impl Anchor {
    pub const NAMES: &'static [&'static str] = &["conversation", "preamble"];

    pub fn from_name(name: &str) -> Option<Anchor> {
        match name {
            "conversation" => Some(Anchor::Conversation),
            "preamble" => Some(Anchor::Preamble),
            _ => None,
        }
    }
}

/// Position of the conversation anchor among `blocks`: the first block that is neither a tools
/// block, a system / developer message, nor a continuation piece of one. When every block is
/// preamble (a request with no user content), the last one; 0 for no blocks.
pub fn anchor<'a>(blocks: impl IntoIterator<Item = &'a [u8]>) -> usize {
    anchor_of(blocks, Anchor::Conversation)
}

/// Position of the `which` anchor among `blocks` (0 for no blocks).
pub fn anchor_of<'a>(blocks: impl IntoIterator<Item = &'a [u8]>, which: Anchor) -> usize {
    let (preamble, len) = preamble_len(blocks);
    match which {
        Anchor::Conversation if preamble < len => preamble,
        Anchor::Conversation | Anchor::Preamble => preamble.max(1).min(len.max(1)) - 1,
    }
}

/// (blocks of the leading preamble, all blocks).
fn preamble_len<'a>(blocks: impl IntoIterator<Item = &'a [u8]>) -> (usize, usize) {
    let mut len = 0;
    let mut preamble = None;
    for (i, block) in blocks.into_iter().enumerate() {
        len = i + 1;
        if preamble.is_some() {
            continue;
        }
        let is_preamble = match block.first() {
            Some(&KIND_TOOLS) => true,
            Some(&KIND_MESSAGE) => is_preamble_message(block),
            Some(&KIND_CONTINUATION) => i > 0,
            _ => false,
        };
        if !is_preamble {
            preamble = Some(i);
        }
    }
    (preamble.unwrap_or(len), len)
}

/// A message block starts `M r <role> 00 00` (prefix/canon.rs "Block encoding"); role names
/// contain no 0x00, so the role field is read as is.
fn is_preamble_message(block: &[u8]) -> bool {
    let Some(rest) = block.get(1..).and_then(|b| b.strip_prefix(b"r")) else {
        return false;
    };
    PREAMBLE_ROLES.iter().any(|role| {
        rest.strip_prefix(*role)
            .is_some_and(|tail| tail.starts_with(&[0, 0]))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prefix::{canonicalize, CanonConfig};
    use serde_json::json;

    fn positions(body: serde_json::Value, chunk_bytes: usize) -> (usize, usize) {
        let cfg = CanonConfig {
            chunk_bytes,
            ..CanonConfig::default()
        };
        let c = canonicalize(body.to_string().as_bytes(), &cfg).unwrap();
        (anchor(c.blocks()), c.len())
    }

    #[test]
    fn the_anchor_is_the_first_message_after_the_preamble() {
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        let chat = json!({"model": "m", "tools": tools, "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "developer", "content": "no emoji"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "more"},
        ]});
        assert_eq!(positions(chat, 4096), (3, 6));
        // No preamble: the first message.
        let plain = json!({"messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(positions(plain, 4096), (0, 1));
        // A role that merely starts like a preamble role is not one.
        let odd = json!({"messages": [{"role": "systemic", "content": "x"}]});
        assert_eq!(positions(odd, 4096).0, 0);
        // Completions prompt, Anthropic top-level system, Responses instructions.
        assert_eq!(positions(json!({"prompt": "once upon"}), 4096), (0, 1));
        let anthropic = json!({"system": "s", "messages": [{"role": "user", "content": "q"}]});
        assert_eq!(positions(anthropic, 4096), (1, 2));
        let responses = json!({"instructions": "s", "input": "q"});
        assert_eq!(positions(responses, 4096), (1, 2));
    }

    #[test]
    fn a_long_system_prompt_cut_into_pieces_is_all_preamble() {
        let long = "x".repeat(300);
        let chat = json!({"messages": [
            {"role": "system", "content": long},
            {"role": "user", "content": "y".repeat(300)},
        ]});
        // 64-byte pieces: the system prompt takes 5 blocks, the user message starts at 5.
        let (at, len) = positions(chat, 64);
        assert_eq!(at, 5);
        assert!(len > 6, "the user message has continuation pieces too");
    }

    #[test]
    fn a_request_of_preamble_only_is_known_by_its_last_block() {
        let chat = json!({"messages": [{"role": "system", "content": "s"}]});
        assert_eq!(positions(chat, 4096), (0, 1));
        let two =
            json!({"tools": [{"name": "t"}], "messages": [{"role": "system", "content": "s"}]});
        assert_eq!(positions(two, 4096), (1, 2));
        assert_eq!(anchor(std::iter::empty()), 0);
    }

    #[test]
    fn the_preamble_anchor_is_the_last_preamble_block() {
        let cfg = CanonConfig {
            chunk_bytes: 64,
            ..CanonConfig::default()
        };
        let at = |body: serde_json::Value| {
            let c = canonicalize(body.to_string().as_bytes(), &cfg).unwrap();
            (
                anchor_of(c.blocks(), Anchor::Preamble),
                anchor_of(c.blocks(), Anchor::Conversation),
            )
        };
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        // Tools, a system prompt cut into 5 pieces, then two users: the preamble ends at 5.
        let long = "x".repeat(300);
        let with = |user: &str| {
            json!({"model": "m", "tools": tools, "messages": [
                {"role": "system", "content": long},
                {"role": "user", "content": user},
            ]})
        };
        assert_eq!(at(with("a")), (5, 6));
        assert_eq!(at(with("b")), (5, 6));
        // The preamble's chain key is the same for both users; the conversation's is not.
        let key = |body: serde_json::Value, which| {
            let c = canonicalize(body.to_string().as_bytes(), &cfg).unwrap();
            c.chain_keys()[anchor_of(c.blocks(), which)]
        };
        assert_eq!(
            key(with("a"), Anchor::Preamble),
            key(with("b"), Anchor::Preamble)
        );
        assert_ne!(
            key(with("a"), Anchor::Conversation),
            key(with("b"), Anchor::Conversation)
        );
        // No preamble: the first block, as the conversation anchor.
        assert_eq!(
            at(json!({"messages": [{"role": "user", "content": "hi"}]})),
            (0, 0)
        );
        // Preamble only: its last block either way.
        let only = json!({"tools": tools, "messages": [{"role": "system", "content": "s"}]});
        assert_eq!(at(only), (1, 1));
        assert_eq!(anchor_of(std::iter::empty(), Anchor::Preamble), 0);
        assert_eq!(Anchor::from_name("preamble"), Some(Anchor::Preamble));
        assert_eq!(Anchor::from_name("Preamble"), None);
    }
}
