//! A Redis pick and what it acquires. A [`Pick`] is built by a Redis-backed policy
//! (global_least_request and prefix_cache choose an endpoint, cluster_metrics with global
//! in-flight counts a service), sent by the [`super::redis_client::RedisClient`], owned by its
//! request while in flight, and turned into a lease when Redis answers; the lease is what stream
//! end gives back (docs/redis-data-model.md §6, §8).

use super::policies::cluster_metrics::stats::SharedStats;
use super::rng::VmRng;
use crate::config::Class;
use crate::config::RouteConfig;
use crate::host::Host;
use crate::reason::{Cause, Reason};
use crate::redis::inflight::{self, InflightKeys};
use crate::redis::scripts::{self, Booked, Keys, PrefixChain, SessionState};
use crate::upstream;
use std::rc::Rc;

mod booking;
mod caps;
pub use booking::Booking;
pub use caps::{class_cap, cost_of, pool_cap, tenant_capacity};

/// What an acquired pick must give back: one lease member in one route's keys (and the route's
/// config, for its Redis target).
#[derive(Debug, Clone)]
pub struct Lease {
    pub config: Rc<RouteConfig>,
    pub keys: Rc<Keys>,
    pub member: String,
    /// prefix_cache: the lease may carry a prefill booking, given back with it.
    pub prefix: bool,
    /// prefix_cache: the booking to give back at the first response bytes (taken then).
    pub booking: Option<Booking>,
}

impl PartialEq for Lease {
    fn eq(&self, other: &Lease) -> bool {
        self.keys == other.keys && self.member == other.member
    }
}

impl Lease {
    /// The lease id (a booking's name, `scripts::lease_id`) and the endpoint of its member
    /// (`scripts::lease_member`).
    pub fn id_and_endpoint(&self) -> Option<(&str, &str)> {
        let (rest, _cost) = self.member.rsplit_once('|')?;
        rest.split_once('|')
    }
}

/// An acquire in flight: everything needed to finish it, or to undo it if its stream is gone.
#[derive(Debug, Clone)]
pub enum Pick {
    Endpoint(EndpointPick),
    Service(ServicePick),
    Session(SessionPick),
}

/// endpoint_metrics with a session and Redis (Higress build): the scheduler has chosen; one
/// script call keeps the session on its bound pod when that pod may keep it, else binds it to
/// the scheduler's choice (docs/redis-data-model.md §10). Nothing is counted, so nothing is
/// ever released.
#[derive(Debug, Clone)]
pub struct SessionPick {
    pub config: Rc<RouteConfig>,
    /// `scripts::session_key` of the request's session id.
    pub key: Rc<str>,
    pub ttl_s: u64,
    /// The scheduler's pick: the new binding, and the route when Redis cannot answer.
    pub choice: String,
    /// The candidates a session may stay on: healthy, with metrics, not saturated.
    pub keep: Vec<String>,
    pub by_sha: bool,
}

impl Pick {
    pub fn config(&self) -> &Rc<RouteConfig> {
        match self {
            Pick::Endpoint(p) => &p.config,
            Pick::Service(p) => &p.config,
            Pick::Session(p) => &p.config,
        }
    }

    /// EVALSHA (true) or EVAL after a NOSCRIPT.
    pub fn by_sha(&self) -> bool {
        match self {
            Pick::Endpoint(p) => p.by_sha,
            Pick::Service(p) => p.by_sha,
            Pick::Session(p) => p.by_sha,
        }
    }

    pub fn resend_by_text(&mut self) {
        match self {
            Pick::Endpoint(p) => p.by_sha = false,
            Pick::Service(p) => p.by_sha = false,
            Pick::Session(p) => p.by_sha = false,
        }
    }
}

