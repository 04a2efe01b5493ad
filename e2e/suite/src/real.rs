//! What the real-engine tests of both builds share (tests/e2e/real_engine.rs and
//! envoy_real_engine.rs): the engines' own view of the load by address, short chats whose
//! usage is read, and the multi-turn chats of the verified-index tests.

use crate::conversations::Replay;
use crate::gateway::http;
use crate::llama::{usage, Engine};
use crate::streams::Held;
use ailb_testkit::wait_until;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Streamed answers long enough to outlast a test's look at them: ~3 ms a token on one
/// thread alone (measured 2.7), so at least 10 s, and within a 4096-token slot with the
/// prompt (EngineConfig::default: 8192 over 2 slots).
pub const LONG: u64 = 3_800;

/// Drops the client of `held` (a [`LONG`] answer streaming from `engine`, alone on it) and
/// checks that the engine cancelled its task: its slot freed within a second, where the answer
/// would have run 10 s more, and under half of its tokens generated.
pub fn abort_cancels(engine: &Engine, held: Held, tag: &str) {
    let left = Instant::now();
    drop(held);
    assert!(
        wait_until(Duration::from_secs(2), || engine.load() == 0.0),
        "the engine still generates"
    );
    let cancelled = left.elapsed();
    let predicted = engine
        .metric("llamacpp:tokens_predicted_total")
        .unwrap_or(f64::NAN);
    eprintln!("{tag}: cancelled in {cancelled:?}, {predicted} tokens of {LONG}");
    assert!(cancelled < Duration::from_secs(1), "{cancelled:?}");
    assert!(
        predicted < LONG as f64 / 2.0,
        "{predicted} tokens generated"
    );
}

/// Each engine's load (running + waiting requests, its own metrics), in `engines`' order.
pub fn loads(engines: &[Engine]) -> Vec<f64> {
    engines.iter().map(Engine::load).collect()
}

/// How many of `endpoints` name each engine, in `engines`' order.
pub fn tally(engines: &[Engine], endpoints: &[&str]) -> Vec<f64> {
    engines
        .iter()
        .map(|e| endpoints.iter().filter(|&&p| p == e.addr).count() as f64)
        .collect()
}

/// Conversations per engine (their first turn's endpoint), and later turns answered by
/// another engine than their conversation's first: where prefix_cache placed and kept them.
pub fn placement(r: &Replay) -> (BTreeMap<String, usize>, usize) {
    let first: BTreeMap<usize, &str> = r
        .turns
        .iter()
        .filter(|t| t.turn == 0)
        .map(|t| (t.conversation, t.endpoint.as_str()))
        .collect();
    let mut placed = BTreeMap::new();
    for e in first.values() {
        *placed.entry(e.to_string()).or_default() += 1;
    }
    let moved = r
        .turns
        .iter()
        .filter(|t| t.turn > 0 && first.get(&t.conversation) != Some(&t.endpoint.as_str()))
        .count();
    (placed, moved)
}

/// One seed of prefix_cache (`px`) against round robin (`rr`) on the same conversations:
/// every turn of both answered, every later turn of prefix_cache's on its conversation's first
/// engine. Returns (prefix_cache, round robin) later-turn cached shares for
/// [`judge_cached_shares`].
pub fn compare_seed(tag: &str, rr: &Replay, px: &Replay) -> (f64, f64) {
    let (placed, moved) = placement(px);
    let shares = (px.later_turn_cached_share(), rr.later_turn_cached_share());
    eprintln!(
        "{tag}: rr {:.3} ({} failed) px {:.3} ({} failed); placed {placed:?}, later turns moved {moved}",
        shares.1,
        rr.failed(),
        shares.0,
        px.failed(),
    );
    assert_eq!((rr.failed(), px.failed()), (0, 0));
    assert_eq!(moved, 0, "every later turn on its conversation's engine");
    shares
}

