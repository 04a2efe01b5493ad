//! What a router with full knowledge of a pod sees: how much of a prompt its prefix cache holds
//! right now and how much work is ahead of a request arriving now. The trace bench's
//! capacity-bounded oracle reads it in-process for every pod ([`probe`]); `POST /admin/probe`
//! (a generation body) serves the same answer over HTTP.

use crate::engine::{Engine, Job};
use crate::tokenize::{block_hashes, canonical_prompt, tokenize, ApiKind};
use serde::Serialize;
use std::time::Duration;

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Probe {
    pub prompt_tokens: u64,
    /// Leading prompt tokens the pod's cache holds now (what `cached_tokens` would say if the
    /// request were admitted at once).
    pub cached_tokens: u64,
    /// Time the prefill lane needs for the work already granted or queued (zero without a
    /// lane).
    #[serde(serialize_with = "micros")]
    pub backlog: Duration,
    pub running: usize,
    pub waiting: usize,
    pub kv_held_blocks: usize,
}

fn micros<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_micros() as u64)
}

/// The prompt's block hashes as this pod keys them (model name as the chain's seed).
pub fn hashes_for(engine: &Engine, canonical: &str) -> (u64, Vec<u64>) {
    let tokens = tokenize(canonical);
    let hashes = block_hashes(
        &engine.cfg.served_model_name,
        &tokens,
        engine.cfg.block_tokens,
    );
    (tokens.len() as u64, hashes)
}

/// The pod's view of a prompt given by its token count and block hashes ([`hashes_for`]; pods of
/// one model and block size share them).
pub fn probe(engine: &Engine, prompt_tokens: u64, hashes: &[u64]) -> Probe {
    let job = Job {
        prompt_tokens,
        block_hashes: hashes.to_vec(),
        lora: None,
        output_tokens: 0,
    };
    let (running, waiting) = engine.gauges();
    Probe {
        prompt_tokens,
        cached_tokens: engine.peek(&job),
        backlog: engine.lane().map_or(Duration::ZERO, |l| l.backlog()),
        running,
        waiting,
        kv_held_blocks: engine.kv_held_blocks(),
    }
}

/// `POST /admin/probe[?api=chat|completions|responses|messages]` with a generation body.
pub fn probe_body(engine: &Engine, api: &str, body: &[u8]) -> Result<Probe, String> {
    let kind = match api {
        "" | "chat" => ApiKind::Chat,
        "completions" => ApiKind::Completions,
        "responses" => ApiKind::Responses,
        "messages" => ApiKind::Messages,
        other => return Err(format!("unknown api {other:?}")),
    };
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    let text = canonical_prompt(kind, &v)?;
    let (n, hashes) = hashes_for(engine, &text);
    Ok(probe(engine, n, &hashes))
}
