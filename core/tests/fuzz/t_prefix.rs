//! Body canonicalisation (`prefix::canonicalize`): request bodies from `tests/fixtures/prefix`
//! and hand-written shapes, mutated as bytes and as JSON trees.
//!
//! Properties: never panics; deterministic; at most `max_blocks` blocks, each a known kind byte
//! and at most `chunk_bytes + 1` long, `capped` only when full; a body over `max_body_bytes` is
//! refused as too large; one chain key per block. For a body that is valid JSON: the result does
//! not depend on key order or whitespace, and dropping a chat's last messages leaves a prefix of
//! its blocks and keys (what prefix caching relies on).

use crate::gen::{drive, mutate_bytes, mutate_value, to_reordered_json, Rng};
use ailb_core::prefix::{
    canonicalize, CanonConfig, CanonError, Canonical, KIND_CONTINUATION, KIND_MESSAGE, KIND_PROMPT,
    KIND_TOOLS,
};
use serde_json::Value;

fn seeds() -> Vec<Vec<u8>> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/prefix");
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    for s in [
        r#"{"model":"m","prompt":"Once upon a time"}"#,
        r#"{"model":"m","prompt":[[1,2,3],[4294967295,0]]}"#,
        r#"{"model":"m","prompt":["a","b"]}"#,
        r#"{"model":"m","input":"hi","instructions":"be brief"}"#,
        r#"{"model":"m","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"x"}]},{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"b\":1,\"a\":2}"},{"type":"function_call_output","call_id":"c1","output":"ok"}]}"#,
        r#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"hi\u0000there"},{"role":"assistant","content":null,"tool_calls":[{"id":"x","type":"function","function":{"name":"f","arguments":"{\"q\": [1, 2]}"}}]},{"role":"tool","tool_call_id":"x","content":"r"}]}"#,
        r#"{"model":"claude","system":[{"type":"text","text":"sys","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"text","text":"q"}]},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","is_error":true,"content":[{"type":"text","text":"boom"}]}]}]}"#,
    ] {
        out.push(s.as_bytes().to_vec());
    }
    out.sort();
    out
}

const DICT: &[&[u8]] = &[
    b"\"messages\"",
    b"\"role\"",
    b"\"content\"",
    b"\"user\"",
    b"\"assistant\"",
    b"\"tool\"",
    b"\"tool_calls\"",
    b"\"function\"",
    b"\"arguments\"",
    b"\"type\"",
    b"\"text\"",
    b"\"image_url\"",
    b"\"input\"",
    b"\"instructions\"",
    b"\"prompt\"",
    b"\"system\"",
    b"\"tools\"",
    b"\"tool_use\"",
    b"\"tool_result\"",
    b"\"tool_use_id\"",
    b"\"model\"",
    b"null",
    b"[]",
    b"{}",
    b"\\u0000",
    b"\\ud800",
    b"\\\"",
];

const KEYS: &[&str] = &[
    "messages",
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "function",
    "arguments",
    "type",
    "text",
    "input",
    "instructions",
    "prompt",
    "system",
    "tools",
    "id",
    "call_id",
    "output",
    "tool_use_id",
    "is_error",
    "cache_control",
    "model",
    "image_url",
    "source",
];

const STRINGS: &[&str] = &[
    "user",
    "assistant",
    "system",
    "tool",
    "developer",
    "function",
    "text",
    "input_text",
    "tool_use",
    "tool_result",
    "thinking",
    "image",
    "message",
    "function_call",
    "function_call_output",
    "{\"a\":1}",
    "not json",
];

const CONFIGS: [CanonConfig; 3] = [
    CanonConfig {
        chunk_bytes: 4096,
        max_blocks: 256,
        max_body_bytes: 8 * 1024 * 1024,
    },
    CanonConfig {
        chunk_bytes: 7,
        max_blocks: 5,
        max_body_bytes: 0,
    },
    CanonConfig {
        chunk_bytes: 0,
        max_blocks: 1,
        max_body_bytes: 200,
    },
];

