//! Turns a `LoadConfig` into the exact, seed-determined list of requests. Nothing here depends
//! on responses or timing, so the same seed replays the same sequence against any setup.

use super::spec::{AbortRule, Api, Arrivals, LoadConfig, Workload};
use crate::openai::answer_text;
use crate::rng::Rng;
use crate::tokenize::{canonical_prompt, ApiKind};
use ailb_core::hash::{fnv1a, FNV_OFFSET};
use serde_json::{json, Value};
use std::time::Duration;

// Stream purposes for Rng::derive.
const SYSTEM: u64 = 1;
const USER: u64 = 2;
// 3 was the synthetic-answer stream; answers now come from the pods themselves.
const DECORATE: u64 = 4;
const ARRIVALS: u64 = 5;
const SIZES: u64 = 6;
const PROMPT: u64 = 7;

/// One request to send.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedRequest {
    /// Position in the plan.
    pub index: usize,
    /// Index into `LoadConfig::targets`.
    pub target: usize,
    /// `(session, round)` for the sessions workload.
    pub session: Option<(usize, usize)>,
    /// Arrival offset from the run start (open-loop workloads).
    pub at: Option<Duration>,
    pub stream: bool,
    pub body: String,
    pub headers: Vec<(String, String)>,
    pub abort: Option<AbortRule>,
}

/// The whole run. For sessions, `requests` is session-major (all rounds of session 0, then 1...).
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub requests: Vec<PlannedRequest>,
}

impl Plan {
    /// Hex digest of everything that defines the sequence (targets, timing, bodies, headers,
    /// aborts): equal digests mean the same requests were planned.
    pub fn fingerprint(&self) -> String {
        // Each line is folded in from the offset basis XOR the digest so far: the digest as it
        // was defined before the shared FNV-1a, kept so digests stay comparable across versions.
        let mut h = 0u64;
        for r in &self.requests {
            let line = format!(
                "{}|{}|{:?}|{:?}|{}|{:?}|{:?}|{}",
                r.index, r.target, r.session, r.at, r.stream, r.headers, r.abort, r.body
            );
            h = fnv1a(h ^ FNV_OFFSET, line.as_bytes());
        }
        format!("{h:016x}")
    }
}

/// Text of about `tokens` tokens for the fake pods' tokenizer: 3-letter words plus a space,
/// i.e. exactly 4 bytes = one token each.
pub fn words(rng: &mut Rng, tokens: u64) -> String {
    const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyz";
    let mut s = String::with_capacity(tokens as usize * 4);
    for _ in 0..tokens {
        for _ in 0..3 {
            s.push(LETTERS[rng.below(26) as usize] as char);
        }
        s.push(' ');
    }
    s
}

fn body(cfg: &LoadConfig, messages: &[Value], max_tokens: u64, stream: bool) -> String {
    let mut b = match cfg.api {
        Api::Chat => json!({"model": cfg.model, "messages": messages}),
        Api::Completions => {
            // Same canonical text the pod would render for the chat form.
            let prompt: String = messages
                .iter()
                .map(|m| {
                    format!(
                        "{}\n{}\n",
                        m["role"].as_str().unwrap_or(""),
                        m["content"].as_str().unwrap_or("")
                    )
                })
                .collect();
            json!({"model": cfg.model, "prompt": prompt})
        }
    };
    b["max_tokens"] = json!(max_tokens);
    b["stream"] = json!(stream);
    if stream {
        b["stream_options"] = json!({"include_usage": true});
    }
    b.to_string()
}

fn decorate(cfg: &LoadConfig, r: &mut PlannedRequest) {
    let mut rng = Rng::derive(cfg.seed, &[DECORATE, r.index as u64]);
    for rule in &cfg.headers {
        if rng.chance(rule.probability) {
            r.headers.push((rule.name.clone(), rule.value.clone()));
        }
    }
    if let Some(a) = &cfg.abort {
        if rng.chance(a.probability) {
            r.abort = Some(a.clone());
        }
    }
}

