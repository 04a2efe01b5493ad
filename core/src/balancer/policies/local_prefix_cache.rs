//! prefix_cache in the plain-Envoy build (docs/redis-data-model.md §9). There is no Redis host
//! call there, so:
//! - the prefix index is per proxy, in shared data (prefix/local_index.rs): each request's
//!   conversation keys (its anchor and deepest keys) → the endpoint it was sent to;
//! - a request whose conversation the index does not know goes where consistent hashing with
//!   bounded loads puts its anchor key (prefix/chwbl.rs). Every proxy computes the same, so
//!   replicas that share nothing send a conversation to the same pod while it is within the
//!   bound;
//! - the load is this proxy's in-flight load, counted by local least-request's own path
//!   (`local_least_request::take`: the same record, the same `costMode` weight) and held as a
//!   `Hold::Local` lease: stream end gives it back on the existing path;
//! - with a metrics guard configured (`scrapeCluster`), the scraped engine metrics count too: a
//!   pod whose queue or KV cache is saturated is left, and not chosen while another pod is not;
//! - a request naming a session (`sessionHeader`, ...) goes to the first endpoint of its session
//!   id's walk over the same ring, ahead of any prefix match, unless that pod is over the guard
//!   (then it is placed as without a session, past that pod: `session_rebound`;
//!   docs/redis-data-model.md §10).
//!
//! A body that is not a usable prompt (or too large to read) gets a plain-Envoy least-request
//! pick.

use super::endpoint_metrics::EndpointMetrics;
use super::input::{priority_class, Env, Input};
use super::local_least_request;
use crate::balancer::pick::{class_cap, cost_of};
use crate::balancer::request::{Decision, PromptRead};
use crate::balancer::shared;
use crate::balancer::telemetry::Telemetry;
use crate::config::{PrefixSettings, RouteConfig};
use crate::hash;
use crate::host::{Host, LogLevel};
use crate::prefix::chwbl::{self, Bound, Ring};
use crate::prefix::local_index::{self, Layout, Shard};
use crate::prefix::{anchor_of, canonicalize, PrefixKey};
use crate::reason::{Cause, Reason};
use crate::stats::Counter;
use std::rc::Rc;

/// A request reads and records at most this many of its deepest keys, plus its anchor: a
/// conversation's next turn matches within its last few blocks, and a long new prompt must not
/// touch hundreds of records.
pub const WINDOW: usize = 32;
/// The most fallbacks a route publishes (`fallbackCount` ≤ 16).
const MAX_FALLBACKS: usize = 16;

/// One route config's plain-Envoy prefix state, built at configure.
#[derive(Debug)]
pub struct LocalPrefix {
    /// Shared-data name of the index; its records are `<base>.<shard>`.
    base: String,
    layout: Layout,
    ring: Ring,
    /// Each endpoint's tag in index entries, by position in the route's `endpoints`.
    tags: Vec<u32>,
    counts_key: Rc<str>,
    ttl_ms: u64,
    /// CHWBL's bound, and the hit guard: both from `affinityMaxImbalanceRatio` (factor) and
    /// `affinityMaxImbalance` (slack), docs/redis-data-model.md §9.
    bound: Bound,
}

/// The deepest key of a request the index knows: its position in the chain, and the endpoint.
#[derive(Debug, Clone, Copy)]
struct Known {
    depth: usize,
    endpoint: usize,
}

impl LocalPrefix {
    /// `position`: the config's place among the plugin's route configs (global first), so each
    /// route keeps its own index. The name does not depend on the endpoint list: after a change
    /// the entries of the endpoints that stayed still apply.
    pub fn new(position: usize, config: &RouteConfig, settings: &PrefixSettings) -> LocalPrefix {
        let layout = Layout::new(settings.index_max_entries);
        let identity = format!(
            "{position}\n{}\n{}",
            config.common.key_prefix,
            layout.shards()
        );
        let base = format!(
            "ailb.px.{:016x}",
            hash::fnv1a(hash::FNV_OFFSET, identity.as_bytes())
        );
        LocalPrefix {
            base,
            layout,
            ring: Ring::new(&config.endpoints),
            tags: config
                .endpoints
                .iter()
                .map(|e| local_index::endpoint_tag(e))
                .collect(),
            counts_key: local_least_request::counts_key(&config.endpoints),
            ttl_ms: settings.ttl_s.saturating_mul(1000),
            bound: Bound {
                factor: settings.max_imbalance_ratio,
                slack: settings.max_imbalance,
            },
        }
    }
}

