//! global_least_request in the plain-Envoy build: there is no Redis host call there, so the
//! counts are per proxy, in shared data (every worker VM sees them), updated with CAS and given
//! back at stream end. Each request counts its `costMode` weight (the body's bytes or
//! estimated tokens: such routes hold the request for its body).

use super::input::{priority_class, Env, Input};
use crate::balancer::pick::{class_cap, cost_of, pool_cap, LocalLease};
use crate::balancer::request::{Decision, Hold, PromptRead, Rejection};
use crate::balancer::shared;
use crate::balancer::telemetry::Telemetry;
use crate::balancer::waiters;
use crate::config::Class;
use crate::config::RouteConfig;
use crate::config::{SESSION_MAX_IMBALANCE, SESSION_MAX_IMBALANCE_RATIO};
use crate::host::{Host, HostError, LogLevel};
use crate::prefix::chwbl::Ring;
use crate::reason::{Cause, Reason};
use crate::stats::Counter;
use crate::upstream;
use std::collections::HashMap;
use std::rc::Rc;

pub fn decide(host: &mut dyn Host, env: Env, input: &Input, ring: Option<&Ring>) -> Decision {
    let endpoints = &input.config.endpoints;
    if endpoints.is_empty() {
        return Decision::Fallback(Cause::NoHealthyEndpoint);
    }
    // The class first: a sticky request is held to its class cap like any other.
    let class = priority_class(host, env.tel, input.config);
    if let (Some(ring), Some(session)) = (ring, &input.config.session) {
        // A waiting request's retry cannot read its held body again: it keeps the id its
        // first decision read (`sessionBodyField`), as prefix_cache keeps its prompt.
        let id = match input.read.and_then(|r| r.session.clone()) {
            Some(kept) => Some(kept),
            None => super::session::session_id(
                &*host,
                session,
                input.read_body.then_some(input.body_bytes),
            ),
        };
        if let Some(id) = id {
            return match sticky(host, env, input, ring, &id, class) {
                Decision::Reject(rejection) if rejection.may_wait() => {
                    let read = input.read.cloned().unwrap_or_else(|| {
                        Rc::new(PromptRead {
                            keys: Vec::new(),
                            anchor: 0,
                            session: Some(id),
                        })
                    });
                    Decision::Refused { rejection, read }
                }
                other => other,
            };
        }
    }
    let key = counts_key(endpoints);
    let start = env.rng.next_u64();
    let base_cap = input.config.common.max_load;
    let cap = class_cap(input.config, class);
    let cost = cost_of(input.config, input.body_bytes);
    let admission = Admission::of(host, input.config, class);
    let above = waiting_above(host, input, class);
    let now = Some(admission.now_ms);
    let picked = take(
        host,
        &key,
        endpoints,
        cost,
        &admission,
        now,
        |loads, down| {
            if waiters::outranked(loads, cap, admission.pool_cap, cost, above) {
                return None;
            }
            let order = least_first(loads, start, down);
            let best = *order.first()?;
            let load = loads.get(best).copied().unwrap_or(0);
            if cap > 0 && load >= cap {
                return None;
            }
            Some((best, (order, load)))
        },
    );
    match picked {
        Ok(Ok(Some((chosen, (order, load))))) => {
            if base_cap > 0 && load >= base_cap {
                // Only the highest class gets past `maxRequestCount`: its headroom.
                env.tel.inc(host, Counter::PriorityAdmittedHeadroom);
            }
            let Some(address) = endpoints.get(chosen).cloned() else {
                return Decision::Fallback(Cause::NoHealthyEndpoint);
            };
            let fallbacks = order
                .into_iter()
                .skip(1)
                .filter_map(|e| endpoints.get(e).cloned())
                .collect();
            routed(
                key,
                address,
                cost,
                &admission,
                fallbacks,
                Reason::LeastRequest,
            )
        }
        Ok(Ok(None)) => no_room(class),
        Ok(Err(refused)) => refusal(host, env.tel, refused, class),
        Err(e) => shared_data_failed(host, env.tel, input.ctx, &admission, &e),
    }
}

/// A plain-Envoy pick that took `cost` at `address` in the counts under `key`: routed,
/// holding that cost until stream end.
pub(super) fn routed(
    key: Rc<str>,
    address: String,
    cost: u64,
    admission: &Admission,
    fallbacks: Vec<String>,
    reason: Reason,
) -> Decision {
    Decision::Route {
        hold: Some(Hold::Local(LocalLease {
            key,
            endpoint: address.clone(),
            cost,
            tenant: admission.tenant.as_ref().map(|(id, _)| id.clone()),
            failed: false,
        })),
        endpoint: address,
        fallbacks,
        reason,
    }
}