/// Builds the plan for `cfg`.
pub fn plan(cfg: &LoadConfig) -> Plan {
    let n_targets = cfg.targets.len().max(1);
    let mut requests = Vec::new();
    match &cfg.workload {
        Workload::Sessions(s) => {
            let systems: Vec<String> = (0..s.system_prompts.max(1))
                .map(|p| {
                    let mut rng = Rng::derive(cfg.seed, &[SYSTEM, p as u64]);
                    format!(
                        "You are assistant #{p}. {}",
                        words(&mut rng, s.system_tokens)
                    )
                })
                .collect();
            for sess in 0..s.sessions {
                let mut messages =
                    vec![json!({"role": "system", "content": systems[sess % systems.len()]})];
                for round in 0..s.rounds {
                    let mut rng = Rng::derive(cfg.seed, &[USER, sess as u64, round as u64]);
                    let user = format!("[s{sess} r{round}] {}", words(&mut rng, s.new_tokens));
                    messages.push(json!({"role": "user", "content": user}));
                    let index = requests.len();
                    requests.push(PlannedRequest {
                        index,
                        target: sess % n_targets,
                        session: Some((sess, round)),
                        at: None,
                        stream: true,
                        body: body(cfg, &messages, s.max_tokens, true),
                        headers: Vec::new(),
                        abort: None,
                    });
                    // The pod's own answer in history, as a real client sends it; pods answer
                    // deterministically, so the sequence still does not depend on the run.
                    let prompt = canonical_prompt(ApiKind::Chat, &json!({ "messages": messages }))
                        .unwrap_or_default();
                    let answer = answer_text(&prompt, s.max_tokens.max(1));
                    messages.push(json!({"role": "assistant", "content": answer}));
                }
            }
        }
        Workload::Skewed(k) => {
            let mut rng = Rng::derive(cfg.seed, &[ARRIVALS]);
            let times: Vec<f64> = match k.arrivals {
                Arrivals::Poisson { rate, duration } => {
                    let end = if rate > 0.0 {
                        duration.as_secs_f64()
                    } else {
                        0.0
                    };
                    let mut t = 0.0;
                    let mut v = Vec::new();
                    loop {
                        t += rng.exp(rate.max(f64::MIN_POSITIVE));
                        if t >= end {
                            break v;
                        }
                        v.push(t);
                    }
                }
                Arrivals::Count { count, duration } => {
                    let mut v: Vec<f64> = (0..count)
                        .map(|_| rng.f64() * duration.as_secs_f64())
                        .collect();
                    v.sort_by(f64::total_cmp);
                    v
                }
            };
            for (i, t) in times.into_iter().enumerate() {
                let mut sz = Rng::derive(cfg.seed, &[SIZES, i as u64]);
                let p =
                    k.prompt_tokens
                        .dist
                        .sample(&mut sz, k.prompt_tokens.min, k.prompt_tokens.max);
                let m = k
                    .max_tokens
                    .dist
                    .sample(&mut sz, k.max_tokens.min, k.max_tokens.max);
                let mut text = Rng::derive(cfg.seed, &[PROMPT, i as u64]);
                let msg = json!({"role": "user", "content": words(&mut text, p)});
                requests.push(PlannedRequest {
                    index: i,
                    target: i % n_targets,
                    session: None,
                    at: Some(Duration::from_secs_f64(t)),
                    stream: k.stream,
                    body: body(cfg, &[msg], m, k.stream),
                    headers: Vec::new(),
                    abort: None,
                });
            }
        }
        Workload::Hold(h) => {
            for i in 0..h.concurrency {
                let mut text = Rng::derive(cfg.seed, &[PROMPT, i as u64]);
                let msg = json!({"role": "user", "content": words(&mut text, h.prompt_tokens)});
                requests.push(PlannedRequest {
                    index: i,
                    target: i % n_targets,
                    session: None,
                    at: Some(Duration::ZERO),
                    stream: h.stream,
                    body: body(cfg, &[msg], h.max_tokens, h.stream),
                    headers: Vec::new(),
                    abort: None,
                });
            }
        }
    }
    for r in &mut requests {
        decorate(cfg, r);
    }
    Plan { requests }
}