pub fn decide(
    host: &mut dyn Host,
    env: Env,
    input: &Input,
    settings: &PrefixSettings,
    state: &LocalPrefix,
    metrics: &mut EndpointMetrics,
) -> Decision {
    let endpoints = &input.config.endpoints;
    if endpoints.is_empty() {
        return Decision::Fallback(Cause::NoHealthyEndpoint);
    }
    // A waiting request's retry decides with what its first decision read (the held body is
    // not readable outside its callback).
    let read = match input.read {
        Some(read) => read.clone(),
        None if input.read_body => match read_prompt(host, env.tel, input, settings) {
            Some(read) => Rc::new(read),
            None => return local_least_request::decide(host, env, input, Some(&state.ring)),
        },
        None => return local_least_request::decide(host, env, input, Some(&state.ring)),
    };
    let (keys, at) = (&read.keys, read.anchor);
    let Some(&home) = keys.get(at) else {
        return local_least_request::decide(host, env, input, Some(&state.ring));
    };
    let home = u64::from_le_bytes(home);
    let window = window(keys.len(), at);
    let now = host.now_ms();
    let known = state.lookup(host, keys, &window, now);
    let hot = match &settings.guard {
        Some(mc) => metrics.saturated(host, input.config, mc),
        None => Vec::new(),
    };
    let session = read
        .session
        .as_ref()
        .and_then(|id| state.ring.walk(super::session::ring_key(id)).next());
    let class = priority_class(host, env.tel, input.config);
    let cap = class_cap(input.config, class);
    let cost = cost_of(input.config, input.body_bytes);
    let admission = local_least_request::Admission::of(host, input.config, class);
    let above = local_least_request::waiting_above(host, input, class);
    // A session route also passes over the pods marked down (Envoy answered one of its
    // requests from a fallback: README "Sessions"), as over saturated ones.
    let down_at = input.config.session.as_ref().map(|_| admission.now_ms);
    let taken = local_least_request::take(
        host,
        &state.counts_key,
        endpoints,
        cost,
        &admission,
        down_at,
        |loads, down| {
            if crate::balancer::waiters::outranked(loads, cap, admission.pool_cap, cost, above) {
                return None;
            }
            let merged: Vec<bool>;
            let hot: &[bool] = if down.is_empty() {
                &hot
            } else {
                merged = (0..endpoints.len())
                    .map(|e| {
                        hot.get(e).copied().unwrap_or(false)
                            || down.get(e).copied().unwrap_or(false)
                    })
                    .collect();
                &merged
            };
            state
                .choose(loads, cost, cap, hot, known, home, session)
                .map(|(e, reason, passed)| (e, (reason, passed)))
        },
    );
    match taken {
        Ok(Ok(Some((chosen, (reason, passed))))) => {
            let Some(address) = endpoints.get(chosen).cloned() else {
                return Decision::Fallback(Cause::NoHealthyEndpoint);
            };
            if passed {
                env.tel.inc(host, Counter::PrefixSaturated);
            }
            match reason {
                Reason::Session => env.tel.inc(host, Counter::SessionHit),
                Reason::SessionRebound => env.tel.inc(host, Counter::SessionRebound),
                _ => {}
            }
            state.record(host, env.tel, input.ctx, keys, &window, known, chosen, now);
            let fallbacks = state
                .ring
                .walk(home)
                .filter(|&e| e != chosen)
                .take(MAX_FALLBACKS)
                .filter_map(|e| endpoints.get(e).cloned())
                .collect();
            local_least_request::routed(
                state.counts_key.clone(),
                address,
                cost,
                &admission,
                fallbacks,
                reason,
            )
        }
        Ok(Ok(None)) => keeping(local_least_request::no_room(class), read),
        Ok(Err(refused)) => keeping(
            local_least_request::refusal(host, env.tel, refused, class),
            read,
        ),
        Err(e) => {
            if session.is_some() {
                env.tel.inc(host, Counter::SessionFallback);
            }
            local_least_request::shared_data_failed(host, env.tel, input.ctx, &admission, &e)
        }
    }
}

/// The body's prefix keys, anchor and session id; None (counted, logged) when it has no prompt
/// to key on: least request then decides.
fn read_prompt(
    host: &mut dyn Host,
    tel: &Telemetry,
    input: &Input,
    settings: &PrefixSettings,
) -> Option<PromptRead> {
    let body = host.request_body(0, input.body_bytes).unwrap_or_default();
    match canonicalize(&body, &settings.canon) {
        Ok(canon) => Some(PromptRead {
            keys: canon.chain_keys(),
            anchor: anchor_of(canon.blocks(), settings.anchor),
            session: input
                .config
                .session
                .as_ref()
                .and_then(|s| super::session::session_id(&*host, s, Some(input.body_bytes))),
        }),
        Err(e) => {
            tel.inc(host, Counter::Fallback(Cause::BadRequest));
            tel.log(
                host,
                LogLevel::Debug,
                input.ctx,
                format_args!("no prefix ({e}); least-request"),
            );
            None
        }
    }
}

