//! Fake pod configuration: defaults, and the `ailb-fakepod` command line.

use crate::args::Args;
use crate::pd::{flags, PdConfig, Role};
use anyhow::{bail, Result};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Which model server's `/metrics` dialect to render.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    /// vLLM V1 names (`vllm:kv_cache_usage_perc`, prefix-cache counters, `engine` label).
    VllmV1,
    /// vLLM V0 names (`vllm:gpu_cache_usage_perc`, `vllm:gpu_prefix_cache_hit_rate`).
    VllmV0,
    /// SGLang names (`sglang:num_running_reqs`, `sglang:token_usage`, ...).
    Sglang,
    /// TensorRT-LLM (`trtllm-serve`): only its disaggregated request and answer shapes
    /// (pd/trtllm.rs); `/metrics` has no engine series (metrics.rs).
    TrtLlm,
}

/// Where `/metrics` comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetricsSource {
    /// Rendered from the live engine state.
    Live,
    /// A file served verbatim (read on every scrape so tests can rewrite it).
    File(PathBuf),
    /// Unparseable junk, for scraper fault tests.
    Garbage,
}

/// Everything one fake pod needs. Times are microseconds so tests can run fast.
#[derive(Clone, Debug)]
pub struct PodConfig {
    pub name: String,
    pub listen: SocketAddr,
    /// `model_name` label and default `model` in responses (vLLM `--served-model-name`).
    pub served_model_name: String,
    pub engine: EngineKind,
    /// Concurrently running requests (vLLM `max_num_seqs`); the rest wait in FIFO order.
    pub max_running: usize,
    /// Tokens per KV block (vLLM `block_size`, SGLang `page_size`).
    pub block_tokens: usize,
    /// Prefix cache capacity in blocks (0 disables the cache).
    pub cache_blocks: usize,
    pub prefill_us_per_token: u64,
    /// When positive: the pod prefills at this many tokens per second in one FIFO lane shared
    /// by its requests (lane.rs), instead of `prefill_us_per_token` per request in parallel.
    pub prefill_tokens_per_s: f64,
    /// With a prefill lane: tokens of prefill one forward pass takes (vLLM
    /// `max_num_batched_tokens`); a decode step while the lane is busy lasts at least that
    /// chunk's time (0 = decode never waits for prefill).
    pub prefill_chunk_tokens: u64,
    /// Admission waits until a request's uncached prompt and half its output fit in
    /// `kv_capacity_tokens` beside the running requests' (kv.rs).
    pub kv_admission: bool,
    /// Tokens per streamed event after the first (vLLM `--stream-interval`): the first token
    /// always leaves alone, so TTFT is unchanged, and a long answer costs fewer events.
    pub stream_interval: usize,
    pub decode_us_per_token: u64,
    /// Each extra running request slows a decode step by this fraction (batching cost).
    pub decode_batch_penalty: f64,
    /// Denominator of the KV usage gauge.
    pub kv_capacity_tokens: u64,
    /// Output tokens when the request gives no `max_tokens`/`max_completion_tokens`.
    pub default_max_tokens: u64,
    /// Cap on output tokens per request.
    pub max_output_tokens: u64,
    pub lora_adapters: Vec<String>,
    /// `max_lora` label; defaults to the number of adapters.
    pub max_lora: Option<usize>,
    pub metrics: MetricsSource,
    /// Time from admission to the first token (prefill plus the first decode step) is
    /// multiplied by this: a service that is slower to first token at equal load.
    pub ttft_multiplier: f64,
    /// Share of generation requests answered 500 at once (before queueing), drawn per request
    /// from `fault_seed`: the k-th request a pod receives fails or not the same way every run.
    /// The running pod's share can be changed (`Engine::set_error_rate`: a pod that heals).
    pub error_rate: f64,
    /// What a request drawn by `error_rate` gets: an `x-fake-fault` value (`status:NNN`,
    /// `reset`, `hang`, `reset-after-headers`).
    pub error_fault: String,
    pub fault_seed: u64,
    /// The Responses API's stored responses (responses_store.rs): the pod's own by default,
    /// as vLLM keeps them; pods given one store share it.
    pub responses: crate::responses_store::ResponseStore,
    /// Prefill, decode or both (docs/disaggregated-serving.md; pd/).
    pub role: Role,
    /// Data-parallel ranks behind the pod's one port, each its own queue, lane, cache and
    /// counters (dp.rs).
    pub dp_ranks: usize,
    /// Transfer costs, failure policy and the fabric P/D pods share (pd/mod.rs).
    pub pd: PdConfig,
}

