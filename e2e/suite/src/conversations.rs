//! Multi-turn chat conversations replayed through a gateway to real engines (issue 51): each
//! turn resends the whole conversation (its system prompt, every earlier question and the
//! engine's own answers) plus one new question, as a chat client does, so every later turn's
//! prompt begins with the previous turn's. What the engines report as cached
//! (`usage.prompt_tokens_details.cached_tokens`) then says whether the turn came back to the
//! engine holding its prefix. Streamed (`stream`), each turn also gives its time to first
//! token (stream.rs).

mod stream;

use crate::gateway::http;
use crate::llama::usage;
use ailb_fakepod::rng::Rng;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The conversations to replay.
#[derive(Clone, Debug)]
pub struct Conversations {
    pub count: usize,
    pub turns: usize,
    /// Conversations in flight at once (each runs its turns in order).
    pub concurrency: usize,
    /// Words of each conversation's own system prompt, and of each question.
    pub system_words: usize,
    pub question_words: usize,
    /// Answer length (`max_tokens`).
    pub answer_tokens: u64,
    pub seed: u64,
    /// The plugin's `debugHeader`, read for the endpoint that served each turn.
    pub debug_header: String,
    /// Streamed turns (`stream_options.include_usage`): each turn's TTFT is measured.
    pub stream: bool,
}

impl Default for Conversations {
    fn default() -> Self {
        Conversations {
            count: 8,
            turns: 4,
            concurrency: 4,
            system_words: 300,
            question_words: 40,
            answer_tokens: 24,
            seed: 1,
            debug_header: "x-ailb-debug".into(),
            stream: false,
        }
    }
}

/// One answered turn.
#[derive(Clone, Debug)]
pub struct Turn {
    pub conversation: usize,
    pub turn: usize,
    pub status: u16,
    /// `endpoint=` of the debug header, empty when absent.
    pub endpoint: String,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// Time to the whole answer.
    pub latency: Duration,
    /// Streamed: time to the first event carrying answer text; otherwise the latency.
    pub ttft: Duration,
}

/// Turns, prompt and cached tokens of one endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndpointTotals {
    pub requests: usize,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

/// What a replay gives: every turn, in the order they finished.
#[derive(Clone, Debug, Default)]
pub struct Replay {
    pub turns: Vec<Turn>,
}

impl Replay {
    /// Cached over prompt tokens of every later turn (turn ≥ 1): the share of prompt the
    /// engines did not prefill again.
    pub fn later_turn_cached_share(&self) -> f64 {
        let later = self.turns.iter().filter(|t| t.turn > 0 && t.status == 200);
        let (cached, prompt) = later.fold((0, 0), |(c, p), t| {
            (c + t.cached_tokens, p + t.prompt_tokens)
        });
        cached as f64 / prompt.max(1) as f64
    }

    pub fn failed(&self) -> usize {
        self.turns.iter().filter(|t| t.status != 200).count()
    }

    /// Latency of later turns at quantile `q` (0..=1).
    pub fn later_turn_latency(&self, q: f64) -> Duration {
        self.later_turn_quantile(q, |t| t.latency)
    }

    /// Time to first token of later turns at quantile `q` (the latency when not streamed).
    pub fn later_turn_ttft(&self, q: f64) -> Duration {
        self.later_turn_quantile(q, |t| t.ttft)
    }

    fn later_turn_quantile(&self, q: f64, of: impl Fn(&Turn) -> Duration) -> Duration {
        let mut l: Vec<Duration> = self
            .turns
            .iter()
            .filter(|t| t.turn > 0 && t.status == 200)
            .map(of)
            .collect();
        l.sort();
        if l.is_empty() {
            return Duration::ZERO;
        }
        l[((l.len() - 1) as f64 * q).round() as usize]
    }

    /// Every answered turn's totals by the endpoint that served it (debug header; `-` when
    /// absent).
    pub fn by_endpoint(&self) -> BTreeMap<String, EndpointTotals> {
        let mut out: BTreeMap<String, EndpointTotals> = BTreeMap::new();
        for t in self.turns.iter().filter(|t| t.status == 200) {
            let key = if t.endpoint.is_empty() {
                "-"
            } else {
                &t.endpoint
            };
            let e = out.entry(key.to_string()).or_default();
            e.requests += 1;
            e.prompt_tokens += t.prompt_tokens;
            e.cached_tokens += t.cached_tokens;
        }
        out
    }
}

