//! The endpoint acquire of global_least_request and prefix_cache with Redis (Higress build):
//! the healthy endpoints, the request's cost, caps, class, session and tenant, and the prefix
//! chain, in one script call that picks and counts (docs/redis-data-model.md §4–§6); its reply
//! is read in [`super::reply`].

use crate::balancer::events::Placement;
use crate::balancer::healthy::{self, Healthy};
use crate::balancer::holding::Holding;
use crate::balancer::pick::{class_cap, cost_of, pool_cap, Booking, Lease, PickReply};
use crate::balancer::policies::continuation::Record;
use crate::balancer::policies::session::Kind;
use crate::balancer::rng::VmRng;
use crate::config::{Class, RouteConfig, SESSION_MAX_IMBALANCE, SESSION_MAX_IMBALANCE_RATIO};
use crate::host::Host;
use crate::reason::{Cause, Reason};
use crate::redis::scripts::{
    self, AcquireArgs, Booked, Keys, LatencyArgs, PrefixArgs, PrefixChain, Scripts, SessionArgs,
    SessionState, TenantArgs, RECLAIM_LIMIT,
};
use std::fmt;
use std::rc::Rc;

/// What a policy adds to the lease its pick's reply gives (prefix_cache: the verification of the
/// answer, which needs to know how deep the chain matched).
pub trait Wrap: fmt::Debug {
    /// The holding of a request whose pick Redis answered with `reply` and `lease`; what it
    /// adds to the request's placement goes in `place`.
    fn wrap(
        self: Box<Self>,
        lease: Lease,
        reply: &PickReply,
        place: &mut Placement,
    ) -> Box<dyn Holding>;

    fn clone_box(&self) -> Box<dyn Wrap>;
}

impl Clone for Box<dyn Wrap> {
    fn clone(&self) -> Box<dyn Wrap> {
        self.clone_box()
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
    /// The request's session key (`scripts::session_key`, or `scripts::response_key` for a
    /// continuation), when the request names a session (session.rs).
    pub session: Option<Rc<str>>,
    /// What named it, and how long its binding lives (`sessionTTL` or `agentSessionTTL`).
    pub session_kind: Kind,
    pub session_ttl_s: u64,
    /// A Responses request: its answer's id is recorded against its pod (continuation.rs).
    pub record: Option<Record>,
    /// Waiting queue with priority classes: the class rank the script checks against the
    /// waiters of higher classes (docs/redis-data-model.md §12).
    pub wait_rank: Option<usize>,
    /// The pool load the script refuses at: `maxPoolRequests`, or the request's class cap of
    /// it (0 = none).
    pub pool_cap: u64,
    /// Tenant fairness: the request's tenant id and the most it may hold while another tenant
    /// is active (docs/sessions-and-queues.md "Tenant fairness").
    pub tenant: Option<(String, u64)>,
    /// What the policy adds to the lease when Redis answers.
    pub wrap: Option<Box<dyn Wrap>>,
    /// prefix_cache with `latencyModel`: placed by predicted latency (None: the token gate).
    pub latency: Option<LatencyArgs>,
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
        if let Some(l) = &mut self.latency {
            l.sheddable = match (&self.config.common.priority, class) {
                (Some(p), Some(c)) => p.sheddable(c.rank),
                _ => false,
            };
        }
        self
    }

    /// Plans a pick for `config` over the `healthy` endpoints (balancer/healthy.rs), and whether
    /// Redis needs them (`synced` is the fingerprint this VM last synced for these keys).
    pub fn plan(
        host: &dyn Host,
        (config, keys): (&Rc<RouteConfig>, &Rc<Keys>),
        body_bytes: usize,
        (healthy, synced): (Healthy, Option<&Rc<str>>),
        chain: Option<Rc<PrefixChain>>,
        rng: &mut VmRng,
    ) -> EndpointPick {
        EndpointPick {
            sent_list: synced != Some(&healthy.fingerprint),
            config: config.clone(),
            keys: keys.clone(),
            request_id: rng.request_id(),
            cost: cost_of(config, body_bytes),
            candidates: healthy.endpoints,
            fingerprint: healthy.fingerprint,
            by_sha: true,
            chain,
            planned_ms: host.now_ms(),
            cap: config.common.max_load,
            class: None,
            session: None,
            session_kind: Kind::Configured,
            session_ttl_s: 0,
            record: None,
            wait_rank: None,
            pool_cap: config.common.max_pool,
            tenant: None,
            wrap: None,
            latency: None,
        }
    }

    /// A waiting request's pick, sent again when room may have freed: the endpoints as they
    /// are now (a pod may have come or gone while it waited). Nothing was acquired by the
    /// refused attempt, so the request id is kept.
    pub fn refresh(&mut self, host: &dyn Host, synced: Option<&Rc<str>>) -> Result<(), Cause> {
        let healthy = healthy::read(host, host.now_ms(), self.config.common.dp.size)?;
        self.sent_list = synced != Some(&healthy.fingerprint);
        self.candidates = healthy.endpoints;
        self.fingerprint = healthy.fingerprint;
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
    /// the decision (a kept one by what named it); a new one is placed by the policy.
    pub fn reason(&self, depth: u32, spilled: bool, session: SessionState) -> Reason {
        match (session, self.session_kind) {
            (SessionState::Kept, Kind::Configured) => return Reason::Session,
            (SessionState::Kept, Kind::Agent) => return Reason::AgentSession,
            (SessionState::Kept, Kind::Continuation) => return Reason::Continuation,
            _ => {}
        }
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

/// The acquire script call of `pick` (docs/redis-data-model.md §4–§6).
pub(super) fn query(scripts: &Scripts, pick: &EndpointPick, now_ms: u64, random: u32) -> Vec<u8> {
    let args = AcquireArgs {
        now_ms,
        lease_ttl_ms: pick.config.common.lease_ttl_ms,
        request_id: &pick.request_id,
        cost: pick.cost,
        cap: pick.cap,
        random,
        fingerprint: &pick.fingerprint,
        reclaim: RECLAIM_LIMIT,
        endpoints: pick.sent_list.then_some(pick.candidates.as_slice()),
        session: None,
        wait_rank: pick.wait_rank,
        pool_cap: pick.pool_cap,
        tenant: match (&pick.tenant, &pick.config.common.fairness) {
            (Some((id, limit)), Some(f)) => Some(TenantArgs {
                id,
                limit: *limit,
                window_ms: f.window_ms,
            }),
            _ => None,
        },
        trials: pick.config.common.ejection.trials(),
    };
    let mut args = args;
    if let Some(key) = &pick.session {
        let (max_imbalance, max_imbalance_ratio) = match pick.config.prefix() {
            Some(p) => (p.max_imbalance, p.max_imbalance_ratio),
            None => (SESSION_MAX_IMBALANCE, SESSION_MAX_IMBALANCE_RATIO),
        };
        args.session = Some(SessionArgs {
            key,
            ttl_s: pick.session_ttl_s,
            max_imbalance,
            max_imbalance_ratio,
        });
    }
    let prefix = match (&pick.chain, pick.config.prefix()) {
        (Some(chain), Some(p)) => Some(PrefixArgs {
            chain,
            ttl_s: p.ttl_s,
            max_imbalance: p.max_imbalance,
            max_imbalance_ratio: p.max_imbalance_ratio,
            gate: p.gate,
            latency: pick.latency,
        }),
        _ => None,
    };
    scripts::pick_call(scripts, pick.by_sha, &pick.keys, &args, prefix.as_ref())
}