impl Default for PodConfig {
    fn default() -> Self {
        Self {
            name: "pod-a".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            served_model_name: "fake-model".into(),
            engine: EngineKind::VllmV1,
            max_running: 8,
            block_tokens: 16,
            cache_blocks: 4096,
            prefill_us_per_token: 100,
            prefill_tokens_per_s: 0.0,
            prefill_chunk_tokens: 0,
            kv_admission: false,
            stream_interval: 1,
            decode_us_per_token: 10_000,
            decode_batch_penalty: 0.02,
            kv_capacity_tokens: 65_536,
            default_max_tokens: 16,
            max_output_tokens: 4096,
            lora_adapters: Vec::new(),
            max_lora: None,
            metrics: MetricsSource::Live,
            ttft_multiplier: 1.0,
            error_rate: 0.0,
            error_fault: "status:500".into(),
            fault_seed: 0,
            responses: crate::responses_store::ResponseStore::new(),
            role: Role::Colocated,
            dp_ranks: 1,
            pd: PdConfig::default(),
        }
    }
}

/// Parsed `ailb-fakepod` command line: one config template plus multi-pod options.
#[derive(Clone, Debug)]
pub struct Cli {
    pub pod: PodConfig,
    /// Run this many pods in one process (ports `listen`, `listen+1`, ... or all ephemeral).
    pub pods: usize,
    /// Multi-pod names are `<base>-<i>`; `None` means one pod named by `--name`.
    pub base_name: Option<String>,
}

pub const USAGE: &str = "\
ailb-fakepod: OpenAI-compatible fake model server

  --listen ADDR               127.0.0.1:0 (port 0 = ephemeral)
  --name NAME                 pod-a (sent as `x-pod` on every response)
  --pods N --base-name B      run N pods named B-0..B-(N-1) on N ports
  --model NAME                fake-model (served model name / model_name label)
  --engine vllm|vllm-v0|sglang|trtllm  dialect (vllm = V1 names)
  --max-running N             8     concurrent requests; the rest queue FIFO
  --block-tokens N            16    tokens per KV block
  --cache-blocks N            4096  prefix-cache LRU capacity in blocks (0 = off)
  --prefill-us-per-token US   100   per uncached prompt token
  --prefill-tokens-per-s R    0     >0: one FIFO prefill lane at R tokens/s (replaces the above)
  --prefill-chunk-tokens N     0     decode steps during a prefill last N tokens of it
  --kv-admission              admit only when uncached prompt + half the output fit in the KV
  --stream-interval N         1     tokens per streamed event after the first
  --decode-us-per-token US    10000 per output token
  --decode-batch-penalty F    0.02  decode slows by F per extra running request
  --kv-capacity-tokens N      65536 KV usage gauge denominator
  --default-max-tokens N      16
  --max-output-tokens N       4096
  --lora-adapters a,b         adapters served (model=a counts as LoRA a)
  --max-lora N                max_lora label (default: number of adapters)
  --metrics-file PATH         serve PATH verbatim as /metrics
  --metrics-garbage           serve junk as /metrics
  --ttft-multiplier F         1     prefill and first decode step take F times as long
  --error-rate F              0     share of generation requests answered 500 (seeded)
  --error-fault F             status:500  what those requests get: status:NNN, reset, hang
                                    (no answer for an hour), reset-after-headers
  --fault-seed N              0     seed of the --error-rate draws
  --role R                    colocated  prefill | decode (docs/test-bed.md, P/D roles)
  --dp-ranks N                1     data-parallel ranks behind the one port
  --kv-bytes-per-token N      131072  KV bytes per prompt token (Llama-3.1-8B BF16)
  --link-bytes-per-s F        12.1e9  KV transfer bandwidth (100 GbE RoCE)
  --transfer-fails            decode: every KV pull fails
  --kv-load-failure-policy P  fail  decode after a failed pull: fail | recompute
  --pin-timeout-us US         480000000  prefill holds unread KV this long
  --bootstrap-port N          8998  SGLang prefill bootstrap port
  --bootstrap-timeout-us US   300000000  SGLang decode waits this long for its room
