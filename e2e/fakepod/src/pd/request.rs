//! Reading a request's P/D parameters as each engine reads them (docs/disaggregated-serving.md
//! §1, §2, §4), for the role the pod plays.

use super::fabric::Key;
use super::stats::PdCounters;
use super::trtllm;
use super::{RankPd, Role};
use crate::config::EngineKind;
use crate::openai::GenRequest;
use serde_json::Value;
use std::sync::Arc;

/// The P/D part of one request, decided before it enters the engine.
#[derive(Debug, Clone)]
pub struct PdJob {
    pub rank: Arc<RankPd>,
    pub act: Act,
}

/// What a request asks of a prefill or decode pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Ask {
    /// Nothing P/D: served as a colocated pod serves it.
    Plain,
    Act(Act),
    /// A decode pod without usable parameters prefills itself; `invalid` tells a malformed set
    /// (vLLM: "Got invalid KVTransferParams … will not utilize KVTransfer", §1) from none.
    SelfPrefill {
        invalid: bool,
    },
    /// A 400, as the engine's request validation gives one.
    Reject(String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Act {
    /// Prefill for a remote decode pod and offer the KV.
    Produce(Produce),
    /// Pull the KV a prefill pod offered instead of prefilling.
    Consume(Pull),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Produce {
    /// vLLM: answer with top-level `kv_transfer_params`.
    Vllm,
    /// TensorRT-LLM `context_only`: answer with per-choice `disaggregated_params`; the
    /// request's `disagg_request_id` is echoed.
    Trt { disagg_request_id: Value },
    /// SGLang: offer the KV under this room at the pod's bootstrap address.
    Sglang { room: u64 },
}

/// Where a decode pod pulls from.
#[derive(Debug, Clone, PartialEq)]
pub struct Pull {
    pub key: Key,
    /// The address the parameters name; the pull fails unless the offer came from there.
    pub host: String,
    pub port: u16,
    /// SGLang: the decode request may arrive before the prefill is done; wait for the room.
    pub wait: bool,
}

/// The P/D side of a request with body `body` on `rank` (`None`: served as a colocated pod
/// serves it); `Err` is a 400's message.
pub fn prepare(
    kind: EngineKind,
    rank: &Arc<RankPd>,
    body: &Value,
    gen: &mut GenRequest,
) -> Result<Option<PdJob>, String> {
    let c = &rank.counters;
    match ask(kind, rank.role, body) {
        Ask::Plain => Ok(None),
        Ask::Reject(msg) => Err(msg),
        Ask::SelfPrefill { invalid } => {
            PdCounters::bump(
                if invalid {
                    &c.self_prefill_invalid
                } else {
                    &c.self_prefill_missing
                },
                1,
            );
            Ok(None)
        }
        Ask::Act(act) => {
            // TensorRT-LLM's generation request carries the prompt as token ids (§2); the fake
            // answers from the text its prefill pod computed.
            if let (EngineKind::TrtLlm, Act::Consume(pull)) = (kind, &act) {
                if let Some(p) = rank.cfg.fabric.peek(&pull.key) {
                    gen.prompt = p.prompt;
                }
            }
            Ok(Some(PdJob {
                rank: rank.clone(),
                act,
            }))
        }
    }
}

/// The P/D request of `body` for a pod of `engine` playing `role`.
pub fn ask(engine: EngineKind, role: Role, body: &Value) -> Ask {
    match (role, engine) {
        (Role::Colocated, _) => Ask::Plain,
        (_, EngineKind::VllmV1 | EngineKind::VllmV0) => vllm(role, body),
        (_, EngineKind::TrtLlm) => trt(role, body),
        (_, EngineKind::Sglang) => sglang(role, body),
    }
}

/// vLLM (§1). `kv_transfer_params` is `Optional[dict[str, Any]]` on the request model, so a
/// non-object is a validation error (400); what is inside is the connector's to judge.
fn vllm(role: Role, body: &Value) -> Ask {
    let params = match body.get("kv_transfer_params") {
        None | Some(Value::Null) => return absent(role),
        Some(Value::Object(o)) => o,
        Some(_) => {
            return Ask::Reject("kv_transfer_params: Input should be a valid dictionary".into())
        }
    };
    let flag = |k: &str| params.get(k).and_then(Value::as_bool) == Some(true);
    match role {
        Role::Prefill if flag("do_remote_decode") => Ask::Act(Act::Produce(Produce::Vllm)),
        Role::Decode if flag("do_remote_prefill") => {
            let s = |k: &str| params.get(k).and_then(Value::as_str).map(String::from);
            let port = params
                .get("remote_port")
                .and_then(Value::as_u64)
                .and_then(|p| u16::try_from(p).ok());
            let blocks_ok = params.get("remote_block_ids").is_some_and(Value::is_array);
            // NixlConnector needs all four together with the block ids (§1); wrong types are
            // treated as missing (the connector would fail on them at handshake).
            match (
                s("remote_engine_id"),
                s("remote_request_id"),
                s("remote_host"),
                port,
            ) {
                (Some(engine), Some(req), Some(host), Some(port)) if blocks_ok => {
                    Ask::Act(Act::Consume(Pull {
                        key: (engine, req),
                        host,
                        port,
                        wait: false,
                    }))
                }
                _ => Ask::SelfPrefill { invalid: true },
            }
        }
        _ => absent(role),
    }
}

/// TensorRT-LLM (§2). The request's parameters. `request_type` is required and lower-cased by the engine;
/// anything but its three values is a 400 (`DisaggregatedParams.__post_init__`).
fn trt(role: Role, body: &Value) -> Ask {
    let p = match body.get("disaggregated_params") {
        None | Some(Value::Null) => return absent(role),
        Some(Value::Object(o)) => o,
        Some(_) => {
            return Ask::Reject("disaggregated_params: Input should be a valid dictionary".into())
        }
    };
    let Some(kind) = p.get("request_type").and_then(Value::as_str) else {
        return Ask::Reject("disaggregated_params.request_type: Field required".into());
    };
    let kind = kind.to_lowercase();
    if !["context_only", "generation_only", "context_and_generation"].contains(&kind.as_str()) {
        return Ask::Reject(format!("Unknown request type: {kind}"));
    }
    match (role, kind.as_str()) {
        (Role::Prefill, "context_only") => Ask::Act(Act::Produce(Produce::Trt {
            disagg_request_id: p.get("disagg_request_id").cloned().unwrap_or(Value::Null),
        })),
        (Role::Decode, "generation_only") => {
            let ctx = p.get("ctx_request_id").and_then(Value::as_u64);
            let state = p
                .get("encoded_opaque_state")
                .and_then(Value::as_str)
                .and_then(trtllm::decode_state);
            match (ctx, state) {
                (Some(ctx), Some((engine, host, port))) => Ask::Act(Act::Consume(Pull {
                    key: (engine, ctx.to_string()),
                    host,
                    port,
                    wait: false,
                })),
                _ => Ask::SelfPrefill { invalid: true },
            }
        }
        _ => absent(role),
    }
}

/// No parameters: a prefill pod serves the request whole; a decode pod prefills itself.
pub fn absent(role: Role) -> Ask {
    match role {
        Role::Decode => Ask::SelfPrefill { invalid: false },
        _ => Ask::Plain,
    }
}

/// SGLang (§4): the same three fields go to both pods. The engine types `bootstrap_room` as an
/// int or a list of ints (a batch); the fake serves no batches, so a list is refused.
fn sglang(role: Role, body: &Value) -> Ask {
    let room = match body.get("bootstrap_room") {
        None | Some(Value::Null) => return absent(role),
        Some(v) => match v.as_u64() {
            Some(r) => r,
            None if v.is_array() => {
                return Ask::Reject(
                    "bootstrap_room: batches are not modelled by the fake pod".into(),
                )
            }
            None => return Ask::Reject("bootstrap_room: Input should be a valid integer".into()),
        },
    };
    if role == Role::Prefill {
        return Ask::Act(Act::Produce(Produce::Sglang { room }));
    }
    let host = body.get("bootstrap_host").and_then(Value::as_str);
    // A null port is what mini_lb sends for a prefill server registered without one; the
    // decode server's handling of it is unverified (§4): the fake takes the default port.
    let port = match body.get("bootstrap_port") {
        None | Some(Value::Null) => Some(super::PdConfig::default().bootstrap_port),
        Some(v) => v.as_u64().and_then(|p| u16::try_from(p).ok()),
    };
    match (host, port) {
        (Some(h), Some(port)) => {
            // IPv6 hosts come bracketed (`maybe_wrap_ipv6_address`, §4).
            let host = h.trim_start_matches('[').trim_end_matches(']').to_string();
            Ask::Act(Act::Consume(Pull {
                key: room_key(&host, port, room),
                host,
                port,
                wait: true,
            }))
        }
        _ => Ask::SelfPrefill { invalid: true },
    }
}

/// The fabric key of an SGLang room at a prefill pod's bootstrap address.
pub fn room_key(host: &str, port: u16, room: u64) -> Key {
    (format!("sglang://{host}:{port}"), room.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_dialect_reads_its_own_fields() {
        let v = EngineKind::VllmV1;
        let produce = Ask::Act(Act::Produce(Produce::Vllm));
        let to_p = json!({"kv_transfer_params": {"do_remote_decode": true}});
        assert_eq!(ask(v, Role::Prefill, &to_p), produce);
        assert_eq!(ask(v, Role::Colocated, &to_p), Ask::Plain);
        // A string where a bool belongs is not a request for remote decode.
        let quoted = json!({"kv_transfer_params": {"do_remote_decode": "true"}});
        assert_eq!(ask(v, Role::Prefill, &quoted), Ask::Plain);
        assert!(matches!(
            ask(v, Role::Prefill, &json!({"kv_transfer_params": [1]})),
            Ask::Reject(_)
        ));
        let to_d = json!({"kv_transfer_params": {"do_remote_prefill": true, "remote_engine_id": "p",
            "remote_request_id": "r", "remote_host": "h", "remote_port": 70000, "remote_block_ids": [[1]]}});
        assert_eq!(
            ask(v, Role::Decode, &to_d),
            Ask::SelfPrefill { invalid: true },
            "port out of range"
        );
        assert_eq!(
            ask(v, Role::Decode, &json!({})),
            Ask::SelfPrefill { invalid: false }
        );
        // SGLang's fields mean nothing to vLLM, and the other way round.
        let room = json!({"bootstrap_room": 1, "bootstrap_host": "[::1]", "bootstrap_port": 9000});
        assert_eq!(ask(v, Role::Prefill, &room), Ask::Plain);
        assert_eq!(ask(EngineKind::Sglang, Role::Prefill, &to_p), Ask::Plain);
        match ask(EngineKind::Sglang, Role::Decode, &room) {
            Ask::Act(Act::Consume(p)) => {
                assert_eq!((p.host.as_str(), p.port, p.wait), ("::1", 9000, true));
                assert_eq!(p.key, room_key("::1", 9000, 1));
            }
            other => panic!("{other:?}"),
        }
        let batch = json!({"bootstrap_room": [1, 2]});
        assert!(matches!(
            ask(EngineKind::Sglang, Role::Decode, &batch),
            Ask::Reject(_)
        ));
        let upper = json!({"disaggregated_params": {"request_type": "CONTEXT_ONLY"}});
        assert!(matches!(
            ask(EngineKind::TrtLlm, Role::Prefill, &upper),
            Ask::Act(Act::Produce(Produce::Trt { .. }))
        ));
    }
}
