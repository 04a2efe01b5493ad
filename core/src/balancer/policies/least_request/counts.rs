//! The per-proxy counts of the plain-Envoy policies (global_least_request and prefix_cache
//! without Redis): one shared-data record per endpoint set (`ailb.glr.<fingerprint>`) holding
//! each endpoint's in-flight cost, the tenants' in-flight costs and last requests, and what
//! failure memory learned of each endpoint (health.rs); every change is one compare-and-swap
//! ([`take`], [`release`]).

use super::health::{self, Learnt, Lesson, Memory};
use super::lease::LocalLease;
use super::prefill::{self, Prefill};
use crate::balancer::pick::pool_cap;
use crate::balancer::policies::policy::tenant;
use crate::balancer::shared;
use crate::balancer::telemetry::Telemetry;
use crate::config::{Class, Ejection, RouteConfig};
use crate::host::{Host, HostError};
use crate::stats::Counter;
use crate::upstream;
use std::collections::HashMap;
use std::rc::Rc;

/// What a plain-Envoy pick is admitted against besides the endpoint cap: the pool cap and
/// the tenant's share (docs/sessions-and-queues.md "Tenant fairness"), kept in the same counts
/// record as the endpoints' loads (lines `~t<tenant> <in flight>` and `~s<tenant> <last
/// request, ms>`), so one CAS update checks and counts all of it, as the Redis script does
/// (docs/redis-data-model.md §11); and the failure memory it passes ejected endpoints by
/// (health.rs, in the same record).
#[derive(Debug, Clone)]
pub struct Admission {
    /// `maxPoolRequests` or the request's class cap of it (0 = none).
    pub pool_cap: u64,
    /// The tenant id and the most it may hold while another tenant is active.
    pub tenant: Option<(String, u64)>,
    pub window_ms: u64,
    pub now_ms: u64,
    /// The route's failure memory (docs/plain-envoy.md "Failure memory"): what the pick
    /// passes over, and what its release learns.
    pub ejection: Ejection,
    /// How many endpoints the route has (`maxEjectedPercent`'s base).
    pub pool: usize,
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
            tenant: tenant(host, config, config.endpoints.len()),
            window_ms: config.common.fairness.as_ref().map_or(0, |f| f.window_ms),
            now_ms: host.now_ms(),
            ejection: config.common.ejection,
            pool: config.endpoints.len(),
        }
    }

    /// The route's failure memory at the pick's time; None when it is off.
    fn memory(&self) -> Option<Memory<'_>> {
        self.ejection.on().then_some(Memory {
            rules: &self.ejection,
            now: self.now_ms,
        })
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

/// What [`take`] counted: `at` (the endpoint's position) with what `choose` returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Took<T> {
    pub at: usize,
    pub value: T,
    /// One of the endpoint's trial requests (failure memory, half-open).
    pub trial: bool,
    /// Every endpoint was ejected: `choose` saw none passed over (`ai_lb.eject.fail_open`).
    pub fail_open: bool,
}

/// The one counting path of the plain-Envoy policies (least request here, prefix_cache in
/// prefix_cache/local.rs): in one CAS update of the counts record `key`, the held counts of
/// failed requests whose time is up are given back, the request is checked against the pool
/// cap and its tenant's share ([`Admission`]; `Err`: refused, nothing counted), then `choose`
/// is shown this proxy's load of each of `endpoints` (by position, in `costMode` units) and
/// which of them failure memory passes over (by position; empty when none is, or when every
/// one is: then the pick fails open, health.rs), and the endpoint it picks is charged `cost`
/// (and the tenant with it), the weight its lease gives back at stream end. `Ok(None)`:
/// `choose` picked none and nothing was counted. `choose` may run again when the CAS is lost.
pub fn take<T>(
    host: &mut dyn Host,
    key: &str,
    endpoints: &[String],
    cost: u64,
    admission: &Admission,
    mut choose: impl FnMut(&[u64], &[bool]) -> Option<(usize, T)>,
) -> Result<Result<Option<Took<T>>, Refused>, HostError> {
    let choose = |loads: &[u64], out: &[bool], _: Option<&Prefill>| {
        choose(loads, out).map(|(e, t)| (e, t, 0))
    };
    take_booking(host, key, endpoints, cost, admission, false, choose)
}

/// [`take`] for prefix_cache's token gate (docs/redis-data-model.md §13, per proxy): with
/// `prefill`, `choose` also sees each endpoint's booked prefill tokens and learned rate, and
/// the tokens it returns are booked on the endpoint it picks, in the same update.
pub fn take_booking<T>(
    host: &mut dyn Host,
    key: &str,
    endpoints: &[String],
    cost: u64,
    admission: &Admission,
    prefill: bool,
    mut choose: impl FnMut(&[u64], &[bool], Option<&Prefill>) -> Option<(usize, T, u64)>,
) -> Result<Result<Option<Took<T>>, Refused>, HostError> {
    let memory = admission.memory();
    shared::update(host, key, |cur| {
        let mut counts = cur
            .as_deref()
            .map(shared::decode_counts)
            .unwrap_or_default();
        health::expire(&mut counts, admission.now_ms);
        if let Err(r) = admission.check(&mut counts, cost) {
            return (shared::encode_counts(&counts), Err(r));
        }
        let loads: Vec<u64> = endpoints
            .iter()
            .map(|e| counts.get(e).copied().unwrap_or(0))
            .collect();
        let out = memory
            .map(|m| m.out(&mut counts, endpoints))
            .unwrap_or_default();
        let view = prefill.then(|| Prefill::read(&counts, endpoints));
        let choice =
            choose(&loads, &out.passed, view.as_ref()).filter(|(e, _, _)| *e < endpoints.len());
        let Some((e, value, tokens)) = choice else {
            return (shared::encode_counts(&counts), Ok(None));
        };
        let mut trial = false;
        if let Some(address) = endpoints.get(e) {
            let n = counts.entry(address.clone()).or_insert(0);
            *n = n.saturating_add(cost);
            admission.count(&mut counts, cost);
            if tokens > 0 {
                prefill::book(&mut counts, address, tokens);
            }
            trial = memory.is_some_and(|m| m.tried(&mut counts, address));
        }
        let took = Took {
            at: e,
            value,
            trial,
            fail_open: out.fail_open,
        };
        (shared::encode_counts(&counts), Ok(Some(took)))
    })
}

