//! Mooncake-format traces (FAST'25 release: `timestamp` ms, `input_length`, `output_length`,
//! `hash_ids` = 512-token prefix blocks; e2e/data/traces/README.md) as replay workloads.

use super::text::{ns, Seg, Text};
use super::workload::{Conversation, Turn, Workload};
use anyhow::{bail, Context};
use serde::Deserialize;
use std::path::Path;
use std::time::Duration;

/// Tokens per `hash_ids` block in Mooncake's traces.
pub const TRACE_BLOCK_TOKENS: u64 = 512;

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Row {
    pub timestamp: u64,
    pub input_length: u64,
    pub output_length: u64,
    pub hash_ids: Vec<u64>,
}

/// Reads a JSONL trace (blank lines skipped); rows must be in time order.
pub fn read(path: &Path) -> anyhow::Result<Vec<Row>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let mut rows: Vec<Row> = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let row: Row =
            serde_json::from_str(line).with_context(|| format!("{}:{}", path.display(), i + 1))?;
        if rows.last().is_some_and(|p| p.timestamp > row.timestamp) {
            bail!("{}:{}: timestamps go back", path.display(), i + 1);
        }
        rows.push(row);
    }
    Ok(rows)
}

/// The prompt of a row, with every token count multiplied by `token_scale`: each id a block of
/// `512 × token_scale` tokens, the last one sized by `input_length` (at least 1 token).
pub fn prompt(row: &Row, token_scale: f64) -> Text {
    let bt = scaled(TRACE_BLOCK_TOKENS, token_scale);
    let total = scaled(row.input_length, token_scale);
    let n = row.hash_ids.len() as u64;
    Text(
        row.hash_ids
            .iter()
            .enumerate()
            .map(|(i, &id)| Seg {
                ns: ns::TRACE,
                id,
                tokens: if (i as u64) + 1 < n {
                    bt
                } else {
                    total.saturating_sub(bt * (n - 1)).clamp(1, bt)
                },
            })
            .collect(),
    )
}

/// `tokens × scale`, at least 1.
pub fn scaled(tokens: u64, scale: f64) -> u64 {
    ((tokens as f64 * scale).round() as u64).max(1)
}

/// One single-turn conversation per row at its timestamp; `preamble_tokens` > 0 adds one
/// system prompt of that many (unscaled) tokens common to every request.
pub fn workload(name: &str, rows: &[Row], token_scale: f64, preamble_tokens: u64) -> Workload {
    let system = (preamble_tokens > 0).then(|| {
        Text::blocks(
            ns::PREAMBLE,
            0,
            scaled(preamble_tokens, token_scale),
            scaled(TRACE_BLOCK_TOKENS, token_scale),
        )
    });
    Workload {
        name: name.into(),
        conversations: rows
            .iter()
            .map(|r| Conversation {
                start: Duration::from_millis(r.timestamp),
                system: system.clone(),
                turns: vec![Turn {
                    user: prompt(r, token_scale),
                    output_tokens: scaled(r.output_length, token_scale),
                    at: None,
                }],
                stage: 0,
            })
            .collect(),
        stages: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_become_block_prompts_at_scale() {
        let row: Row = serde_json::from_str(
            r#"{"timestamp": 5, "input_length": 1300, "output_length": 7, "hash_ids": [4, 9, 2]}"#,
        )
        .unwrap();
        let p = prompt(&row, 1.0);
        assert_eq!(p.tokens(), 1300);
        assert_eq!(
            p.0[2],
            Seg {
                ns: ns::TRACE,
                id: 2,
                tokens: 276
            }
        );
        let q = prompt(&row, 0.25);
        assert_eq!((q.0[0].tokens, q.tokens()), (128, 325));
        let w = workload("t", &[row], 0.25, 2000);
        assert_eq!(w.conversations[0].system.as_ref().unwrap().tokens(), 500);
        assert_eq!(w.conversations[0].turns[0].output_tokens, 2);
    }
}
