//! The fleet of engine-like fake pods and the cost model they run (docs/trace-bench.md "Cost
//! model" states each figure and its source), and the one scaling of time and tokens.

use ailb_e2e::bed::Bed;
use ailb_fakepod::PodConfig;

/// An engine's costs at full size, trace time.
#[derive(Clone, Copy, Debug)]
pub struct Cost {
    /// Prefill tokens per second of the fleet's two speeds (half the pods each).
    pub fast_tps: f64,
    pub slow_tps: f64,
    /// KV capacity per pod, tokens.
    pub kv_tokens: u64,
    /// Prefill tokens per forward pass (vLLM `max_num_batched_tokens`).
    pub chunk_tokens: u64,
    /// Decode step with one running request on a fast pod, and its slowdown per extra
    /// running request.
    pub decode_ms: f64,
    pub batch_penalty: f64,
    /// A slow pod's decode step over a fast one's.
    pub slow_decode: f64,
}

/// llm-d's b2b setup: Qwen3-32B on 8 × 2 H100 (TP=2), calibrated prefill 15,928 tokens/s, KV
/// 307,328 tokens per pod, ITL 44-47 ms under load (a 25 ms step growing 1 % per extra running
/// request is 45 ms at 80); prefill chunks of 2,048 tokens, which at 16k tokens/s make the
/// 128 ms per token llm-d measured on its prefill-saturated round-robin arm (NTPOT 135 ms).
pub const LLMD_H100: Cost = Cost {
    fast_tps: 20_000.0,
    slow_tps: 16_000.0,
    kv_tokens: 307_328,
    chunk_tokens: 2048,
    decode_ms: 25.0,
    batch_penalty: 0.01,
    slow_decode: 1.0,
};

/// The same pods with prefill four times cheaper (a smaller model or faster GPUs): a result
/// that holds only because prefill is dear shows here.
pub const CHEAP_PREFILL: Cost = Cost {
    fast_tps: 80_000.0,
    slow_tps: 64_000.0,
    ..LLMD_H100
};

/// vLLM's KV block, tokens.
const ENGINE_BLOCK_TOKENS: f64 = 16.0;

/// Trace time runs `time` times faster; every token count (prompts, outputs, KV, block size,
/// prefill rate per token) is multiplied by `tokens`, and a decode step lasts 1/`tokens` as
/// long per (scaled) token, so every time and every ratio of sizes is the same as at full size.
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    pub time: f64,
    pub tokens: f64,
}

impl Cost {
    /// Prefill rate of pod `i` of `n`, scaled tokens per trace second.
    pub fn rate(&self, i: usize, n: usize, s: Scale) -> f64 {
        let tps = if Self::fast(i, n) {
            self.fast_tps
        } else {
            self.slow_tps
        };
        tps * s.tokens
    }

    /// The first half of a fleet are the fast pods.
    fn fast(i: usize, n: usize) -> bool {
        i < n.div_ceil(2)
    }

    /// Decode step of pod `i` of `n` with one running request, ms of trace time per token at
    /// full size.
    pub fn decode_step_ms(&self, i: usize, n: usize) -> f64 {
        if Self::fast(i, n) {
            self.decode_ms
        } else {
            self.decode_ms * self.slow_decode
        }
    }

    /// The fleet's mean prefill rate, scaled tokens per trace second (what one calibration of
    /// `peakPrefillThroughput` would give a mixed fleet at best).
    pub fn mean_rate(&self, s: Scale) -> f64 {
        (self.fast_tps + self.slow_tps) / 2.0 * s.tokens
    }

    pub fn kv(&self, s: Scale) -> u64 {
        (self.kv_tokens as f64 * s.tokens) as u64
    }

    pub fn block_tokens(s: Scale) -> usize {
        (ENGINE_BLOCK_TOKENS * s.tokens).round().max(1.0) as usize
    }

    /// Pod `i` of `n` in wall time.
    pub fn tune(&self, c: &mut PodConfig, i: usize, n: usize, s: Scale) {
        c.block_tokens = Self::block_tokens(s);
        c.kv_capacity_tokens = self.kv(s);
        c.cache_blocks = c.kv_capacity_tokens as usize / c.block_tokens;
        c.kv_admission = true;
        c.prefill_tokens_per_s = self.rate(i, n, s) * s.time;
        c.prefill_chunk_tokens = ((self.chunk_tokens as f64 * s.tokens) as u64).max(1);
        c.decode_us_per_token =
            (self.decode_step_ms(i, n) * 1000.0 / s.tokens / s.time).round() as u64;
        c.decode_batch_penalty = self.batch_penalty;
        // vLLM's default max_num_seqs; the KV is the usual bound.
        c.max_running = 256;
        c.max_output_tokens = 1 << 20;
        // Fewer events through the gateway for long answers; the first token leaves alone.
        c.stream_interval = 8;
    }

    /// A bed of `n` such pods (named pod-0..; the first half the fast ones).
    pub fn bed(&self, n: usize, s: Scale) -> Bed {
        let cost = *self;
        let next = std::sync::atomic::AtomicUsize::new(0);
        Bed::new(n, |c| {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            cost.tune(c, i, n, s)
        })
    }
}

impl Cost {
    /// `n` pods of `ranks` data-parallel ranks each behind one port (fakepod `--dp-ranks`).
    /// Every rank has this cost's per-pod figures (its own KV, prefill lane and decode batch):
    /// a DP rank of vLLM is a whole engine copy on GPUs of its own, so 2 pods × 4 ranks of
    /// llm-d's TP=2 H100 engines are the 16 GPUs of the trace fleet's 8 pods. Pod `i` of `n` is
    /// fast or slow as in [`Cost::bed`], all its ranks alike.
    pub fn dp_bed(&self, n: usize, ranks: usize, s: Scale) -> Bed {
        let cost = *self;
        let next = std::sync::atomic::AtomicUsize::new(0);
        Bed::new(n, |c| {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            cost.tune(c, i, n, s);
            c.dp_ranks = ranks;
        })
    }
}

/// The SLO section's fleet: two GPU speeds, the slow half with half the fast half's prefill
/// rate and a decode step 1.5 × as long — an A100 beside an H100 on the same model, read
/// conservatively from the datasheets (dense BF16 989 vs 312 TFLOPS bounds prefill, HBM 3.35
/// vs 2.0 TB/s bounds decode; measured gaps are smaller than the compute ratio). The fast
/// half keeps the trace fleet's H100 costs.
pub const TWO_GPU_SPEEDS: Cost = Cost {
    fast_tps: 20_000.0,
    slow_tps: 10_000.0,
    slow_decode: 1.5,
    ..LLMD_H100
};

impl Cost {
    /// The same fleet with every pod alike: the mean prefill rate (the same total), and the
    /// harmonic mean of the decode steps (the same decode tokens per second for a running
    /// request spread evenly).
    pub fn uniform(&self) -> Cost {
        let tps = (self.fast_tps + self.slow_tps) / 2.0;
        let slow = self.decode_ms * self.slow_decode;
        Cost {
            fast_tps: tps,
            slow_tps: tps,
            decode_ms: 2.0 / (1.0 / self.decode_ms + 1.0 / slow),
            slow_decode: 1.0,
            ..*self
        }
    }
}