/// A refusal for want of room keeps what was read, for the retry if the request waits.
fn keeping(decision: Decision, read: Rc<PromptRead>) -> Decision {
    match decision {
        Decision::Reject(rejection) if rejection.may_wait() => {
            Decision::Refused { rejection, read }
        }
        other => other,
    }
}

/// The chain positions a request reads and records, deepest first: its last [`WINDOW`] keys
/// from the anchor on, then the anchor if it is further back. Keys before the anchor (tools,
/// system prompt) are shared by many conversations and never route one.
fn window(len: usize, anchor: usize) -> Vec<usize> {
    let low = anchor.max(len.saturating_sub(WINDOW));
    let mut w: Vec<usize> = (low..len).rev().collect();
    if anchor < low {
        w.push(anchor);
    }
    w
}

impl LocalPrefix {
    /// The deepest key of `window` the index maps to a current endpoint. Each record is read
    /// once; one that does not decode is passed over here and reset by the next write.
    fn lookup(
        &self,
        host: &dyn Host,
        keys: &[PrefixKey],
        window: &[usize],
        now: u64,
    ) -> Option<Known> {
        let mut records: Vec<(u32, Option<Vec<u8>>)> = Vec::new();
        for &depth in window {
            let Some(key) = keys.get(depth) else {
                continue;
            };
            let shard = self.layout.shard_of(key);
            let at = match records.iter().position(|(s, _)| *s == shard) {
                Some(at) => at,
                None => {
                    let name = local_index::shard_key(&self.base, shard);
                    let bytes = host.shared_get(&name).ok().flatten().map(|(v, _)| v);
                    records.push((shard, bytes));
                    records.len() - 1
                }
            };
            let Some((_, Some(bytes))) = records.get(at) else {
                continue;
            };
            if let Ok(Some(tag)) = Shard::lookup(bytes, key, now) {
                if let Some(endpoint) = self.endpoint_of(tag) {
                    return Some(Known { depth, endpoint });
                }
            }
        }
        None
    }

    /// The current endpoint with this tag; none when no endpoint (or, improbably, two) has it.
    fn endpoint_of(&self, tag: u32) -> Option<usize> {
        let mut found = self.tags.iter().enumerate().filter(|(_, t)| **t == tag);
        let (first, _) = found.next()?;
        found.next().is_none().then_some(first)
    }

    /// Where the request goes, by the loads (`costMode` units) it is about to join with `cost`.
    /// A known endpoint is kept unless it is at `maxRequestCount`, over the guard of the Redis
    /// script (its load exceeds the least-loaded one's by more than `affinityMaxImbalance` and
    /// is more than `affinityMaxImbalanceRatio` times it, docs/redis-data-model.md §5), or
    /// saturated by its scraped metrics (`hot`, by position; empty without a metrics guard);
    /// otherwise CHWBL on the anchor key, never back to the endpoint just left and past the
    /// saturated ones. The metrics only steer while some endpoint with room is not saturated:
    /// when all are, the loads decide alone. `session`: the session's pod (its id's ring walk's
    /// first endpoint), kept ahead of any prefix match under the same guard; when it is over
    /// the guard the request is placed as without a session but never on it, and reads
    /// `session_rebound` (docs/redis-data-model.md §10). The flag: a saturated endpoint was
    /// passed by (the session's or known one, or the one the walk would have taken). None:
    /// every endpoint is at the cap.
    #[allow(clippy::too_many_arguments)] // one call site; a struct would only rename them
    fn choose(
        &self,
        loads: &[u64],
        cost: u64,
        cap: u64,
        hot: &[bool],
        known: Option<Known>,
        home: u64,
        session: Option<usize>,
    ) -> Option<(usize, Reason, bool)> {
        let room = |e: usize| cap == 0 || loads.get(e).is_some_and(|&l| l < cap);
        let saturated = |e: usize| hot.get(e).copied().unwrap_or(false);
        let steer = (0..loads.len()).any(|e| room(e) && !saturated(e));
        let hot = |e: usize| steer && saturated(e);
        let any_hot = (0..loads.len()).any(hot);
        let min = loads.iter().copied().min()?;
        let within = |e: usize| {
            let load = loads.get(e).copied().unwrap_or(0);
            let crowded = load.saturating_sub(min) > self.bound.slack
                && load as f64 > min as f64 * self.bound.factor;
            room(e) && !crowded && !hot(e)
        };
        if let Some(s) = session.filter(|&s| within(s)) {
            return Some((s, Reason::Session, false));
        }
        let mut left = None;
        if let Some(k) = known {
            if Some(k.endpoint) != session && within(k.endpoint) {
                let reason = match session {
                    Some(_) => Reason::SessionRebound,
                    None => Reason::PrefixHit,
                };
                return Some((k.endpoint, reason, session.is_some_and(hot)));
            }
            left = Some(k.endpoint);
        }
        let mut passed = left.is_some_and(hot) || session.is_some_and(hot);
        let reason = match (session, left) {
            (Some(_), _) => Reason::SessionRebound,
            (None, Some(_)) => Reason::PrefixSpill,
            (None, None) => Reason::PrefixMiss,
        };
        let allowed = |e: usize| room(e) && Some(e) != left && Some(e) != session && !hot(e);
        let least = |ok: &dyn Fn(usize) -> bool| {
            (0..loads.len())
                .filter(|&e| ok(e))
                .min_by_key(|&e| loads.get(e).copied().unwrap_or(u64::MAX))
        };
        let e = chwbl::pick(&self.ring, home, loads, cost, self.bound, allowed)
            // Only when the bound and the exclusions leave nothing: the least loaded with room,
            // unsaturated first.
            .or_else(|| least(&|e| room(e) && !hot(e)))
            .or_else(|| least(&room))?;
        if !passed && any_hot {
            // Only when some pod is saturated: would the walk have taken one?
            let unguarded = |e: usize| room(e) && Some(e) != left && Some(e) != session;
            passed = chwbl::pick(&self.ring, home, loads, cost, self.bound, unguarded)
                .is_some_and(|u| u != e && hot(u));
        }
        // Nothing else had room: the session's own pod after all.
        let reason = if session == Some(e) {
            Reason::Session
        } else {
            reason
        };
        Some((e, reason, passed))
    }

