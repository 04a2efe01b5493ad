//! llm-d's predicted-latency ladder (the production-derived workload of llm-d's blog
//! "Predicted-Latency Based Scheduling for LLMs", 2026-03; docs/trace-bench.md "The SLO
//! section"): eight stages of 100 s alternating 1.0 and 5.0 requests/s, multi-turn chats
//! that each start with a 1,000-token system prompt, questions of 729 ± 13,550 tokens (at most
//! 131,072), answers of 300 ± 2,213 tokens (at most 8,192).
//!
//! It is built the way llm-d's load generator (inference-perf's shared-prefix generator in
//! multi-turn mode) builds it: users in groups, each group one system prompt that every
//! conversation of its users starts with (so a group's users share that prefix, as a
//! product's users share its system prompt), and request k of the Poisson arrivals is the
//! next turn of user k mod users. A turn waits for its user's previous answer (inference-perf
//! holds a session's next round until the last one is answered) and carries the whole
//! conversation so far. Two choices are ours, each said where it is made: the size
//! distributions (lognormal) and the context limit that starts a user's new conversation.

use super::gen::ladder;
use super::mooncake::scaled;
use super::text::{ns, Text};
use super::workload::{Conversation, Turn, Workload};
use ailb_fakepod::rng::{Dist, Rng};
use std::time::Duration;

/// A size distribution given, as llm-d gives it, by mean, standard deviation and maximum
/// (full-size tokens).
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    pub mean: f64,
    pub sd: f64,
    pub max: u64,
}

impl Sizes {
    /// The lognormal with this mean and standard deviation. A mean of 729 with a deviation of
    /// 13,550 cannot be a normal of positive sizes (its left half would be below zero); a
    /// lognormal keeps both moments, is the usual shape of production prompt and answer
    /// lengths, and puts the median far below the mean as such a deviation says (39 tokens for
    /// the questions, 40 for the answers).
    pub fn dist(&self) -> Dist {
        let cv2 = (self.sd / self.mean).powi(2);
        Dist::LogNormal {
            median: self.mean / (1.0 + cv2).sqrt(),
            sigma: (1.0 + cv2).ln().sqrt(),
        }
    }

    /// One draw, clamped to [1, max].
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        self.dist().sample(rng, 1, self.max)
    }
}

/// The ladder's shape at full size.
#[derive(Clone, Debug)]
pub struct LatencyLadder {
    /// Requests per second of each stage, in order.
    pub rates: Vec<f64>,
    pub stage: Duration,
    pub groups: u64,
    pub users_per_group: u64,
    pub system_tokens: u64,
    pub question: Sizes,
    pub output: Sizes,
    /// A conversation whose next prompt would pass this many tokens (the model's context) is
    /// over: the user starts a new one with the next question. inference-perf grows a session
    /// without bound; an engine refuses a prompt past its context, a chat client starts anew.
    pub max_context: u64,
}

impl Default for LatencyLadder {
    /// llm-d's figures; the stage length (100 s, the length of every load point of the same
    /// blog's other benchmarks) and the users (8 groups of 8) are ours: with 64 users a run's
    /// 2,400 requests make conversations of about 35 turns, whose later prompts are mostly
    /// history, so an unbounded cache would hold about 96 % of the prompt tokens (llm-d
    /// reports ~94 % at peak, "with frequent collapses": a fleet's KV holds only part of the
    /// users' histories, as the SLO section's does).
    fn default() -> Self {
        LatencyLadder {
            rates: [1.0, 5.0].repeat(4),
            stage: Duration::from_secs(100),
            groups: 8,
            users_per_group: 8,
            system_tokens: 1000,
            question: Sizes {
                mean: 729.0,
                sd: 13_550.0,
                max: 131_072,
            },
            output: Sizes {
                mean: 300.0,
                sd: 2_213.0,
                max: 8_192,
            },
            max_context: 131_072,
        }
    }
}

/// Block ids of the groups' system prompts: apart from every question's (conversation c's
/// turn t's blocks start at c << 32 | t << 16).
const SYSTEM_IDS: u64 = 1 << 62;

/// The ladder's requests, token counts × `token_scale`, seeded.
pub fn latency_ladder(shape: &LatencyLadder, token_scale: f64, seed: u64) -> Workload {
    let bt = scaled(512, token_scale);
    let stages: Vec<(f64, Duration)> = shape.rates.iter().map(|&r| (r, shape.stage)).collect();
    let (stages, arrivals) = ladder(&stages, seed);
    let mut rng = Rng::derive(seed, &[5]);
    let groups = shape.groups.max(1);
    let users = (groups * shape.users_per_group).max(1) as usize;
    let systems: Vec<Text> = (0..groups)
        .map(|g| {
            Text::blocks(
                ns::LATENCY_LADDER,
                SYSTEM_IDS | g << 20,
                scaled(shape.system_tokens, token_scale),
                bt,
            )
        })
        .collect();
    // Per user: its open conversation and that conversation's context (full-size tokens).
    let mut open: Vec<Option<(usize, u64)>> = vec![None; users];
    let mut conversations: Vec<Conversation> = Vec::new();
    for (k, (at, stage)) in arrivals.into_iter().enumerate() {
        let u = k % users;
        let question = shape.question.sample(&mut rng);
        let output = shape.output.sample(&mut rng);
        let (c, context) = match open[u] {
            Some((c, context)) if context + question <= shape.max_context => (c, context),
            _ => {
                conversations.push(Conversation {
                    start: at,
                    system: Some(systems[u % systems.len()].clone()),
                    turns: Vec::new(),
                    stage,
                });
                (conversations.len() - 1, shape.system_tokens)
            }
        };
        let conv = &mut conversations[c];
        let t = conv.turns.len() as u64;
        conv.turns.push(Turn {
            user: Text::blocks(
                ns::LATENCY_LADDER,
                (c as u64) << 32 | t << 16,
                scaled(question, token_scale),
                bt,
            ),
            output_tokens: scaled(output, token_scale),
            at: Some(at),
        });
        open[u] = Some((c, context + question + output));
    }
    Workload {
        name: "latency_ladder".into(),
        conversations,
        stages,
    }
}