";

impl Cli {
    /// Parses the arguments after the program name.
    pub fn parse(items: Vec<String>) -> Result<Self> {
        let mut a = Args::new(items);
        let mut c = PodConfig::default();
        let mut pods = 1usize;
        let mut base_name = None;
        while let Some(flag) = a.next_flag()? {
            match flag.as_str() {
                "--listen" => c.listen = a.parse(&flag)?,
                "--name" => c.name = a.value(&flag)?,
                "--pods" => pods = a.parse(&flag)?,
                "--base-name" => base_name = Some(a.value(&flag)?),
                "--model" | "--served-model-name" => c.served_model_name = a.value(&flag)?,
                "--engine" => {
                    c.engine = match a.value(&flag)?.as_str() {
                        "vllm" | "vllm-v1" => EngineKind::VllmV1,
                        "vllm-v0" => EngineKind::VllmV0,
                        "sglang" => EngineKind::Sglang,
                        "trtllm" | "tensorrt-llm" => EngineKind::TrtLlm,
                        other => bail!("unknown engine {other:?}"),
                    }
                }
                "--max-running" => c.max_running = a.parse(&flag)?,
                "--block-tokens" => c.block_tokens = a.parse(&flag)?,
                "--cache-blocks" => c.cache_blocks = a.parse(&flag)?,
                "--prefill-us-per-token" => c.prefill_us_per_token = a.parse(&flag)?,
                "--prefill-tokens-per-s" => c.prefill_tokens_per_s = a.parse(&flag)?,
                "--prefill-chunk-tokens" => c.prefill_chunk_tokens = a.parse(&flag)?,
                "--kv-admission" => c.kv_admission = true,
                "--stream-interval" => c.stream_interval = a.parse(&flag)?,
                "--decode-us-per-token" => c.decode_us_per_token = a.parse(&flag)?,
                "--decode-batch-penalty" => c.decode_batch_penalty = a.parse(&flag)?,
                "--kv-capacity-tokens" => c.kv_capacity_tokens = a.parse(&flag)?,
                "--default-max-tokens" => c.default_max_tokens = a.parse(&flag)?,
                "--max-output-tokens" => c.max_output_tokens = a.parse(&flag)?,
                "--lora-adapters" => {
                    c.lora_adapters = a
                        .value(&flag)?
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect()
                }
                "--max-lora" => c.max_lora = Some(a.parse(&flag)?),
                "--metrics-file" => c.metrics = MetricsSource::File(a.value(&flag)?.into()),
                "--metrics-garbage" => c.metrics = MetricsSource::Garbage,
                "--ttft-multiplier" => c.ttft_multiplier = a.parse(&flag)?,
                "--error-rate" => c.error_rate = a.parse(&flag)?,
                "--error-fault" => c.error_fault = a.value(&flag)?,
                "--fault-seed" => c.fault_seed = a.parse(&flag)?,
                "--help" | "-h" => bail!("{USAGE}"),
                other => {
                    let t = flags::Target {
                        role: &mut c.role,
                        dp_ranks: &mut c.dp_ranks,
                        pd: &mut c.pd,
                    };
                    if !flags::apply(t, other, &mut a)? {
                        bail!("unknown flag {other}\n\n{USAGE}")
                    }
                }
            }
        }
        if c.max_running == 0 || c.block_tokens == 0 || c.stream_interval == 0 || pods == 0 {
            bail!("--max-running, --block-tokens, --stream-interval and --pods must be positive");
        }
        if !(c.prefill_tokens_per_s.is_finite() && c.prefill_tokens_per_s >= 0.0) {
            bail!("--prefill-tokens-per-s must be a finite number >= 0");
        }
        if !(c.ttft_multiplier.is_finite() && c.ttft_multiplier >= 1.0) {
            bail!("--ttft-multiplier must be a finite number >= 1");
        }
        if !(0.0..=1.0).contains(&c.error_rate) {
            bail!("--error-rate must be in [0, 1]");
        }
        flags::check(c.dp_ranks, &c.pd)?;
        if crate::fault::Fault::parse(&c.error_fault).is_none() {
            bail!("--error-fault: unknown fault `{}`", c.error_fault);
        }
        Ok(Self {
            base_name: match base_name {
                None if pods > 1 => Some("pod".into()),
                other => other,
            },
            pod: c,
            pods,
        })
    }