/// `words` English words from a small vocabulary, drawn from `rng`: a real engine's tokenizer
/// makes one or two tokens of each, as of ordinary text (the fake pods' `load::plan::words`
/// are 3 random letters, one fake token each, which a real tokenizer splits apart).
fn english(rng: &mut Rng, words: usize) -> String {
    const VOCAB: &[&str] = &[
        "gateway", "token", "cache", "prefix", "engine", "request", "answer", "model", "replica",
        "latency", "queue", "batch", "prompt", "decode", "stream", "route", "cluster", "memory",
        "kernel", "vector", "layer", "weight", "shard", "lease",
    ];
    (0..words)
        .map(|_| VOCAB[rng.below(VOCAB.len() as u64) as usize])
        .collect::<Vec<_>>()
        .join(" ")
}

/// Replays `cfg` through `gateway` (a base URL); `headers` go with every request.
pub fn replay(gateway: &str, cfg: &Conversations, headers: &[(&str, &str)]) -> Replay {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let turns = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..cfg.concurrency.max(1) {
            s.spawn(|| loop {
                let c = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if c >= cfg.count {
                    break;
                }
                let done = converse(gateway, cfg, headers, c);
                turns.lock().unwrap_or_else(|e| e.into_inner()).extend(done);
            });
        }
    });
    Replay {
        turns: turns.into_inner().unwrap_or_else(|e| e.into_inner()),
    }
}

/// Conversation `c`: its turns in order; a failed turn ends it.
fn converse(gateway: &str, cfg: &Conversations, headers: &[(&str, &str)], c: usize) -> Vec<Turn> {
    let mut rng = Rng::new(cfg.seed.wrapping_mul(1_000_003).wrapping_add(c as u64));
    let mut messages = vec![
        json!({"role": "system", "content": format!("conversation {c}: {}", english(&mut rng, cfg.system_words))}),
    ];
    let mut out = Vec::new();
    let mut hdrs = vec![("content-type", "application/json")];
    hdrs.extend_from_slice(headers);
    for turn in 0..cfg.turns {
        messages.push(json!({"role": "user", "content": english(&mut rng, cfg.question_words)}));
        let mut body =
            json!({"model": "tiny", "messages": messages, "max_tokens": cfg.answer_tokens});
        if cfg.stream {
            body["stream"] = true.into();
            body["stream_options"] = json!({"include_usage": true});
        }
        let a = send(gateway, &hdrs, body.to_string().as_bytes(), cfg.stream);
        let (prompt_tokens, cached_tokens) = usage(&a.body).unwrap_or((0, 0));
        let endpoint = a
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(&cfg.debug_header))
            .and_then(|(_, v)| {
                v.split(';')
                    .find_map(|p| p.trim().strip_prefix("endpoint="))
            })
            .unwrap_or_default()
            .to_string();
        out.push(Turn {
            conversation: c,
            turn,
            status: a.status,
            endpoint,
            prompt_tokens,
            cached_tokens,
            latency: a.latency,
            ttft: a.ttft,
        });
        match (a.status, a.text) {
            (200, Some(text)) => messages.push(json!({"role": "assistant", "content": text})),
            _ => break,
        }
    }
    out
}

/// One answer, streamed or not.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
    text: Option<String>,
    latency: Duration,
    ttft: Duration,
}

fn send(gateway: &str, hdrs: &[(&str, &str)], body: &[u8], streamed: bool) -> Answer {
    let path = "/v1/chat/completions";
    let start = Instant::now();
    if streamed {
        return match stream::post(gateway, path, hdrs, body) {
            Ok(s) => Answer {
                status: s.status,
                headers: s.headers,
                body: s.body,
                // An answer whose events carried no text is still an answer.
                text: (s.status == 200).then_some(s.text),
                latency: s.latency,
                ttft: s.first_content.unwrap_or(s.latency),
            },
            Err(_) => failed(start.elapsed()),
        };
    }
    match http(gateway, "POST", path, hdrs, body) {
        Ok((status, headers, rb)) => {
            let latency = start.elapsed();
            let body = String::from_utf8_lossy(&rb).into_owned();
            let text = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| v.pointer("/choices/0/message/content").cloned())
                .and_then(|v| v.as_str().map(str::to_string));
            Answer {
                status,
                headers,
                body,
                text,
                latency,
                ttft: latency,
            }
        }
        Err(_) => failed(start.elapsed()),
    }
}

fn failed(latency: Duration) -> Answer {
    Answer {
        status: 0,
        headers: Vec::new(),
        body: String::new(),
        text: None,
        latency,
        ttft: latency,
    }
}