/// The shared-data record of this proxy's in-flight counts over `endpoints` (also the load
/// prefix_cache's plain-Envoy guard reads and counts in, prefix_cache/local.rs).
pub fn counts_key(endpoints: &[String]) -> Rc<str> {
    format!("ailb.glr.{}", upstream::fingerprint(endpoints)).into()
}

/// Stream end of a plain-Envoy pick, at `now` (ms): its cost back, never below zero, unless
/// the request failed and failure memory holds it on its endpoint for `failurePenaltyMs` (its
/// tenant's share and its booking go back now); what `lesson` teaches is learned in the same
/// update (health.rs), counted as `ai_lb.eject.*`.
pub fn release(host: &mut dyn Host, tel: &Telemetry, lease: LocalLease, learn: (Lesson, u64)) {
    let result = shared::update(host, &lease.key, |cur| {
        let mut counts = cur
            .as_deref()
            .map(shared::decode_counts)
            .unwrap_or_default();
        let learnt = settle(&mut counts, &lease, learn);
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
        (shared::encode_counts(&counts), learnt)
    });
    learnt(host, tel, &lease, learn.0, result);
}

/// Envoy's retry answered from `served`, not from the endpoint `lease` counts (docs/plain-envoy.md
/// "Failure memory"): in one update that endpoint is settled as unreached (held, learned, its
/// booking back) and the count moves to `served`, where the stream end gives it back with the
/// answer's lesson. The tenant's share stays with the request.
pub fn moved(host: &mut dyn Host, tel: &Telemetry, lease: &mut LocalLease, served: &str, now: u64) {
    let learn = (Lesson::Unreached, now);
    let result = shared::update(host, &lease.key, |cur| {
        let mut counts = cur
            .as_deref()
            .map(shared::decode_counts)
            .unwrap_or_default();
        let learnt = settle(&mut counts, lease, learn);
        let n = counts.entry(served.to_string()).or_insert(0);
        *n = n.saturating_add(lease.cost);
        (shared::encode_counts(&counts), learnt)
    });
    let ok = result.is_ok();
    learnt(host, tel, lease, learn.0, result);
    if ok {
        lease.endpoint = served.to_string();
        lease.booking = None;
        if let Some(m) = lease.memory.as_mut() {
            m.trial = false;
        }
    } else {
        // Not moved: the stream end settles the count where it is, as unreached.
        lease.failed = true;
    }
}

/// What a count's endpoint gives back and learns at `now` (with the record's expired holds
/// dropped first): its cost, unless a failure holds it there for `failurePenaltyMs`; its
/// booking; what `lesson` teaches failure memory.
fn settle(
    counts: &mut HashMap<String, u64>,
    lease: &LocalLease,
    (lesson, now): (Lesson, u64),
) -> Option<Learnt> {
    health::expire(counts, now);
    let memory = lease.memory.as_ref().map(|m| {
        let learning = Memory {
            rules: &m.rules,
            now,
        };
        (learning, m)
    });
    let held = lesson.failed()
        && memory
            .as_ref()
            .is_some_and(|(m, _)| m.hold(counts, &lease.endpoint, lease.cost));
    if let (false, Some(n)) = (held, counts.get_mut(&lease.endpoint)) {
        *n = n.saturating_sub(lease.cost);
    }
    let learnt = memory
        .as_ref()
        .map(|(m, lm)| m.learn(counts, (&lease.endpoint, lm.pool), lm.trial, lesson));
    if let Some(b) = &lease.booking {
        prefill::give_back(counts, &lease.endpoint, b.booked.tokens);
    }
    learnt
}

/// Counts what a settle learned (`ai_lb.eject.*`), or that its update failed.
fn learnt(
    host: &mut dyn Host,
    tel: &Telemetry,
    lease: &LocalLease,
    lesson: Lesson,
    result: Result<Option<Learnt>, HostError>,
) {
    if lease.memory.is_some() && lesson.failed() {
        tel.inc(host, Counter::EjectFailures);
    }
    match result {
        Ok(Some(Learnt::Ejected)) => tel.inc(host, Counter::Ejected),
        Ok(Some(Learnt::Refused)) => tel.inc(host, Counter::EjectionRefused),
        Ok(_) => {}
        Err(_) => tel.inc(host, Counter::ReleaseFailures),
    }
}