/// Waiting queue with priority classes: how many requests of a higher class than `class` wait
/// in this proxy (README "Waiting queue"); they hold back the room they wait for. 0 without a
/// queue.
pub(super) fn waiting_above(host: &dyn Host, input: &Input, class: Option<Class>) -> u64 {
    match (input.config.common.queue, class) {
        (Some(_), Some(c)) if c.rank > 0 => {
            waiters::above(host, &waiters::key(&input.config.endpoints), c.rank)
        }
        _ => 0,
    }
}

/// No endpoint had room: a request with a priority class was shed at its class cap
/// (`shed_priority`), any other refused at `maxRequestCount`.
pub(super) fn no_room(class: Option<Class>) -> Decision {
    if class.is_some() {
        Decision::Reject(Rejection::ShedPriority)
    } else {
        Decision::Reject(Rejection::MaxRequestCount)
    }
}

/// The pool cap or the tenant's share refused the request (nothing was counted): the pool
/// cap answers as the endpoint cap does (`shed_priority` with a class, else
/// `maxRequestCount`), the tenant's share with `shed_tenant`.
pub(super) fn refusal(
    host: &mut dyn Host,
    tel: &Telemetry,
    refused: Refused,
    class: Option<Class>,
) -> Decision {
    match refused {
        Refused::Pool => {
            tel.inc(host, Counter::PoolFull);
            no_room(class)
        }
        Refused::Tenant => Decision::Reject(Rejection::ShedTenant),
    }
}

/// The counts could not be read or written: nothing was taken, so the request goes to the
/// cluster's own balancing (a tenant's request unheld to its share: counted).
pub(super) fn shared_data_failed(
    host: &mut dyn Host,
    tel: &Telemetry,
    ctx: u32,
    admission: &Admission,
    e: &HostError,
) -> Decision {
    if admission.tenant.is_some() {
        tel.inc(host, Counter::TenantFallback);
    }
    tel.log(host, LogLevel::Debug, ctx, format_args!("{e}"));
    Decision::Fallback(Cause::SharedData)
}

/// Plain Envoy with a session: no binding is stored; the session id is consistent-hashed onto
/// the ring of the configured endpoints, so every worker and every replica sends it to the
/// same pod without talking (docs/redis-data-model.md §10). It walks on past a pod over the
/// guard Redis applies (the cap, or busier than this proxy's least-loaded pod by more than 8
/// and 1.5 times) or marked down ([`DOWN_MS`]): `session_rebound`.
fn sticky(
    host: &mut dyn Host,
    env: Env,
    input: &Input,
    ring: &Ring,
    id: &[u8],
    class: Option<Class>,
) -> Decision {
    let endpoints = &input.config.endpoints;
    let key = super::session::ring_key(id);
    let home = ring.walk(key).next();
    let base_cap = input.config.common.max_load;
    let cap = class_cap(input.config, class);
    let cost = cost_of(input.config, input.body_bytes);
    let counts = counts_key(endpoints);
    let admission = Admission::of(host, input.config, class);
    let above = waiting_above(host, input, class);
    let now = Some(admission.now_ms);
    let picked = take(
        host,
        &counts,
        endpoints,
        cost,
        &admission,
        now,
        |loads, down| {
            if waiters::outranked(loads, cap, admission.pool_cap, cost, above) {
                return None;
            }
            let min = loads.iter().copied().min().unwrap_or(0) as f64;
            let ok = |e: usize| {
                let load = loads.get(e).copied().unwrap_or(0);
                let over_cap = cap > 0 && load.saturating_add(cost) > cap;
                let load = load as f64;
                let imbalanced = load - min > SESSION_MAX_IMBALANCE as f64
                    && load > min * SESSION_MAX_IMBALANCE_RATIO;
                !over_cap && !imbalanced && !down.get(e).copied().unwrap_or(false)
            };
            ring.walk(key)
                .find(|&e| ok(e))
                .map(|e| (e, loads.get(e).copied().unwrap_or(0)))
        },
    );
    match picked {
        Ok(Ok(Some((chosen, load)))) => {
            if base_cap > 0 && load >= base_cap {
                // Only the highest class gets past `maxRequestCount`: its headroom.
                env.tel.inc(host, Counter::PriorityAdmittedHeadroom);
            }
            let Some(address) = endpoints.get(chosen).cloned() else {
                return Decision::Fallback(Cause::NoHealthyEndpoint);
            };
            let (reason, counter) = if home == Some(chosen) {
                (Reason::Session, Counter::SessionHit)
            } else {
                (Reason::SessionRebound, Counter::SessionRebound)
            };
            env.tel.inc(host, counter);
            let fallbacks = ring
                .walk(key)
                .filter(|&e| e != chosen)
                .filter_map(|e| endpoints.get(e).cloned())
                .take(16)
                .collect();
            routed(counts, address, cost, &admission, fallbacks, reason)
        }
        Ok(Ok(None)) => no_room(class),
        Ok(Err(refused)) => refusal(host, env.tel, refused, class),
        Err(e) => {
            env.tel.inc(host, Counter::SessionFallback);
            shared_data_failed(host, env.tel, input.ctx, &admission, &e)
        }
    }
}

