//! Token estimates of a canonical prompt, what prefix_cache's token gate weighs
//! (docs/redis-data-model.md §13): bytes / [`BYTES_PER_TOKEN`], there being no tokenizer here.

use super::canon::Canonical;

/// Bytes of request text per prompt token, the plugin's one estimate where it needs tokens and
/// has no tokenizer (`costMode: tokens`, `blockTokens`, the token gate): about 4 for English
/// text with the BPE vocabularies of current models.
pub const BYTES_PER_TOKEN: u64 = 4;

/// A prompt's estimated tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptTokens {
    /// The prompt's tokens up to the end of each block (the chain's positions).
    pub ends: Vec<u64>,
    /// The whole prompt's: the blocks', or the body's when `maxBlocks` cut the blocks short.
    pub total: u64,
    /// `"stream": true`: the first response bytes time the prefill.
    pub stream: bool,
}

impl PromptTokens {
    pub fn of(canon: &Canonical, body_bytes: usize) -> PromptTokens {
        let bytes = canon.prefix_bytes();
        let end = bytes.last().copied().unwrap_or(0);
        let whole = if canon.capped {
            (body_bytes as u64).max(end)
        } else {
            end
        };
        PromptTokens {
            ends: bytes.iter().skip(1).map(|b| b / BYTES_PER_TOKEN).collect(),
            total: whole / BYTES_PER_TOKEN,
            stream: canon.stream,
        }
    }

    /// The tokens a match through chain position `depth` holds.
    pub fn through(&self, depth: usize) -> u64 {
        self.ends.get(depth).copied().unwrap_or(self.total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prefix::{canonicalize, CanonConfig};

    #[test]
    fn tokens_end_with_each_block_and_a_cut_prompt_counts_its_body() {
        let body = serde_json::json!({"model": "m", "stream": true, "messages": [
            {"role": "system", "content": "s".repeat(400)},
            {"role": "user", "content": "u".repeat(800)}]})
        .to_string();
        let canon = canonicalize(body.as_bytes(), &CanonConfig::default()).unwrap();
        let t = PromptTokens::of(&canon, body.len());
        assert_eq!(t.ends.len(), 2);
        assert!(t.ends[0] >= 100 && t.ends[1] >= t.ends[0] + 200, "{t:?}");
        assert_eq!(t.total, t.ends[1]);
        assert!(t.stream);
        assert_eq!(t.through(0), t.ends[0]);
        let cut = CanonConfig {
            max_blocks: 1,
            ..CanonConfig::default()
        };
        let canon = canonicalize(body.as_bytes(), &cut).unwrap();
        let t = PromptTokens::of(&canon, body.len());
        assert!(canon.capped);
        assert_eq!(t.total, body.len() as u64 / BYTES_PER_TOKEN);
    }
}