/// Judges prefix_cache against round robin on the same conversations from the engines'
/// `cached_tokens`: (prefix_cache, round robin) later-turn cached shares, one pair per seed.
/// Measured over 5 runs × 3 seeds: prefix_cache 0.854-0.866 in both builds (the rest is each
/// turn's new question and the answer before it); round robin, whichever engine still holds
/// an earlier turn, varying with how the conversations interleave: 0.21-0.52 behind the
/// emulator (2 slots an engine), 0.30-0.52 behind Envoy (8 slots), mean 0.42 there. Each
/// seed's gap was at least 0.338, the mean of 3 at least 0.396.
pub fn judge_cached_shares(shares: &[(f64, f64)]) {
    for &(px, rr) in shares {
        assert!(px >= 0.8, "prefix_cache cached only {px:.3}: {shares:?}");
        assert!(px > rr + 0.2, "prefix_cache {px:.3} vs round robin {rr:.3}");
    }
    let n = shares.len().max(1) as f64;
    let gap = shares.iter().map(|(px, rr)| px - rr).sum::<f64>() / n;
    assert!(gap > 0.3, "mean gap {gap:.3}: {shares:?}");
}

/// One answered request: status, the debug header's `endpoint=` and `reason=`, usage.
#[derive(Debug, Clone, Default)]
pub struct Answer {
    pub status: u16,
    pub endpoint: String,
    pub reason: String,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

/// POSTs chat `body` through `gateway`, reading `debug_header`.
pub fn ask(gateway: &str, debug_header: &str, body: &Value) -> Answer {
    let headers = [("content-type", "application/json")];
    let Ok((status, hs, rb)) = http(
        gateway,
        "POST",
        "/v1/chat/completions",
        &headers,
        body.to_string().as_bytes(),
    ) else {
        return Answer::default();
    };
    let debug = hs
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(debug_header))
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let field = |name: &str| {
        debug
            .split(';')
            .find_map(|f| f.trim().strip_prefix(name))
            .unwrap_or("")
            .to_string()
    };
    let (prompt_tokens, cached_tokens) = usage(&String::from_utf8_lossy(&rb)).unwrap_or((0, 0));
    Answer {
        status,
        endpoint: field("endpoint="),
        reason: field("reason="),
        prompt_tokens,
        cached_tokens,
    }
}

/// A short chat (8 tokens): what follows a fault.
pub fn short_chat(tag: &str) -> Value {
    json!({"model": "tiny", "max_tokens": 8,
        "messages": [{"role": "user", "content": format!("{tag}: a short question")}]})
}

/// Short chats through `gateway`, one every 150 ms, until `ejected()` says failure memory
/// ejected an engine (at most 60), then 10 more: what follows a fault. Spread out, as a
/// failed request's count is held on its engine (`failurePenaltyMs`, 1 s) and keeps picks off
/// it meanwhile, so failure memory only meets a dead engine again after that. Returns the
/// answers and how many came before the ejection was seen.
pub fn until_ejected(
    gateway: &str,
    debug_header: &str,
    ejected: &dyn Fn() -> bool,
) -> (Vec<Answer>, usize) {
    let mut answers = Vec::new();
    let mut before = None;
    while answers.len() < before.unwrap_or(60) + 10 {
        if before.is_none() && ejected() {
            before = Some(answers.len());
        }
        let n = answers.len();
        answers.push(ask(
            gateway,
            debug_header,
            &short_chat(&format!("after {n}")),
        ));
        std::thread::sleep(Duration::from_millis(150));
    }
    let before = before.unwrap_or(answers.len());
    (answers, before)
}

/// Conversation `c` at `turns` user turns: its own system prompt, fixed answers (what the
/// engine generated is not sent back; its cache holds the earlier prompt all the same), each
/// message a block of the plugin's index (messages under `blockChunkBytes`).
pub fn conversation(c: usize, turns: usize) -> Value {
    let mut m = vec![json!({"role": "system",
        "content": format!("You are assistant {c}. {}", "Answer briefly and precisely. ".repeat(8))})];
    for t in 0..turns {
        if t > 0 {
            m.push(json!({"role": "assistant", "content": format!("answer {c}.{t}")}));
        }
        let q = format!(
            "conversation {c} question {t}: {}",
            "tell me more about the gateway ".repeat(8)
        );
        m.push(json!({"role": "user", "content": q}));
    }
    json!({"model": "tiny", "messages": m, "max_tokens": 4})
}