/// What a plain-Envoy pick is admitted against besides the endpoint cap: the pool cap and
/// the tenant's share (README "Tenant fairness"), kept in the same counts record as the
/// endpoints' loads (lines `~t<tenant> <in flight>` and `~s<tenant> <last request, ms>`), so
/// one CAS update checks and counts all of it, as the Redis script does
/// (docs/redis-data-model.md §11).
#[derive(Debug, Clone, Default)]
pub struct Admission {
    /// `maxPoolRequests` or the request's class cap of it (0 = none).
    pub pool_cap: u64,
    /// The tenant id and the most it may hold while another tenant is active.
    pub tenant: Option<(String, u64)>,
    pub window_ms: u64,
    pub now_ms: u64,
}

/// Why [`take`] refused before choosing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Pool,
    Tenant,
}

impl Admission {
    pub fn of(host: &dyn Host, config: &RouteConfig, class: Option<Class>) -> Admission {
        Admission {
            pool_cap: pool_cap(config, class),
            tenant: super::least_request::tenant(host, config, config.endpoints.len()),
            window_ms: config.common.fairness.as_ref().map_or(0, |f| f.window_ms),
            now_ms: host.now_ms(),
        }
    }

    /// Checks the request against the pool cap and its tenant's share in `counts` (the
    /// record's lines); a refused tenant is marked seen (it is waiting).
    fn check(&self, counts: &mut HashMap<String, u64>, cost: u64) -> Result<(), Refused> {
        if self.tenant.is_some() {
            // Tenants quiet for the window are no longer active.
            let oldest = self.now_ms.saturating_sub(self.window_ms);
            counts.retain(|k, v| !k.starts_with(SEEN) || *v > oldest);
        }
        let mut refused = None;
        if self.pool_cap > 0 {
            let total: u64 = counts
                .iter()
                .filter(|(k, _)| !k.starts_with('~'))
                .map(|(_, v)| *v)
                .sum();
            if total > 0 && total.saturating_add(cost) > self.pool_cap {
                refused = Some(Refused::Pool);
            }
        }
        if let (None, Some((id, limit))) = (refused, &self.tenant) {
            let held = counts.get(&format!("{HELD}{id}")).copied().unwrap_or(0);
            if held > 0 && held.saturating_add(cost) > *limit {
                let (own_held, own_seen) = (format!("{HELD}{id}"), format!("{SEEN}{id}"));
                let other_active = counts.iter().any(|(k, &v)| {
                    (k.starts_with(SEEN) && *k != own_seen)
                        || (k.starts_with(HELD) && *k != own_held && v > 0)
                });
                if other_active {
                    refused = Some(Refused::Tenant);
                }
            }
        }
        match (refused, &self.tenant) {
            (Some(r), Some((id, _))) => {
                counts.insert(format!("{SEEN}{id}"), self.now_ms);
                Err(r)
            }
            (Some(r), None) => Err(r),
            (None, _) => Ok(()),
        }
    }

    /// Counts an admitted request's tenant.
    fn count(&self, counts: &mut HashMap<String, u64>, cost: u64) {
        if let Some((id, _)) = &self.tenant {
            let n = counts.entry(format!("{HELD}{id}")).or_insert(0);
            *n = n.saturating_add(cost);
            counts.insert(format!("{SEEN}{id}"), self.now_ms);
        }
    }
}

/// Counts-record line prefixes of a tenant's in-flight cost and its last request (never an
/// endpoint address).
const HELD: &str = "~t";
const SEEN: &str = "~s";

