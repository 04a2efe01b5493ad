//! How long a flushed pod keeps being sent requests for prefixes it no longer holds.
//!
//! The plugin's `prefix_hit` reason means it matched at least one block of the prompt
//! (`blockChunkBytes`, 4,096 bytes: 1,024 tokens as the pods count) on the pod it chose; a pod
//! answering with fewer than half that many cached tokens was the wrong pod for it. The normal
//! rate is the flushed pod's share of such answers before the flush; the figure is the number
//! of requests the pod received after the flush until a window of 20 of them is back within 5
//! points of that rate. The plugin reads each answer's `cached_tokens` (`verifyCachedTokens`,
//! on by default; docs/redis-data-model.md §5 "Engine-verified keys"): the first answers of
//! the flushed pod that come back with under half their predicted prefix bump its generation,
//! so its older prefix keys stop matching and its conversations are placed afresh. The figure
//! is therefore about the requests already in flight at the flush, plus those that reached
//! the pod before the first short answer returned.

use super::run::Run;
use ailb_bench::trace::replay::Record;
use std::time::Duration;

const WINDOW: usize = 20;
/// Half of one 4,096-byte plugin block, in the pods' tokens (4 bytes each).
const SHORT_TOKENS: u64 = 512;

fn wrong(r: &Record) -> bool {
    r.reason.as_deref() == Some("prefix_hit") && r.cached_tokens < SHORT_TOKENS
}

/// (requests until recovered or None, normal rate, requests the pod got after the flush, their
/// wrong-pod share).
pub fn recovery(run: &Run, pod: usize, flush_at: Duration) -> (Option<usize>, f64, usize, f64) {
    let on_pod: Vec<&Record> = run.ok().filter(|r| r.pod == Some(pod)).collect();
    let (before, after): (Vec<&Record>, Vec<&Record>) =
        on_pod.into_iter().partition(|r| r.at < flush_at);
    let rate =
        |rs: &[&Record]| rs.iter().filter(|r| wrong(r)).count() as f64 / rs.len().max(1) as f64;
    let normal = rate(&before);
    let back = (0..after.len().saturating_sub(WINDOW - 1))
        .find(|&k| rate(&after[k..k + WINDOW]) <= normal + 0.05);
    (back, normal, after.len(), rate(&after))
}
