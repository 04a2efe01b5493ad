//! Prompt text made of prefix blocks. A trace gives each prompt as a list of block ids (Mooncake's
//! `hash_ids`: 512-token blocks, equal ids = equal content); the replay turns every id into a
//! fixed text of that many tokens as the fake pods count them (4 bytes a token,
//! `ailb_fakepod::tokenize`), so prompts that share leading ids share a byte-identical prefix and
//! nothing else. A partial block is a prefix of its full text.

use ailb_fakepod::rng::Rng;
use ailb_fakepod::tokenize::BYTES_PER_TOKEN;

/// Id namespaces: blocks of different sources never share text.
pub mod ns {
    /// Mooncake-format traces (`hash_ids`).
    pub const TRACE: u64 = 1;
    /// The preamble variant's common system prompt.
    pub const PREAMBLE: u64 = 2;
    /// b2b-saas: the groups' shared prefixes and the users' questions.
    pub const B2B: u64 = 3;
    /// Code generation: system prompts, turn inputs.
    pub const CODEGEN: u64 = 4;
    /// llm-d's predicted-latency ladder: the groups' system prompts, the users' questions.
    pub const LATENCY_LADDER: u64 = 5;
}

/// One block of a prompt: `tokens` tokens of block `id`'s text (a prefix of it when partial).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seg {
    pub ns: u64,
    pub id: u64,
    pub tokens: u64,
}

/// A prompt text as blocks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Text(pub Vec<Seg>);

// Lowercase words and a space: plain ASCII, so JSON carries the text unescaped and its bytes
// are its length.
const WORDS: [&str; 24] = [
    "cache", "block", "token", "model", "route", "query", "pod", "gpu", "the", "of", "and",
    "prefix", "serve", "batch", "queue", "trace", "kv", "time", "first", "load", "table", "index",
    "shard", "input",
];

impl Text {
    /// `tokens` tokens as blocks of `block_tokens` with ids `first_id`, `first_id + 1`, ...;
    /// the last block partial when `tokens` is not a multiple.
    pub fn blocks(ns: u64, first_id: u64, tokens: u64, block_tokens: u64) -> Text {
        let bt = block_tokens.max(1);
        Text(
            (0..tokens.div_ceil(bt))
                .map(|i| Seg {
                    ns,
                    id: first_id + i,
                    tokens: bt.min(tokens - i * bt),
                })
                .collect(),
        )
    }

    /// This text followed by `other`.
    pub fn then(mut self, other: &Text) -> Text {
        self.0.extend_from_slice(&other.0);
        self
    }

    pub fn tokens(&self) -> u64 {
        self.0.iter().map(|s| s.tokens).sum()
    }

    /// The text itself.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(self.tokens() as usize * BYTES_PER_TOKEN);
        for s in &self.0 {
            push_block(&mut out, s);
        }
        out
    }
}

/// Appends block `s`'s text: words drawn from a generator seeded by (namespace, id), cut at
/// exactly `tokens × 4` bytes. The same block always gives the same bytes, and a shorter cut is
/// a prefix of a longer one.
pub fn push_block(out: &mut String, s: &Seg) {
    let want = s.tokens as usize * BYTES_PER_TOKEN;
    let start = out.len();
    let mut rng = Rng::derive(s.ns, &[s.id]);
    while out.len() - start < want {
        out.push_str(WORDS[rng.below(WORDS.len() as u64) as usize]);
        out.push(' ');
    }
    out.truncate(start + want);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_ids_give_equal_prefixes_and_exact_sizes() {
        let a = Text::blocks(ns::TRACE, 10, 1200, 512);
        assert_eq!(a.0.len(), 3);
        assert_eq!(a.0[2].tokens, 176);
        let ra = a.render();
        assert_eq!(ra.len(), 1200 * 4);
        let b = Text(vec![
            a.0[0],
            a.0[1],
            Seg {
                ns: ns::TRACE,
                id: 99,
                tokens: 512,
            },
        ]);
        let rb = b.render();
        assert_eq!(ra[..1024 * 4], rb[..1024 * 4]);
        assert_ne!(ra[1024 * 4..1100 * 4], rb[1024 * 4..1100 * 4]);
        // A partial block is a prefix of the full one.
        let full = Text(vec![Seg {
            ns: ns::TRACE,
            id: 12,
            tokens: 512,
        }])
        .render();
        assert!(full.starts_with(&ra[1024 * 4..]));
        assert!(ra.is_ascii());
    }
}
