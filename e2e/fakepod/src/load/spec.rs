//! Load-generator configuration: targets, workload shapes, header injection and aborts.

use crate::rng::Dist;
use std::time::Duration;

/// Which OpenAI endpoint the requests go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completions,
}

impl Api {
    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Completions => "/v1/completions",
        }
    }
}

/// Multi-turn chat sessions sharing a few system prompts (the prefix-cache benchmark shape).
#[derive(Clone, Debug)]
pub struct SessionsSpec {
    pub sessions: usize,
    pub rounds: usize,
    /// ~tokens of new user text per round.
    pub new_tokens: u64,
    /// At most this many sessions in flight; a session's rounds are sequential.
    pub concurrency: usize,
    /// Number of distinct shared system prompts; session i uses prompt i % system_prompts.
    pub system_prompts: usize,
    /// ~tokens per system prompt.
    pub system_tokens: u64,
    /// max_tokens per request, also the length of the synthetic assistant answer in history.
    pub max_tokens: u64,
}

impl Default for SessionsSpec {
    /// The benchmark setting: 60 sessions x 5 rounds, ~200 new tokens/round, concurrency 20.
    fn default() -> Self {
        Self {
            sessions: 60,
            rounds: 5,
            new_tokens: 200,
            concurrency: 20,
            system_prompts: 4,
            system_tokens: 1000,
            max_tokens: 32,
        }
    }
}

/// Open-loop arrival process.
#[derive(Clone, Debug)]
pub enum Arrivals {
    /// Poisson arrivals at `rate` per second for `duration`.
    Poisson { rate: f64, duration: Duration },
    /// Exactly `count` arrivals at uniformly random times within `duration` (a conditioned
    /// Poisson process: same burstiness, fixed size).
    Count { count: usize, duration: Duration },
}

/// A clamped size distribution.
#[derive(Clone, Debug)]
pub struct Sizes {
    pub dist: Dist,
    pub min: u64,
    pub max: u64,
}

/// Open-loop traffic with heavy-tailed prompt and output sizes.
#[derive(Clone, Debug)]
pub struct SkewedSpec {
    pub arrivals: Arrivals,
    pub prompt_tokens: Sizes,
    pub max_tokens: Sizes,
    pub stream: bool,
}

impl Default for SkewedSpec {
    fn default() -> Self {
        Self {
            arrivals: Arrivals::Count {
                count: 200,
                duration: Duration::from_secs(10),
            },
            prompt_tokens: Sizes {
                dist: Dist::LogNormal {
                    median: 300.0,
                    sigma: 1.0,
                },
                min: 8,
                max: 8000,
            },
            max_tokens: Sizes {
                dist: Dist::LogNormal {
                    median: 32.0,
                    sigma: 1.0,
                },
                min: 1,
                max: 1024,
            },
            stream: false,
        }
    }
}

/// C concurrent long requests fired together, to check that they are spread evenly.
#[derive(Clone, Debug)]
pub struct HoldSpec {
    pub concurrency: usize,
    /// Output tokens per request: hold time = max_tokens x the pod's decode time per token.
    pub max_tokens: u64,
    pub prompt_tokens: u64,
    pub stream: bool,
}

impl Default for HoldSpec {
    fn default() -> Self {
        Self {
            concurrency: 16,
            max_tokens: 200,
            prompt_tokens: 64,
            stream: true,
        }
    }
}

/// The traffic shape.
#[derive(Clone, Debug)]
pub enum Workload {
    Sessions(SessionsSpec),
    Skewed(SkewedSpec),
    Hold(HoldSpec),
}

impl Workload {
    pub fn name(&self) -> &'static str {
        match self {
            Workload::Sessions(_) => "sessions",
            Workload::Skewed(_) => "skewed",
            Workload::Hold(_) => "hold",
        }
    }
}

/// Adds `name: value` to a request with the given probability (e.g. `x-fake-fault: reset`).
#[derive(Clone, Debug, PartialEq)]
pub struct HeaderRule {
    pub name: String,
    pub value: String,
    pub probability: f64,
}

/// When a client-side abort drops the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortPhase {
    /// `after` from sending, unless the first body byte arrived earlier (then it runs to the end).
    BeforeFirstByte,
    /// `after` from the first body byte.
    AfterFirstByte,
}

/// Client-side abort of a fraction of requests.
#[derive(Clone, Debug, PartialEq)]
pub struct AbortRule {
    pub probability: f64,
    pub after: Duration,
    pub phase: AbortPhase,
}

/// A complete load run.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// Gateway base URLs (`http://127.0.0.1:8080`); sessions/requests spread round-robin.
    pub targets: Vec<String>,
    pub api: Api,
    pub model: String,
    pub seed: u64,
    pub workload: Workload,
    pub headers: Vec<HeaderRule>,
    pub abort: Option<AbortRule>,
    /// Per-request timeout (counts as error kind `timeout`).
    pub timeout: Duration,
    /// Fake pods' base URLs: reset before the run (if `reset_pods`) and read after it, so the
    /// summary carries server-side truth (prefix hit rate, queue peaks) per pod.
    pub admin_urls: Vec<String>,
    /// Reset pod counters *and caches* before the run, so two setups start equally cold.
    pub reset_pods: bool,
}

impl LoadConfig {
    /// A config with defaults for everything but targets and workload.
    pub fn new(targets: Vec<String>, workload: Workload) -> Self {
        Self {
            targets,
            api: Api::Chat,
            model: "fake-model".into(),
            seed: 1,
            workload,
            headers: Vec::new(),
            abort: None,
            timeout: Duration::from_secs(60),
            admin_urls: Vec::new(),
            reset_pods: true,
        }
    }
}