fn generate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let seed = rng.pick(seeds);
    match rng.below(3) {
        0 => mutate_bytes(rng, seed, seeds, DICT, 1 << 20),
        _ => {
            let mut v: Value = serde_json::from_slice(seed).unwrap();
            mutate_value(rng, &mut v, KEYS, STRINGS);
            let text = if rng.chance(1, 2) {
                v.to_string()
            } else {
                let mut s = String::new();
                to_reordered_json(&v, &mut s);
                s
            };
            text.into_bytes()
        }
    }
}

fn blocks(c: &Canonical) -> Vec<Vec<u8>> {
    c.blocks().map(<[u8]>::to_vec).collect()
}

/// Same outcome: equal canonical forms, or the same kind of error.
fn same(a: &Result<Canonical, CanonError>, b: &Result<Canonical, CanonError>) -> bool {
    match (a, b) {
        (Ok(x), Ok(y)) => x == y,
        (Err(x), Err(y)) => std::mem::discriminant(x) == std::mem::discriminant(y),
        _ => false,
    }
}

fn check(body: &[u8]) {
    let value: Option<Value> = serde_json::from_slice(body).ok();
    for cfg in &CONFIGS {
        let out = canonicalize(body, cfg);
        assert_eq!(out, canonicalize(body, cfg), "not deterministic");
        if cfg.max_body_bytes != 0 && body.len() > cfg.max_body_bytes {
            assert!(matches!(out, Err(CanonError::TooLarge { .. })), "{out:?}");
            continue;
        }
        if let Err(e) = &out {
            // Errors are short, whatever the body (they are logged).
            assert!(e.to_string().len() < 1024, "{e}");
        }
        let Ok(c) = &out else { continue };
        assert!(c.len() <= cfg.max_blocks);
        assert!(!c.capped || c.len() == cfg.max_blocks);
        for b in c.blocks() {
            assert!(
                [KIND_TOOLS, KIND_MESSAGE, KIND_PROMPT, KIND_CONTINUATION].contains(&b[0]),
                "{b:?}"
            );
            assert!(cfg.chunk_bytes == 0 || b.len() <= cfg.chunk_bytes + 1);
        }
        assert_eq!(c.chain_keys().len(), c.len());
        let Some(v) = &value else { continue };
        // Re-serialised bodies differ in length: the size limit is not what is compared.
        let cfg = &CanonConfig {
            max_body_bytes: 0,
            ..cfg.clone()
        };
        // Key order and whitespace do not matter.
        let mut reordered = String::new();
        to_reordered_json(v, &mut reordered);
        let again = canonicalize(reordered.as_bytes(), cfg);
        let compact = canonicalize(v.to_string().as_bytes(), cfg);
        assert!(same(&again, &compact), "{again:?} vs {compact:?}");
        // Dropping a chat's last messages keeps a prefix of the blocks and chain keys.
        let Ok(full) = &compact else { continue };
        let n = v["messages"].as_array().map_or(0, Vec::len);
        if n < 2 || full.capped {
            continue;
        }
        for keep in [1, n - 1] {
            let mut shorter = v.clone();
            shorter["messages"].as_array_mut().unwrap().truncate(keep);
            let short = canonicalize(shorter.to_string().as_bytes(), cfg)
                .unwrap_or_else(|e| panic!("{keep} of {n} messages: {e}"));
            let (sb, fb) = (blocks(&short), blocks(full));
            assert!(sb.len() <= fb.len() && fb[..sb.len()] == sb[..], "blocks");
            let (sk, fk) = (short.chain_keys(), full.chain_keys());
            assert!(fk.starts_with(&sk), "chain keys");
        }
    }
}

#[test]
fn fuzz_prefix_canonicalize() {
    let seeds = seeds();
    for s in &seeds {
        check(s);
    }
    drive("prefix", 200, |rng| generate(rng, &seeds), check);
}
