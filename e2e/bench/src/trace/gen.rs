//! Synthetic workloads with llm-d's published shapes (docs/trace-bench.md "Workloads"), offered
//! as a ladder of Poisson stages (llm-d's benchmarks step their rate the same way).
//!
//! * b2b-saas: 150 groups, each a 6,000-token shared prefix and 5 users with a 1,200-token
//!   question each, 1,000-token outputs; a request is a random (group, user) pair, its prompt
//!   one user message (prefix then question). The distinct prompts hold 150 × 6,000 +
//!   750 × 1,200 = 1.8 M tokens, 73 % of the 8 × 307,328 tokens of KV of llm-d's setup.
//! * code generation: a conversation has its own system prompt (3k-100k tokens), 2-20 turns of
//!   100-10k input tokens and 50-4k output tokens; each turn follows the previous answer.

use super::mooncake::scaled;
use super::text::{ns, Text};
use super::workload::{Conversation, Stage, Turn, Workload};
use ailb_fakepod::rng::Rng;
use std::time::Duration;

/// b2b-saas shape at full size.
#[derive(Clone, Copy, Debug)]
pub struct B2b {
    pub groups: u64,
    pub users_per_group: u64,
    pub prefix_tokens: u64,
    pub question_tokens: u64,
    pub output_tokens: u64,
}

impl Default for B2b {
    fn default() -> Self {
        B2b {
            groups: 150,
            users_per_group: 5,
            prefix_tokens: 6000,
            question_tokens: 1200,
            output_tokens: 1000,
        }
    }
}

/// Poisson arrivals over `stages` (rate per second, trace-time length each), back to back.
pub(super) fn ladder(
    stages: &[(f64, Duration)],
    seed: u64,
) -> (Vec<Stage>, Vec<(Duration, usize)>) {
    let mut rng = Rng::derive(seed, &[0]);
    let (mut out, mut arrivals, mut t0) = (Vec::new(), Vec::new(), Duration::ZERO);
    for (i, &(rate, len)) in stages.iter().enumerate() {
        let end = t0 + len;
        let mut t = t0.as_secs_f64();
        loop {
            t += rng.exp(rate);
            if t >= end.as_secs_f64() {
                break;
            }
            arrivals.push((Duration::from_secs_f64(t), i));
        }
        out.push(Stage {
            rate,
            start: t0,
            end,
        });
        t0 = end;
    }
    (out, arrivals)
}

/// b2b-saas requests over `stages` (requests per second), token counts × `token_scale`,
/// blocks of `block_tokens` (scaled).
pub fn b2b(shape: B2b, stages: &[(f64, Duration)], token_scale: f64, seed: u64) -> Workload {
    let bt = scaled(512, token_scale);
    let (stages, arrivals) = ladder(stages, seed);
    let mut rng = Rng::derive(seed, &[1]);
    // Ids: group g's prefix blocks from g << 20, user u's question blocks from (g, u) << 20.
    let conversations = arrivals
        .into_iter()
        .map(|(start, stage)| {
            let g = rng.below(shape.groups);
            let u = rng.below(shape.users_per_group);
            let prefix = Text::blocks(
                ns::B2B,
                g << 20,
                scaled(shape.prefix_tokens, token_scale),
                bt,
            );
            let question = Text::blocks(
                ns::B2B,
                (shape.groups + g * shape.users_per_group + u) << 20,
                scaled(shape.question_tokens, token_scale),
                bt,
            );
            Conversation {
                start,
                system: None,
                turns: vec![Turn {
                    user: prefix.then(&question),
                    output_tokens: scaled(shape.output_tokens, token_scale),
                    at: None,
                }],
                stage,
            }
        })
        .collect();
    Workload {
        name: "b2b".into(),
        conversations,
        stages,
    }
}

/// Log-uniform integer in [lo, hi].
fn log_uniform(rng: &mut Rng, lo: u64, hi: u64) -> u64 {
    let (a, b) = ((lo as f64).ln(), (hi as f64).ln());
    (a + (b - a) * rng.f64()).exp().round() as u64
}

/// Code-generation conversations starting over `stages` (conversations per second): system
/// prompt uniform in 3k-100k tokens, 2 + an exponential number of turns (mean 6, at most 20),
/// inputs log-uniform in 100-10k, outputs log-uniform in 50-4k tokens; all × `token_scale`.
pub fn codegen(stages: &[(f64, Duration)], token_scale: f64, seed: u64) -> Workload {
    let bt = scaled(512, token_scale);
    let (stages, arrivals) = ladder(stages, seed);
    let mut rng = Rng::derive(seed, &[2]);
    let conversations = arrivals
        .into_iter()
        .enumerate()
        .map(|(c, (start, stage))| {
            let c = c as u64;
            let system = 3_000 + rng.below(97_001);
            let turns = (2 + rng.exp(1.0 / 4.0).floor() as u64).min(20);
            let turns = (0..turns)
                .map(|t| Turn {
                    user: Text::blocks(
                        ns::CODEGEN,
                        (c << 24) | ((t + 1) << 16),
                        scaled(log_uniform(&mut rng, 100, 10_000), token_scale),
                        bt,
                    ),
                    output_tokens: scaled(log_uniform(&mut rng, 50, 4_000), token_scale),
                    at: None,
                })
                .collect();
            Conversation {
                start,
                system: Some(Text::blocks(
                    ns::CODEGEN,
                    c << 24,
                    scaled(system, token_scale),
                    bt,
                )),
                turns,
                stage,
            }
        })
        .collect();
    Workload {
        name: "codegen".into(),
        conversations,
        stages,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_and_stages() {
        let stages = [
            (10.0, Duration::from_secs(60)),
            (20.0, Duration::from_secs(60)),
        ];
        let w = b2b(B2b::default(), &stages, 1.0, 7);
        let n0 = w.conversations.iter().filter(|c| c.stage == 0).count();
        assert!((450..750).contains(&n0), "{n0}");
        assert!(w.conversations.len() > 2 * n0 - 200);
        assert_eq!(w.conversations[0].turns[0].user.tokens(), 7200);
        assert_eq!(w.stages[1].start, Duration::from_secs(60));
        let c = codegen(&[(1.0, Duration::from_secs(200))], 1.0, 7);
        let mean_turns = c.conversations.iter().map(|c| c.turns.len()).sum::<usize>() as f64
            / c.conversations.len() as f64;
        assert!((4.5..7.5).contains(&mean_turns), "{mean_turns}");
        assert!(c
            .conversations
            .iter()
            .all(|c| (3_000..=100_000).contains(&c.system.as_ref().unwrap().tokens())));
    }
}