    /// Records the choice as the Redis script does: the matched key's life is extended and the
    /// keys past it now name `endpoint`; the shorter keys stay where they were (after a spill,
    /// moving them would herd every conversation sharing them onto the new endpoint). One CAS
    /// update per record touched.
    #[allow(clippy::too_many_arguments)] // one call site; a struct would only rename them
    fn record(
        &self,
        host: &mut dyn Host,
        tel: &Telemetry,
        ctx: u32,
        keys: &[PrefixKey],
        window: &[usize],
        known: Option<Known>,
        endpoint: usize,
        now: u64,
    ) {
        let Some(&tag) = self.tags.get(endpoint) else {
            return;
        };
        let expires = now.saturating_add(self.ttl_ms);
        // (record, key, Some(tag) = map, None = extend)
        let mut ops: Vec<(u32, PrefixKey, Option<u32>)> = window
            .iter()
            .filter_map(|&depth| {
                let key = *keys.get(depth)?;
                let op = match known {
                    Some(k) if depth < k.depth => return None,
                    Some(k) if depth == k.depth => None,
                    _ => Some(tag),
                };
                Some((self.layout.shard_of(&key), key, op))
            })
            .collect();
        ops.sort_by_key(|(shard, _, _)| *shard);
        for group in ops.chunk_by(|a, b| a.0 == b.0) {
            let Some(&(shard, _, _)) = group.first() else {
                continue;
            };
            let name = local_index::shard_key(&self.base, shard);
            let result = shared::update(host, &name, |cur| {
                let (mut record, reset) = match Shard::decode(cur.as_deref()) {
                    Ok(r) => (r, false),
                    Err(_) => (Shard::default(), true),
                };
                for (_, key, op) in group {
                    match op {
                        Some(tag) => record.put(key, *tag, expires),
                        None => {
                            record.touch(key, now, expires);
                        }
                    }
                }
                (record.into_bytes(), reset)
            });
            match result {
                Ok(false) => {}
                Ok(true) => {
                    tel.inc(host, Counter::PrefixIndexReset);
                    tel.log(
                        host,
                        LogLevel::Warn,
                        ctx,
                        format_args!("prefix index record {name} did not decode: started afresh"),
                    );
                }
                Err(e) => {
                    tel.inc(host, Counter::PrefixIndexFailed);
                    tel.log(host, LogLevel::Debug, ctx, format_args!("{name}: {e}"));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_the_deepest_keys_then_the_anchor() {
        assert_eq!(window(3, 1), vec![2, 1]);
        assert_eq!(window(1, 0), vec![0]);
        assert_eq!(window(0, 0), Vec::<usize>::new());
        let w = window(100, 2);
        assert_eq!(w.len(), WINDOW + 1);
        assert_eq!((w[0], w[WINDOW - 1], w[WINDOW]), (99, 68, 2));
        assert_eq!(window(40, 20), (20..40).rev().collect::<Vec<_>>());
    }
}
