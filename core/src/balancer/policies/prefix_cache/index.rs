//! The plain-Envoy prefix index of one route config (docs/redis-data-model.md §9): its
//! shared-data records of conversation keys → endpoint tags, and the choice between the known
//! endpoint, the session's pod and consistent hashing with bounded loads.

use crate::balancer::policies::least_request::counts::counts_key;
use crate::balancer::shared;
use crate::balancer::telemetry::Telemetry;
use crate::config::{PrefixSettings, RouteConfig};
use crate::hash;
use crate::host::{Host, LogLevel};
use crate::prefix::chwbl::{self, Bound, Ring};
use crate::prefix::local_index::{self, Layout, Shard};
use crate::prefix::PrefixKey;
use crate::reason::Reason;
use crate::stats::Counter;
use std::rc::Rc;

/// One route config's plain-Envoy prefix state, built at configure.
#[derive(Debug)]
pub struct LocalPrefix {
    /// Shared-data name of the index; its records are `<base>.<shard>`.
    base: String,
    layout: Layout,
    pub ring: Ring,
    /// The route's `endpoints`.
    addresses: Rc<Vec<String>>,
    /// Each endpoint's tag at generation 0, by position in the route's `endpoints`.
    tags: Vec<u32>,
    /// Shared-data name of the endpoints' generations (`<ip:port> <generation>` lines, and
    /// `<ip:port>@ms <when last bumped>`): absent until a first bump.
    gen_key: String,
    pub counts_key: Rc<str>,
    ttl_ms: u64,
    /// CHWBL's bound, and the hit guard: both from `affinityMaxImbalanceRatio` (factor) and
    /// `affinityMaxImbalance` (slack), docs/redis-data-model.md §9.
    bound: Bound,
}

/// The deepest key of a request the index knows: its position in the chain, and the endpoint.
#[derive(Debug, Clone, Copy)]
pub struct Known {
    pub depth: usize,
    pub endpoint: usize,
}

/// The least time between two generation bumps of one endpoint, as in Redis: the requests in
/// flight on a restarted pod all come back short, and the first bump is enough.
pub const FORGET_INTERVAL_MS: u64 = crate::redis::scripts::release::FORGET_INTERVAL_MS;

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
            gen_key: format!("{base}.gen"),
            addresses: config.endpoints.clone(),
            base,
            layout,
            ring: Ring::new(&config.endpoints),
            tags: config
                .endpoints
                .iter()
                .map(|e| local_index::endpoint_tag(e))
                .collect(),
            counts_key: counts_key(&config.endpoints),
            ttl_ms: settings.ttl_s.saturating_mul(1000),
            bound: Bound {
                factor: settings.max_imbalance_ratio,
                slack: settings.max_imbalance,
            },
        }
    }
}

impl LocalPrefix {
    /// Each endpoint's tag now, by position: its generation's (one shared-data read; the
    /// generation-0 tags while no endpoint was ever bumped).
    pub fn tags(&self, host: &dyn Host) -> Vec<u32> {
        let Ok(Some((bytes, _))) = host.shared_get(&self.gen_key) else {
            return self.tags.clone();
        };
        let gens = shared::decode_counts(&bytes);
        self.addresses
            .iter()
            .zip(&self.tags)
            .map(|(a, &t)| match gens.get(a) {
                Some(&g) if g > 0 => local_index::generation_tag(a, g),
                _ => t,
            })
            .collect()
    }

    /// A severe shortfall on `endpoint` (docs/redis-data-model.md §9): its generation is
    /// bumped (unless it was within [`FORGET_INTERVAL_MS`]), so its older entries name no
    /// endpoint, and this request's keys (`keys` at `window`) are recorded at the new one.
    /// Whether it bumped.
    #[allow(clippy::too_many_arguments)] // one call site; a struct would only rename them
    pub fn forget(
        &self,
        host: &mut dyn Host,
        tel: &Telemetry,
        ctx: u32,
        endpoint: &str,
        keys: &[PrefixKey],
        window: &[usize],
        now: u64,
    ) -> bool {
        let Some(at) = self.addresses.iter().position(|a| a == endpoint) else {
            return false;
        };
        let when = format!("{endpoint}@ms");
        let bumped = shared::update(host, &self.gen_key, |cur| {
            let mut gens = shared::decode_counts(cur.as_deref().unwrap_or_default());
            // Endpoints no longer in the list are dropped: the record stays small.
            gens.retain(|k, _| {
                let a = k.strip_suffix("@ms").unwrap_or(k);
                self.addresses.iter().any(|e| e == a)
            });
            let last = gens.get(&when).copied();
            let bump = last.is_none_or(|t| now.saturating_sub(t) >= FORGET_INTERVAL_MS);
            if bump {
                *gens.entry(endpoint.to_string()).or_insert(0) += 1;
                gens.insert(when.clone(), now);
            }
            (shared::encode_counts(&gens), bump)
        });
        let bumped = match bumped {
            Ok(b) => b,
            Err(e) => {
                tel.inc(host, Counter::PrefixIndexFailed);
                tel.log(
                    host,
                    LogLevel::Debug,
                    ctx,
                    format_args!("{}: {e}", self.gen_key),
                );
                return false;
            }
        };
        let tags = self.tags(host);
        self.record(host, tel, ctx, keys, window, None, at, now, &tags);
        bumped
    }