    /// One config per pod to start.
    pub fn pod_configs(&self) -> Vec<PodConfig> {
        let Some(base) = &self.base_name else {
            return vec![self.pod.clone()];
        };
        (0..self.pods)
            .map(|i| {
                let mut c = self.pod.clone();
                c.name = format!("{base}-{i}");
                if c.listen.port() != 0 {
                    c.listen.set_port(c.listen.port() + i as u16);
                }
                c
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Cli> {
        Cli::parse(s.split_whitespace().map(String::from).collect())
    }

    #[test]
    fn flags_and_multi_pod() {
        let c = parse(
            "--listen 127.0.0.1:9000 --pods 3 --base-name p --engine=sglang --lora-adapters a,b",
        )
        .unwrap();
        let pods = c.pod_configs();
        assert_eq!(pods.len(), 3);
        assert_eq!(pods[2].name, "p-2");
        assert_eq!(pods[2].listen.port(), 9002);
        assert_eq!(pods[0].engine, EngineKind::Sglang);
        assert_eq!(pods[0].lora_adapters, vec!["a", "b"]);
        assert!(parse("--bogus 1").is_err());
        assert!(parse("--max-running 0").is_err());
        assert_eq!(parse("--name x").unwrap().pod_configs()[0].name, "x");
        let slow = parse("--ttft-multiplier 3 --error-rate 0.2 --fault-seed 7").unwrap();
        assert_eq!(slow.pod.ttft_multiplier, 3.0);
        assert_eq!((slow.pod.error_rate, slow.pod.fault_seed), (0.2, 7));
        assert_eq!(slow.pod.error_fault, "status:500");
        let hangs = parse("--error-rate 1 --error-fault hang").unwrap();
        assert_eq!(hangs.pod.error_fault, "hang");
        let engine = parse(
            "--prefill-tokens-per-s 16000 --prefill-chunk-tokens 2048 --kv-admission --stream-interval 8",
        )
        .unwrap()
        .pod;
        assert_eq!(engine.prefill_tokens_per_s, 16000.0);
        assert_eq!(engine.prefill_chunk_tokens, 2048);
        assert!(engine.kv_admission);
        assert_eq!(engine.stream_interval, 8);
        let pd = parse("--role decode --dp-ranks 2 --engine trtllm --transfer-fails --kv-load-failure-policy recompute --link-bytes-per-s 1e6").unwrap().pod;
        assert_eq!(
            (pd.role, pd.dp_ranks, pd.engine),
            (Role::Decode, 2, EngineKind::TrtLlm)
        );
        assert!(pd.pd.transfer_fails);
        assert_eq!(
            pd.pd.load_failure_policy,
            crate::pd::LoadFailurePolicy::Recompute
        );
        assert_eq!(pd.pd.link_bytes_per_s, 1e6);
        for bad in [
            "--role both",
            "--dp-ranks 0",
            "--link-bytes-per-s 0",
            "--kv-load-failure-policy retry",
            "--stream-interval 0",
            "--prefill-tokens-per-s -1",
            "--ttft-multiplier 0.5",
            "--ttft-multiplier NaN",
            "--error-rate 1.5",
            "--error-fault sleep",
            "--error-fault status:99",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
