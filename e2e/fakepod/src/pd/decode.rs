//! The decode side: pull the KV a prefill pod offered, taking the transfer time instead of the
//! prefill (docs/disaggregated-serving.md §1, §4, §6).

use super::fabric::Pinned;
use super::request::Pull;
use super::stats::PdCounters;
use super::{LoadFailurePolicy, RankPd};
use crate::engine::{Engine, Job, Running};
use std::sync::Arc;
use std::time::Duration;

/// Why a pull failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullError {
    /// SGLang: the room's KV never appeared (always an error, whatever the policy).
    Timeout,
    /// The KV could not be read: `kv_load_failure_policy` decides.
    Failed(String),
}

/// Pulls the KV `pull` names and waits the time `tokens` (the prompt tokens the decode rank
/// does not hold itself: vLLM pulls `len(prompt) - num_computed_tokens`, §1) take to move.
pub async fn pull(rank: &RankPd, pull: &Pull, tokens: u64) -> Result<Pinned, PullError> {
    let c = &rank.counters;
    let fabric = &rank.cfg.fabric;
    let got = if pull.wait {
        let limit = Duration::from_micros(rank.cfg.bootstrap_timeout_us);
        match fabric.take_within(&pull.key, limit).await {
            Some(p) => p,
            None => {
                PdCounters::bump(&c.room_timeouts, 1);
                return Err(PullError::Timeout);
            }
        }
    } else {
        match fabric.peek(&pull.key) {
            // The named prefill rank is not reachable from here, or let the blocks go.
            None => {
                return Err(fail(
                    c,
                    format!("no KV offered by {} for {}", pull.key.0, pull.key.1),
                ))
            }
            Some(p) if (p.host.as_str(), p.port) != (pull.host.as_str(), pull.port) => {
                return Err(fail(
                    c,
                    format!("{} is not at {}:{}", pull.key.0, pull.host, pull.port),
                ))
            }
            // A failing link leaves the blocks pinned on P until its timeout, as a failed NIXL
            // read does.
            Some(_) if rank.cfg.transfer_fails => return Err(fail(c, "KV transfer failed".into())),
            Some(_) => match fabric.take(&pull.key) {
                Some(p) => p,
                None => return Err(fail(c, "KV released before it was read".into())),
            },
        }
    };
    if pull.wait && rank.cfg.transfer_fails {
        return Err(fail(c, "KV transfer failed".into()));
    }
    tokio::time::sleep(rank.cfg.transfer_time(tokens)).await;
    PdCounters::bump(&c.transfers_received, 1);
    PdCounters::bump(&c.tokens_transferred, tokens);
    Ok(got)
}

fn fail(c: &PdCounters, why: String) -> PullError {
    PdCounters::bump(&c.load_failures, 1);
    PullError::Failed(why)
}

/// A decode rank's prefill when the request carries a prefill pod's parameters: admitted as
/// any request, its own cached prefix looked up, the rest pulled (no prefill lane: the pull
/// runs beside the rank's prefills, as vLLM's async NIXL read does) and then cached. A failed
/// pull is recomputed here or fails the request (`Err`: the error message) by the policy.
pub async fn prefill_pulled(
    engine: &Arc<Engine>,
    job: &Job,
    hashes: &[u64],
    rank: &RankPd,
    req: &Pull,
) -> Result<Running, String> {
    let mut run = engine.admit(job).await;
    if engine.lane().is_some() {
        // With a lane the lookup is left to the lane's head; this request never gets there.
        run.hit_tokens = engine.lookup(job);
    }
    let uncached = job.prompt_tokens - run.hit_tokens;
    match pull(rank, req, uncached).await {
        Ok(_) => {}
        Err(PullError::Failed(_))
            if rank.cfg.load_failure_policy == LoadFailurePolicy::Recompute =>
        {
            match engine.lane() {
                Some(lane) => lane.enter(uncached).await.prefill(uncached).await,
                None => {
                    let us = engine.cfg.prefill_us_per_token * uncached;
                    tokio::time::sleep(Duration::from_micros(us)).await;
                }
            }
        }
        Err(e) => {
            PdCounters::bump(&rank.counters.failed_requests, 1);
            return Err(match e {
                PullError::Timeout => format!(
                    "KV of bootstrap room {} never arrived from {}",
                    req.key.1, req.key.0
                ),
                PullError::Failed(why) => format!("KV load failed: {why}"),
            });
        }
    }
    run.commit_prompt(hashes);
    Ok(run)
}
