//! The calls that give back or correct what a pick wrote: a lease's release (with what the
//! request's outcome teaches failure memory), prefix_cache's batched first bytes, and a pod's
//! generation bump (docs/redis-data-model.md §5, §6, §13, §14).

use super::{call, Keys, Script, Scripts, MOVED, PREFIX_FORGET};
use crate::config::Ejection;

/// The least time between two generation bumps of one pod (prefix_forget.lua).
pub const FORGET_INTERVAL_MS: u64 = 5_000;

/// `EVAL` of prefix_forget.lua: `endpoint`'s generation bumped, `chain` re-written at the new
/// one. Sent as EVAL (text, not SHA): it is rare, and a lost script needs no second round.
pub fn forget_call(
    keys: &Keys,
    chain: &[String],
    endpoint: &str,
    ttl_s: u64,
    now_ms: u64,
) -> Vec<u8> {
    let mut all_keys: Vec<&str> = vec![&keys.gen];
    all_keys.extend(chain.iter().map(String::as_str));
    let (ttl, now, interval) = (
        ttl_s.to_string(),
        now_ms.to_string(),
        FORGET_INTERVAL_MS.to_string(),
    );
    let forget = Script::eval(PREFIX_FORGET);
    let args: [&[u8]; 4] = [
        endpoint.as_bytes(),
        ttl.as_bytes(),
        now.as_bytes(),
        interval.as_bytes(),
    ];
    call(&forget, false, &all_keys, &args)
}

/// What a release teaches about its lease's endpoint (release.lua's ARGV[1]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Learned {
    /// An answer that is not a 5xx (a 4xx is the client's): its failures in a row end.
    Answered,
    /// A 5xx.
    Failed,
    /// No answer came through the lease (a failed publish, an orphan, a lost reply).
    Nothing,
}

/// A release of the first present lease among `members`, with what the request's outcome
/// teaches at `now_ms` under `ejection`. `booked`: the leases may hold prefill bookings
/// (prefix_cache), given back with them.
pub fn release_call(
    (scripts, by_sha): (&Scripts, bool),
    keys: &Keys,
    members: &[String],
    booked: bool,
    (learned, now_ms, ejection): (Learned, u64, &Ejection),
) -> Vec<u8> {
    let outcome = match learned {
        Learned::Answered => "s",
        Learned::Failed => "f",
        Learned::Nothing => "-",
    };
    let figures = learning(now_ms, ejection);
    let mut args: Vec<&[u8]> = vec![outcome.as_bytes()];
    args.extend(figures.iter().map(|s| s.as_bytes()));
    args.extend(members.iter().map(|m| m.as_bytes()));
    call(
        &scripts.release,
        by_sha,
        &endpoint_keys(keys, booked),
        &args,
    )
}

/// `EVAL` of moved.lua: lease `member`, whose endpoint failed, moved to `to`, the endpoint the
/// host's retry answered from, until `expiry_ms`; the failure learned at `now_ms` under
/// `ejection`. Sent as EVAL (text, not SHA): it is rare (a retry), and a flushed script cache
/// needs no second round.
pub fn moved_call(
    keys: &Keys,
    (member, to): (&str, &str),
    booked: bool,
    (now_ms, expiry_ms, ejection): (u64, u64, &Ejection),
) -> Vec<u8> {
    let figures = learning(now_ms, ejection);
    let expiry = expiry_ms.to_string();
    let mut args: Vec<&[u8]> = figures.iter().map(|s| s.as_bytes()).collect();
    args.extend([member.as_bytes(), to.as_bytes(), expiry.as_bytes()]);
    let moved = Script::eval(MOVED);
    call(&moved, false, &endpoint_keys(keys, booked), &args)
}

/// What release.lua and moved.lua learn with, in their order: now, then the route's failure
/// memory (failures in a row that eject, first and longest ejection, most ejected percent,
/// a failed count's hold).
fn learning(now_ms: u64, ejection: &Ejection) -> [String; 6] {
    [
        now_ms.to_string(),
        ejection.eject_after.to_string(),
        ejection.ejection_ms.to_string(),
        ejection.max_ejection_ms.to_string(),
        ejection.max_ejected_percent.to_string(),
        ejection.failure_penalty_ms.to_string(),
    ]
}

/// The keys release.lua and moved.lua take: the lease's, failure memory's and, for a
/// prefix_cache route (`booked`), its prefill bookings'.
fn endpoint_keys(keys: &Keys, booked: bool) -> Vec<&str> {
    let mut all = vec![
        keys.load.as_str(),
        &keys.leases,
        &keys.tenants,
        &keys.health,
        &keys.ejected,
    ];
    if booked {
        all.extend([keys.prefill.as_str(), &keys.booked]);
    }
    all
}

/// First bytes of a route's prefix_cache requests: `done` holds (lease id, endpoint, rate
/// sample in tokens/s, 0 = none) triples (prefill_done.lua).
pub fn prefill_done_call(scripts: &Scripts, by_sha: bool, keys: &Keys, done: &[String]) -> Vec<u8> {
    let args: Vec<&[u8]> = done.iter().map(|m| m.as_bytes()).collect();
    call(
        &scripts.prefill_done,
        by_sha,
        &[&keys.prefill, &keys.booked, &keys.rates],
        &args,
    )
}
