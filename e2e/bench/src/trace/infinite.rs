//! O1, one infinite cache: the share of prompt tokens that some earlier request already had in
//! front, computed from the workload itself (no pods). It is counted in the pods' own blocks
//! (vLLM's 16 tokens, scaled) over the exact prompts the replay sends, so it is the ceiling of
//! the hit rates the pods report; the trace's own measure (512-token `hash_ids`) is logged
//! beside it.

use super::mooncake::{Row, TRACE_BLOCK_TOKENS};
use super::workload::{Dialogue, Workload, MODEL};
use ailb_fakepod::openai::{after_answer, answer_text};
use ailb_fakepod::tokenize::{block_hashes, tokenize, ApiKind};
use std::collections::HashSet;

/// Per request, in the replay's order (conversation by conversation, turn by turn): its prompt
/// tokens and the tokens an unbounded cache that saw every earlier request (by arrival) would
/// hold of it, in the pods' blocks of `block_tokens`. With one pod large enough never to evict,
/// that is what the pod reports.
pub fn infinite_cached(w: &Workload, block_tokens: usize) -> Vec<(u64, u64)> {
    let mut first = Vec::with_capacity(w.conversations.len());
    let mut n = 0;
    for c in &w.conversations {
        first.push(n);
        n += c.turns.len();
    }
    let mut out = vec![(0, 0); n];
    let mut seen = HashSet::new();
    let mut order: Vec<usize> = (0..w.conversations.len()).collect();
    order.sort_by_key(|&c| w.conversations[c].start);
    for c in order {
        let mut d = Dialogue::new(&w.conversations[c]);
        let mut t = 0;
        while let Some(b) = d.next_request() {
            let tokens = tokenize(&b.canonical);
            let hashes = block_hashes(MODEL, &tokens, block_tokens);
            let lead = hashes.iter().take_while(|h| seen.contains(*h)).count() as u64;
            let prompt = tokens.len() as u64;
            out[first[c] + t] = (prompt, (lead * block_tokens as u64).min(prompt));
            // What a pod keeps after answering: the prompt and its answer.
            let answered = after_answer(
                ApiKind::Chat,
                &b.canonical,
                &answer_text(&b.canonical, b.output_tokens),
            );
            seen.extend(block_hashes(MODEL, &tokenize(&answered), block_tokens));
            t += 1;
        }
    }
    out
}

/// O1: cached over prompt tokens with an unbounded cache ([`infinite_cached`]).
pub fn infinite_hit(w: &Workload, block_tokens: usize) -> f64 {
    let (p, c) = infinite_cached(w, block_tokens)
        .into_iter()
        .fold((0u64, 0u64), |(p, c), (a, b)| (p + a, c + b));
    c as f64 / p.max(1) as f64
}

/// The trace's reusable share in its own terms: leading `hash_ids` seen before (as a prefix
/// chain), 512 tokens each, over input tokens.
pub fn trace_reusable_share(rows: &[Row]) -> f64 {
    let mut seen = HashSet::new();
    let (mut hit, mut total) = (0u64, 0u64);
    for r in rows {
        let mut chain = Vec::with_capacity(r.hash_ids.len());
        let mut h = 0u64;
        for id in &r.hash_ids {
            h = ailb_core::hash::fnv1a(h, &id.to_le_bytes());
            chain.push(h);
        }
        let lead = chain.iter().take_while(|c| seen.contains(*c)).count() as u64;
        hit += (lead * TRACE_BLOCK_TOKENS).min(r.input_length);
        total += r.input_length;
        seen.extend(chain);
    }
    hit as f64 / total.max(1) as f64
}