/// The one counting path of the plain-Envoy policies (least request here, prefix_cache in
/// local_prefix_cache.rs): in one CAS update of the counts record `key`, the request is first
/// checked against the pool cap and its tenant's share ([`Admission`]; `Err`: refused, nothing
/// counted), then `choose` is shown this proxy's load of each of `endpoints` (by position, in
/// `costMode` units) and which of them are marked down as of `now_ms` (by position; empty when
/// none is or `now_ms` is None; expired marks are dropped), and the endpoint it picks is
/// charged `cost` (and the tenant with it), the weight its lease gives back at stream end.
/// `Ok(None)`: `choose` picked none and nothing was counted. `choose` may run again when the
/// CAS is lost.
pub fn take<T>(
    host: &mut dyn Host,
    key: &str,
    endpoints: &[String],
    cost: u64,
    admission: &Admission,
    now_ms: Option<u64>,
    mut choose: impl FnMut(&[u64], &[bool]) -> Option<(usize, T)>,
) -> Result<Result<Option<(usize, T)>, Refused>, HostError> {
    shared::update(host, key, |cur| {
        let mut counts = cur
            .as_deref()
            .map(shared::decode_counts)
            .unwrap_or_default();
        if let Err(r) = admission.check(&mut counts, cost) {
            return (shared::encode_counts(&counts), Err(r));
        }
        let loads: Vec<u64> = endpoints
            .iter()
            .map(|e| counts.get(e).copied().unwrap_or(0))
            .collect();
        let down = now_ms.map_or_else(Vec::new, |now| down_marks(&mut counts, endpoints, now));
        let choice = choose(&loads, &down).filter(|(e, _)| *e < endpoints.len());
        if let Some(address) = choice.as_ref().and_then(|(e, _)| endpoints.get(*e)) {
            let n = counts.entry(address.clone()).or_insert(0);
            *n = n.saturating_add(cost);
            admission.count(&mut counts, cost);
        }
        (shared::encode_counts(&counts), Ok(choice))
    })
}

/// How long an endpoint that failed to answer a least-request pick or a session's request is
/// passed over (README "Plain Envoy", "Sessions"): Envoy's retry served the request from a
/// fallback, so the pod refused the connection or reset it. Short: a pod that is back takes
/// its share again soon.
pub const DOWN_MS: u64 = 10_000;
/// Counts-record lines `~d<endpoint> <until, ms>`: the endpoint is down until then.
const DOWN: &str = "~d";

/// Which of `endpoints` are marked down at `now` (by position; empty when none is); drops the
/// marks that expired.
fn down_marks(counts: &mut HashMap<String, u64>, endpoints: &[String], now: u64) -> Vec<bool> {
    if !counts.keys().any(|k| k.starts_with(DOWN)) {
        return Vec::new();
    }
    counts.retain(|k, until| !k.starts_with(DOWN) || *until > now);
    let marked: std::collections::HashSet<&str> =
        counts.keys().filter_map(|k| k.strip_prefix(DOWN)).collect();
    endpoints
        .iter()
        .map(|e| marked.contains(e.as_str()))
        .collect()
}

/// The shared-data record of this proxy's in-flight counts over `endpoints` (also the load
/// prefix_cache's plain-Envoy guard reads and counts in, local_prefix_cache.rs).
pub fn counts_key(endpoints: &[String]) -> Rc<str> {
    format!("ailb.glr.{}", upstream::fingerprint(endpoints)).into()
}

/// Stream end of a plain-Envoy least-request pick: its cost back, never below zero.
pub fn release(
    host: &mut dyn Host,
    env_tel: &crate::balancer::telemetry::Telemetry,
    lease: LocalLease,
) {
    let down_until = lease.failed.then(|| host.now_ms().saturating_add(DOWN_MS));
    let result = shared::update(host, &lease.key, |cur| {
        let mut counts = cur
            .as_deref()
            .map(shared::decode_counts)
            .unwrap_or_default();
        if let Some(n) = counts.get_mut(&lease.endpoint) {
            *n = n.saturating_sub(lease.cost);
        }
        if let Some(until) = down_until {
            counts.insert(format!("{DOWN}{}", lease.endpoint), until);
        }
        if let Some(id) = &lease.tenant {
            let held = format!("{HELD}{id}");
            let left = counts
                .get(&held)
                .map_or(0, |n| n.saturating_sub(lease.cost));
            if left == 0 {
                counts.remove(&held);
            } else {
                counts.insert(held, left);
            }
        }
        (shared::encode_counts(&counts), ())
    });
    if result.is_err() {
        env_tel.inc(host, Counter::ReleaseFailures);
    }
}

/// Endpoint positions by load, ties rotated by `start` so equal endpoints share the traffic;
/// the ones marked `down` come last (a pod that stopped answering holds nothing, so it would
/// otherwise be first every time), still there as fallbacks and chosen when every pod is.
fn least_first(loads: &[u64], start: u64, down: &[bool]) -> Vec<usize> {
    let n = loads.len().max(1);
    let offset = (start % n as u64) as usize;
    let mut v: Vec<(bool, u64, usize, usize)> = loads
        .iter()
        .enumerate()
        .map(|(i, &load)| {
            let is_down = down.get(i).copied().unwrap_or(false);
            (is_down, load, (i + n - offset) % n, i)
        })
        .collect();
    v.sort_unstable();
    v.into_iter().map(|(_, _, _, i)| i).collect()
}