    /// The deepest key of `window` the index maps to a current endpoint. Each record is read
    /// once; one that does not decode is passed over here and reset by the next write.
    pub fn lookup(
        &self,
        host: &dyn Host,
        keys: &[PrefixKey],
        window: &[usize],
        now: u64,
        tags: &[u32],
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
                if let Some(endpoint) = endpoint_of(tags, tag) {
                    return Some(Known { depth, endpoint });
                }
            }
        }
        None
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
    /// `session_rebound` (docs/redis-data-model.md §10). `sticky` false: the token gate found
    /// the match too short to prefer its endpoint (gate.rs), which is then left as over the
    /// guard. The flag: a saturated endpoint was passed by (the session's or known one, or the
    /// one the walk would have taken). None: every endpoint is at the cap.
    #[allow(clippy::too_many_arguments)] // one call site; a struct would only rename them
    pub fn choose(
        &self,
        loads: &[u64],
        cost: u64,
        cap: u64,
        hot: &[bool],
        known: Option<Known>,
        home: u64,
        session: Option<usize>,
        sticky: bool,
    ) -> Option<(usize, Reason, bool)> {
        if loads.is_empty() {
            return None;
        }
        let room = |e: usize| cap == 0 || loads.get(e).is_some_and(|&l| l < cap);
        let saturated = |e: usize| hot.get(e).copied().unwrap_or(false);
        let steer = (0..loads.len()).any(|e| room(e) && !saturated(e));
        let within = |e: usize| self.keeps(loads, cap, hot, e);
        let hot = |e: usize| steer && saturated(e);
        let any_hot = (0..loads.len()).any(hot);
        if let Some(s) = session.filter(|&s| within(s)) {
            return Some((s, Reason::Session, false));
        }
        let mut left = None;
        if let Some(k) = known {
            if sticky && Some(k.endpoint) != session && within(k.endpoint) {
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

    /// Whether endpoint `e` may keep a request it is known for (a session's pod, a prefix
    /// match's): room under `cap`, within the bounded-load guard against the least-loaded
    /// endpoint, and not saturated (`hot`) while some endpoint with room is not.
    pub fn keeps(&self, loads: &[u64], cap: u64, hot: &[bool], e: usize) -> bool {
        let room = |e: usize| cap == 0 || loads.get(e).is_some_and(|&l| l < cap);
        let saturated = |e: usize| hot.get(e).copied().unwrap_or(false);
        let steer = (0..loads.len()).any(|e| room(e) && !saturated(e));
        let min = loads.iter().copied().min().unwrap_or(0);
        let load = loads.get(e).copied().unwrap_or(0);
        let crowded = load.saturating_sub(min) > self.bound.slack
            && load as f64 > min as f64 * self.bound.factor;
        room(e) && !crowded && !(steer && saturated(e))
    }

    /// Records the choice as the Redis script does: the matched key's life is extended and the
    /// keys past it now name `endpoint`; the shorter keys stay where they were (after a spill,
    /// moving them would herd every conversation sharing them onto the new endpoint). One CAS
    /// update per record touched.
    #[allow(clippy::too_many_arguments)] // one call site; a struct would only rename them
    pub fn record(
        &self,
        host: &mut dyn Host,
        tel: &Telemetry,
        ctx: u32,
        keys: &[PrefixKey],
        window: &[usize],
        known: Option<Known>,
        endpoint: usize,
        now: u64,
        tags: &[u32],
    ) {
        let Some(&tag) = tags.get(endpoint) else {
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

/// The current endpoint with this tag (`tags` by position); none when no endpoint (or,
/// improbably, two) has it.
fn endpoint_of(tags: &[u32], tag: u32) -> Option<usize> {
    let mut found = tags.iter().enumerate().filter(|(_, t)| **t == tag);
    let (first, _) = found.next()?;
    found.next().is_none().then_some(first)
}
