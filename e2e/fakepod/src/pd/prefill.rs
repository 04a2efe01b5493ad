//! The prefill side: once a prompt is prefilled, offer its KV and say so in the answer
//! (docs/disaggregated-serving.md §1, §2, §4).

use super::fabric::Pinned;
use super::request::{room_key, Produce};
use super::{trtllm, RankPd};
use crate::tokenize::tokenize;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::time::Instant;

/// The prompt a prefill rank has just computed.
pub struct Prefilled<'a> {
    /// P's own id of the request (vLLM `remote_request_id`; TensorRT-LLM's `ctx_request_id`
    /// is `seq`).
    pub request_id: &'a str,
    pub seq: u64,
    pub prompt: &'a str,
    pub prompt_tokens: u64,
    pub block_hashes: &'a [u64],
    /// The text of the one token P generated (TensorRT-LLM `first_gen_tokens`).
    pub first_token: &'a str,
}

/// Block "ids" naming the prompt's blocks: vLLM sends physical block indices; the fake has no
/// block table, so it names each full block by its chained hash, cut to 31 bits to stay an
/// exact JSON number everywhere. The partial last block is not named (the fake caches only
/// full blocks).
pub fn block_ids(hashes: &[u64]) -> Vec<u64> {
    hashes.iter().map(|h| h >> 33).collect()
}

/// Where the offered KV can be read from.
pub struct Offer {
    ids: Vec<u64>,
    host: String,
    port: u16,
}

/// Offers the KV of `done` on the rank's fabric, pinned until a decode pod reads it or the
/// pin times out.
pub fn offer(rank: &RankPd, produce: &Produce, done: &Prefilled<'_>) -> Offer {
    let (key, host, port) = match produce {
        Produce::Vllm => (
            (rank.engine_id.clone(), done.request_id.to_string()),
            rank.host.clone(),
            rank.port,
        ),
        Produce::Trt { .. } => (
            trtllm::key(&rank.engine_id, done.seq),
            rank.host.clone(),
            rank.port,
        ),
        Produce::Sglang { room } => {
            let port = rank.cfg.bootstrap_port;
            (room_key(&rank.host, port, *room), rank.host.clone(), port)
        }
    };
    rank.cfg.fabric.offer(
        key,
        Pinned {
            owner: rank.counters.clone(),
            host: host.clone(),
            port,
            prompt: done.prompt.to_string(),
            prompt_tokens: done.prompt_tokens,
            block_hashes: done.block_hashes.to_vec(),
            expires: Instant::now() + Duration::from_micros(rank.cfg.pin_timeout_us),
        },
    );
    Offer {
        ids: block_ids(done.block_hashes),
        host,
        port,
    }
}

/// Says in the finished non-streamed answer `body` where the KV is, as the engine does.
/// SGLang's prefill answer is the plain one: the decode pod finds the KV by its room.
pub fn decorate(
    rank: &RankPd,
    produce: &Produce,
    done: &Prefilled<'_>,
    offer: &Offer,
    body: &mut Value,
) {
    let Some(obj) = body.as_object_mut() else {
        return;
    };
    let (ids, host, port) = (&offer.ids, &offer.host, offer.port);
    match produce {
        // `NixlConnectorScheduler.request_finished`: returned only when the length cap ended
        // the request, which is how every fake answer ends (§1).
        Produce::Vllm => {
            obj.insert(
                "kv_transfer_params".into(),
                json!({
                    "do_remote_prefill": true, "do_remote_decode": false,
                    "remote_block_ids": [ids], "remote_engine_id": rank.engine_id,
                    "remote_request_id": done.request_id, "remote_host": host,
                    "remote_port": port, "tp_size": 1,
                }),
            );
        }
        Produce::Trt { disagg_request_id } => {
            let params = json!({
                "request_type": "context_only",
                "first_gen_tokens": tokenize(done.first_token),
                "ctx_request_id": done.seq,
                "encoded_opaque_state": trtllm::encode_state(&rank.engine_id, host, port, ids),
                "draft_tokens": null,
                "disagg_request_id": disagg_request_id,
                "ctx_dp_rank": rank.rank,
            });
            if let Some(choice) = obj
                .get_mut("choices")
                .and_then(|c| c.get_mut(0))
                .and_then(Value::as_object_mut)
            {
                choice.insert("disaggregated_params".into(), params);
            }
            obj.insert("prompt_token_ids".into(), json!(tokenize(done.prompt)));
        }
        Produce::Sglang { .. } => {}
    }
}
