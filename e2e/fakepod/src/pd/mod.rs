//! Disaggregated prefill/decode roles of a fake pod (issue 49 item 6). The protocols are the
//! engines' own, as docs/disaggregated-serving.md reads them from their code:
//!
//! * vLLM NixlConnector (§1): a prefill pod given `kv_transfer_params.do_remote_decode` answers
//!   with top-level `kv_transfer_params` naming its blocks; a decode pod given them pulls the
//!   blocks instead of prefilling.
//! * TensorRT-LLM (§2): `disaggregated_params.request_type` `context_only` / `generation_only`,
//!   the context answer's parameters per choice.
//! * SGLang (§4): both pods get `bootstrap_host` / `bootstrap_port` / `bootstrap_room` at once;
//!   the decode pod waits for the prefill pod's KV of that room.
//!
//! The decode side waits a transfer time (tokens × `kv_bytes_per_token` ÷ `link_bytes_per_s`,
//! §6) instead of prefilling; the KV moves through a [`fabric::Fabric`] the pods share.

pub mod decode;
pub mod fabric;
pub mod flags;
pub mod prefill;
pub mod request;
pub mod stats;
pub mod trtllm;

use fabric::Fabric;
use stats::PdCounters;
use std::sync::Arc;
use std::time::Duration;

/// What a pod does in a disaggregated deployment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Role {
    /// Prefill and decode on one pod: today's behaviour, P/D parameters ignored.
    #[default]
    Colocated,
    /// Prefills for a decode pod and offers the KV.
    Prefill,
    /// Decodes with KV pulled from a prefill pod (or prefills itself without one).
    Decode,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Colocated => "colocated",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

/// What a decode pod does when it cannot pull the KV: vLLM's
/// `kv_transfer_config.kv_load_failure_policy` (§1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadFailurePolicy {
    /// Prefill the prompt here after all.
    Recompute,
    /// Fail the request with an error.
    Fail,
}

/// P/D settings of a pod (inert for a colocated pod).
#[derive(Clone, Debug)]
pub struct PdConfig {
    /// KV bytes per prompt token. Default: Llama-3.1-8B in BF16, 2 (K, V) × 32 layers × 8 KV
    /// heads × 128 head dim × 2 bytes = 131,072 (docs/disaggregated-serving.md §6).
    pub kv_bytes_per_token: u64,
    /// Bytes per second the KV moves at. Default: 100 GbE RoCE as nixlbench measured it,
    /// 12.0–12.2 GB/s (llm-d blog 2026-06-23, §6).
    pub link_bytes_per_s: f64,
    /// Every pull fails (a decode pod that cannot reach its prefill pods).
    pub transfer_fails: bool,
    /// Default `fail`, vLLM's default since PR #34896 (§1) and what SGLang and TensorRT-LLM
    /// do anyway (neither recomputes on the decode side; unverified for both).
    pub load_failure_policy: LoadFailurePolicy,
    /// How long a prefill pod holds unread blocks: vLLM `VLLM_NIXL_ABORT_REQUEST_TIMEOUT`,
    /// 480 s by default (§1).
    pub pin_timeout_us: u64,
    /// SGLang `--disaggregation-bootstrap-port` of a prefill pod, 8998 by default (§4).
    pub bootstrap_port: u16,
    /// How long an SGLang decode pod waits for its room's KV before failing the request.
    /// SGLang's own limit is an environment setting whose default we did not check; 300 s is
    /// a guess (unverified).
    pub bootstrap_timeout_us: u64,
    /// Where pods meet to move KV; pods built from one config share it.
    pub fabric: Fabric,
}

impl Default for PdConfig {
    fn default() -> Self {
        Self {
            kv_bytes_per_token: 131_072,
            link_bytes_per_s: 12.1e9,
            transfer_fails: false,
            load_failure_policy: LoadFailurePolicy::Fail,
            pin_timeout_us: 480_000_000,
            bootstrap_port: 8998,
            bootstrap_timeout_us: 300_000_000,
            fabric: Fabric::new(),
        }
    }
}

impl PdConfig {
    /// Time to move the KV of `tokens` prompt tokens (§6, line rate; no per-transfer
    /// overhead).
    pub fn transfer_time(&self, tokens: u64) -> Duration {
        let secs = tokens as f64 * self.kv_bytes_per_token as f64 / self.link_bytes_per_s.max(1.0);
        Duration::from_secs_f64(secs.max(0.0))
    }
}

/// One rank's identity and counters on the P/D side.
#[derive(Debug)]
pub struct RankPd {
    pub rank: usize,
    pub role: Role,
    pub cfg: PdConfig,
    /// vLLM `remote_engine_id`: the pod's name, `_dp<rank>` appended when the pod has several
    /// ranks (vLLM uses a uuid4 plus that suffix, §1, §5).
    pub engine_id: String,
    /// `remote_host`, and `remote_port` = the pod's port + rank (vLLM's side channel port +
    /// DP index, §5).
    pub host: String,
    pub port: u16,
    pub counters: Arc<PdCounters>,
}

impl RankPd {
    pub fn new(
        name: &str,
        role: Role,
        cfg: PdConfig,
        addr: std::net::SocketAddr,
        rank: usize,
        ranks: usize,
    ) -> Self {
        Self {
            rank,
            role,
            cfg,
            engine_id: if ranks > 1 {
                format!("{name}_dp{rank}")
            } else {
                name.to_string()
            },
            host: addr.ip().to_string(),
            port: addr.port().wrapping_add(rank as u16),
            counters: Arc::new(PdCounters::default()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_transfer_time_is_the_published_line_rate() {
        // 1,000 Llama-3.1-8B tokens (131 MB) at 12.1 GB/s: about 10.8 ms (§6).
        let t = PdConfig::default().transfer_time(1_000);
        assert!((t.as_secs_f64() - 0.010_832).abs() < 1e-5, "{t:?}");
        let addr = std::net::SocketAddr::from(([10, 0, 0, 1], 8000));
        let r = RankPd::new("p", Role::Prefill, PdConfig::default(), addr, 3, 4);
        assert_eq!(
            (r.engine_id.as_str(), r.host.as_str(), r.port),
            ("p_dp3", "10.0.0.1", 8003)
        );
        let one = RankPd::new("p", Role::Prefill, PdConfig::default(), addr, 0, 1);
        assert_eq!((one.engine_id.as_str(), one.port), ("p", 8000));
    }
}