/// cluster_metrics AdaptiveScore with `global_inflight_enabled`: Redis chooses among the
/// candidates by local score × (global count + 1) and counts the choice
/// (docs/higress-cluster-policies.md §3.6).
#[derive(Debug, Clone)]
pub struct ServicePick {
    pub config: Rc<RouteConfig>,
    pub keys: Rc<InflightKeys>,
    pub request_id: String,
    pub key_ttl_s: u64,
    /// The candidates (distinct) and their local scores.
    pub candidates: Rc<Vec<(String, f64)>>,
    /// What the local path chooses when Redis cannot answer (Higress falls back the same way).
    pub local: String,
    pub stats: Rc<SharedStats>,
    pub start_ms: u64,
    pub by_sha: bool,
}

impl ServicePick {
    pub fn offered(&self, service: &str) -> bool {
        self.candidates.iter().any(|(s, _)| s == service)
    }

    /// After a lost reply: every lease the script could have written.
    pub fn every_member(&self) -> Vec<String> {
        self.candidates
            .iter()
            .map(|(s, _)| inflight::member(&self.request_id, s))
            .collect()
    }
}

/// An endpoint acquire (global_least_request, prefix_cache).
#[derive(Debug, Clone)]
pub struct EndpointPick {
    pub config: Rc<RouteConfig>,
    pub keys: Rc<Keys>,
    pub request_id: String,
    pub cost: u64,
    /// The healthy endpoints the script may choose from (sorted).
    pub candidates: Rc<Vec<String>>,
    pub fingerprint: Rc<str>,
    /// Whether the endpoint list rides along (Redis has not seen this set from this VM).
    pub sent_list: bool,
    /// EVALSHA (true) or EVAL after a NOSCRIPT.
    pub by_sha: bool,
    /// prefix_cache: the prompt's prefix chain (possibly empty); None = least-request.
    pub chain: Option<Rc<PrefixChain>>,
    /// When the pick was planned or last refreshed (host clock, ms).
    pub planned_ms: u64,
    /// The load cap the script refuses at: `maxRequestCount`, or the request's class cap.
    pub cap: u64,
    /// The request's priority class (None: priority classes off).
    pub class: Option<Class>,
    /// The request's session key (`scripts::session_key`), when the route is sticky and the
    /// request names a session.
    pub session: Option<Rc<str>>,
    /// Waiting queue with priority classes: the class rank the script checks against the
    /// waiters of higher classes (docs/redis-data-model.md §12).
    pub wait_rank: Option<usize>,
    /// The pool load the script refuses at: `maxPoolRequests`, or the request's class cap of
    /// it (0 = none).
    pub pool_cap: u64,
    /// Tenant fairness: the request's tenant id and the most it may hold while another tenant
    /// is active (docs/sessions-and-queues.md "Tenant fairness").
    pub tenant: Option<(String, u64)>,
}

/// What Redis answered to a pick, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PickReply {
    Picked {
        endpoint: String,
        depth: u32,
        spilled: bool,
        session: SessionState,
        /// The endpoint's load before this request (None: a session binding, nothing counted).
        load_before: Option<u64>,
        booked: Option<Booked>,
    },
    /// A service pick: Redis counted this service.
    Service(String),
    /// Redis does not hold our endpoint set (restart, another gateway's view): resend it.
    Resync,
    /// Every endpoint is at `maxRequestCount` (or the pool at `maxPoolRequests`); nothing
    /// was acquired.
    Full,
    /// The pool is at `maxPoolRequests` (or the request's class cap of it); nothing acquired.
    PoolFull,
    /// The request's tenant is at its share while another tenant is active; nothing was
    /// acquired.
    Tenant,
    /// The script cache lost the script: resend with EVAL.
    NoScript,
    Failed(Cause),
}

impl EndpointPick {
    /// A pick for a request of priority `class`: its class cap goes to the script.
    pub fn with_class(mut self, class: Option<Class>) -> EndpointPick {
        self.cap = class_cap(&self.config, class);
        self.pool_cap = pool_cap(&self.config, class);
        self.class = class;
        self.wait_rank = class
            .filter(|_| self.config.common.queue.is_some())
            .map(|c| c.rank);
        self
    }

