//! The block a conversation is known by: the first block after the shared preamble (tools list,
//! system / developer prompt), i.e. the first user message, prompt or other item. Every turn of
//! a conversation carries the same blocks up to and including it, so its chain key names the
//! conversation from its first request on, while the preamble alone is shared by many
//! (docs/redis-data-model.md §9).

use super::block::{KIND_CONTINUATION, KIND_MESSAGE, KIND_TOOLS};

/// Roles whose messages belong to the shared preamble.
const PREAMBLE_ROLES: &[&[u8]] = &[b"system", b"developer"];

/// Position of the anchor block among `blocks`: the first block that is neither a tools block,
/// a system / developer message, nor a continuation piece of one. When every block is preamble
/// (a request with no user content), the last one; 0 for no blocks.
pub fn anchor<'a>(blocks: impl IntoIterator<Item = &'a [u8]>) -> usize {
    let mut last = 0;
    let mut in_preamble = false;
    for (i, block) in blocks.into_iter().enumerate() {
        last = i;
        let preamble = match block.first() {
            Some(&KIND_TOOLS) => true,
            Some(&KIND_MESSAGE) => is_preamble_message(block),
            Some(&KIND_CONTINUATION) => in_preamble,
            _ => false,
        };
        if !preamble {
            return i;
        }
        in_preamble = true;
    }
    last
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

    fn anchor_of(body: serde_json::Value, chunk_bytes: usize) -> (usize, usize) {
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
        assert_eq!(anchor_of(chat, 4096), (3, 6));
        // No preamble: the first message.
        let plain = json!({"messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(anchor_of(plain, 4096), (0, 1));
        // A role that merely starts like a preamble role is not one.
        let odd = json!({"messages": [{"role": "systemic", "content": "x"}]});
        assert_eq!(anchor_of(odd, 4096).0, 0);
        // Completions prompt, Anthropic top-level system, Responses instructions.
        assert_eq!(anchor_of(json!({"prompt": "once upon"}), 4096), (0, 1));
        let anthropic = json!({"system": "s", "messages": [{"role": "user", "content": "q"}]});
        assert_eq!(anchor_of(anthropic, 4096), (1, 2));
        let responses = json!({"instructions": "s", "input": "q"});
        assert_eq!(anchor_of(responses, 4096), (1, 2));
    }

    #[test]
    fn a_long_system_prompt_cut_into_pieces_is_all_preamble() {
        let long = "x".repeat(300);
        let chat = json!({"messages": [
            {"role": "system", "content": long},
            {"role": "user", "content": "y".repeat(300)},
        ]});
        // 64-byte pieces: the system prompt takes 5 blocks, the user message starts at 5.
        let (at, len) = anchor_of(chat, 64);
        assert_eq!(at, 5);
        assert!(len > 6, "the user message has continuation pieces too");
    }

    #[test]
    fn a_request_of_preamble_only_is_known_by_its_last_block() {
        let chat = json!({"messages": [{"role": "system", "content": "s"}]});
        assert_eq!(anchor_of(chat, 4096), (0, 1));
        let two =
            json!({"tools": [{"name": "t"}], "messages": [{"role": "system", "content": "s"}]});
        assert_eq!(anchor_of(two, 4096), (1, 2));
        assert_eq!(anchor(std::iter::empty()), 0);
    }
}