    /// Plans a pick for `config`: the healthy endpoints from the host list, and whether Redis
    /// needs them (`synced` is the fingerprint this VM last synced for these keys).
    pub fn plan(
        host: &dyn Host,
        config: &Rc<RouteConfig>,
        keys: &Rc<Keys>,
        body_bytes: usize,
        chain: Option<Rc<PrefixChain>>,
        synced: Option<&Rc<str>>,
        rng: &mut VmRng,
    ) -> Result<EndpointPick, Cause> {
        let (healthy, fingerprint) = healthy_set(host)?;
        Ok(EndpointPick {
            sent_list: synced != Some(&fingerprint),
            config: config.clone(),
            keys: keys.clone(),
            request_id: rng.request_id(),
            cost: cost_of(config, body_bytes),
            candidates: Rc::new(healthy),
            fingerprint,
            by_sha: true,
            chain,
            planned_ms: host.now_ms(),
            cap: config.common.max_load,
            class: None,
            session: None,
            wait_rank: None,
            pool_cap: config.common.max_pool,
            tenant: None,
        })
    }

    /// A waiting request's pick, sent again when room may have freed: the endpoints as they
    /// are now (a pod may have come or gone while it waited). Nothing was acquired by the
    /// refused attempt, so the request id is kept.
    pub fn refresh(&mut self, host: &dyn Host, synced: Option<&Rc<str>>) -> Result<(), Cause> {
        let (healthy, fingerprint) = healthy_set(host)?;
        self.sent_list = synced != Some(&fingerprint);
        self.candidates = Rc::new(healthy);
        self.fingerprint = fingerprint;
        self.planned_ms = host.now_ms();
        Ok(())
    }

    /// The lease the script wrote if it chose `endpoint`.
    pub fn lease(&self, endpoint: &str) -> Lease {
        Lease {
            config: self.config.clone(),
            keys: self.keys.clone(),
            member: scripts::lease_member(&self.request_id, endpoint, self.cost, self.tenant_id()),
            prefix: self.chain.is_some(),
            booking: None,
        }
    }

    /// The booking Redis answered.
    pub fn booking(&self, booked: Booked) -> Booking {
        Booking {
            booked,
            since_ms: self.planned_ms,
            timed: self.chain.as_ref().is_some_and(|c| c.stream),
        }
    }

    /// After a lost reply nobody knows which endpoint the script chose, if it ran: every lease
    /// it could have written. Rare path, so O(endpoints) is fine.
    pub fn every_lease(&self) -> Vec<String> {
        self.candidates
            .iter()
            .map(|ep| scripts::lease_member(&self.request_id, ep, self.cost, self.tenant_id()))
            .collect()
    }

    pub fn tenant_id(&self) -> Option<&str> {
        self.tenant.as_ref().map(|(id, _)| id.as_str())
    }

    /// How the script's answer reads as a decision reason: a kept or rebound session names
    /// the decision; a new one is placed by the policy.
    pub fn reason(&self, depth: u32, spilled: bool, session: SessionState) -> Reason {
        match session {
            SessionState::Kept => return Reason::Session,
            SessionState::Rebound => return Reason::SessionRebound,
            SessionState::None | SessionState::New => {}
        }
        match (&self.chain, depth, spilled) {
            (None, _, _) => Reason::LeastRequest,
            (Some(_), _, true) => Reason::PrefixSpill,
            (Some(_), 0, _) => Reason::PrefixMiss,
            (Some(_), _, false) => Reason::PrefixHit,
        }
    }
}

/// The healthy endpoints of the host's list (sorted) and their fingerprint.
fn healthy_set(host: &dyn Host) -> Result<(Vec<String>, Rc<str>), Cause> {
    let endpoints = match host.upstream_hosts().map(|b| upstream::decode_hosts(&b)) {
        Ok(Ok(list)) => list,
        _ => return Err(Cause::HostListUnavailable),
    };
    let healthy = upstream::healthy_addresses(&endpoints);
    if healthy.is_empty() {
        return Err(Cause::NoHealthyEndpoint);
    }
    let fingerprint: Rc<str> = upstream::fingerprint(&healthy).into();
    Ok((healthy, fingerprint))
}
