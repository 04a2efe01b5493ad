//! global_least_request in the plain-Envoy build: there is no Redis host call there, so the
//! counts are per proxy, in shared data (every worker VM sees them, counts.rs), updated with
//! CAS and given back at stream end. Each request counts its `costMode` weight (the body's
//! bytes or estimated tokens: such routes hold the request for its body).

use super::counts::{counts_key, take, Admission, Refused, Took};
use super::lease::{LeaseMemory, LocalLease};
use crate::balancer::events::{Decision, Placement, PromptRead, Rejection};
use crate::balancer::pick::{class_cap, cost_of, Booking};
use crate::balancer::policies::continuation::{self, Record, Store, Table};
use crate::balancer::policies::policy::{priority_class, Env, Input, Policy};
use crate::balancer::policies::session::{self, Body, Identity, Kind, Sticky};
use crate::balancer::telemetry::Telemetry;
use crate::balancer::waiters;
use crate::config::{Class, RouteConfig};
use crate::config::{SESSION_MAX_IMBALANCE, SESSION_MAX_IMBALANCE_RATIO};
use crate::host::{Host, HostError, LogLevel};
use crate::prefix::chwbl::Ring;
use crate::reason::{Cause, Reason};
use crate::stats::Counter;
use std::rc::Rc;

/// global_least_request without Redis; with sessions (configured or agents'), the ring of
/// the route's endpoints, built once, and with agent sessions this proxy's table of responses
/// (continuation.rs).
pub struct LocalLeastRequest {
    ring: Option<Ring>,
    table: Option<Rc<Table>>,
}

impl LocalLeastRequest {
    /// `position`: the config's place among the plugin's route configs (its table's name).
    pub fn new(position: usize, config: &RouteConfig) -> LocalLeastRequest {
        let sticky = config.session.is_some() || config.agents.is_some();
        LocalLeastRequest {
            ring: sticky.then(|| Ring::new(&config.endpoints)),
            table: config
                .agents
                .as_ref()
                .map(|_| Rc::new(Table::new(position, config))),
        }
    }
}

impl Policy for LocalLeastRequest {
    fn decide(&mut self, host: &mut dyn Host, env: Env, input: &Input) -> Decision {
        let sessions = Sessions {
            ring: self.ring.as_ref(),
            table: self.table.as_ref(),
        };
        decide(host, env, input, sessions)
    }
}

/// What a plain-Envoy route keeps for sessions: the endpoints' ring (None: the route names no
/// session) and, with agent sessions, its table of responses.
#[derive(Clone, Copy)]
pub struct Sessions<'a> {
    pub ring: Option<&'a Ring>,
    pub table: Option<&'a Rc<Table>>,
}

impl Sessions<'_> {
    /// How a request whose answer is to be recorded records it (`answer`).
    pub fn record(&self, config: &RouteConfig, answer: bool) -> Option<Record> {
        let (table, agents) = (self.table?, config.agents.as_ref()?);
        answer.then(|| Record {
            store: Store::Local(table.clone()),
            ttl_s: agents.ttl_s,
        })
    }

    /// A continuation's pod, by its position among `endpoints`: the pod this proxy recorded as
    /// the producer of its previous response, if still listed. None (counted): unknown here.
    pub fn continued(
        &self,
        host: &mut dyn Host,
        tel: &Telemetry,
        sticky: &Sticky,
        endpoints: &[String],
    ) -> Option<usize> {
        let now = host.now_ms();
        let found = self
            .table
            .and_then(|t| t.lookup(&*host, &sticky.id, now))
            .and_then(|tag| continuation::resolve(tag, endpoints));
        if found.is_none() {
            tel.inc(host, Counter::ContinuationUnknown);
        }
        found
    }
}

/// A plain-Envoy least-request decision; `sessions`: the route's ring and table.
pub fn decide(host: &mut dyn Host, env: Env, input: &Input, sessions: Sessions) -> Decision {
    let endpoints = &input.config.endpoints;
    if endpoints.is_empty() {
        return Decision::Fallback(Cause::NoHealthyEndpoint);
    }
    // The class first: a sticky request is held to its class cap like any other.
    let class = priority_class(host, env.tel, input.ctx, input.config);
    // A waiting request's retry cannot read its held body again: it keeps the session its
    // first decision read (`sessionBodyField`, agents' body fields), as prefix_cache keeps its
    // prompt.
    let who = match input.read {
        Some(r) => Identity {
            sticky: r.session.clone(),
            answer: r.answer,
        },
        None => {
            let body = Body::of(input.read_body, input.body_bytes);
            session::identify(host, env.tel, input.config, body)
        }
    };
    let record = sessions.record(input.config, who.answer);
    if let (Some(ring), Some(sticky)) = (sessions.ring, who.sticky) {
        let home = match sticky.kind {
            Kind::Continuation => sessions.continued(host, env.tel, &sticky, endpoints),
            Kind::Configured | Kind::Agent => ring.walk(session::ring_key(&sticky.id)).next(),
        };
        if let Some(home) = home {
            let decision = match self::sticky(host, env, input, (ring, home, &sticky), class) {
                Decision::Reject(rejection) if rejection.may_wait() => {
                    let read = input.read.cloned().unwrap_or_else(|| {
                        Rc::new(PromptRead {
                            keys: Vec::new(),
                            anchor: 0,
                            session: Some(sticky),
                            answer: who.answer,
                            tokens: Default::default(),
                            prefix_bytes: Vec::new(),
                        })
                    });
                    Decision::Refused { rejection, read }
                }
                other => other,
            };
            return continuation::hold(decision, record);
        }
    }
    continuation::hold(least(host, env, input, class), record)
}

/// The least-loaded endpoint of this proxy's counts.
fn least(host: &mut dyn Host, env: Env, input: &Input, class: Option<Class>) -> Decision {
    let endpoints = &input.config.endpoints;
    let key = counts_key(endpoints);
    let start = env.rng.next_u64();
    let base_cap = input.config.common.max_load;
    let cap = class_cap(input.config, class);
    let cost = cost_of(input.config, input.body_bytes);
    let admission = Admission::of(host, input.config, class);
    let above = waiting_above(host, input, class);
    let picked = take(host, &key, endpoints, cost, &admission, |loads, out| {
        if waiters::outranked(loads, cap, admission.pool_cap, cost, above) {
            return None;
        }
        let order = least_first(loads, start, out);
        let best = *order.first()?;
        let load = loads.get(best).copied().unwrap_or(0);
        if cap > 0 && load >= cap {
            return None;
        }
        Some((best, (order, load)))
    });
    match picked {
        Ok(Ok(Some(took))) => {
            let (order, load) = &took.value;
            if base_cap > 0 && *load >= base_cap {
                // Only the highest class gets past `maxRequestCount`: its headroom.
                env.tel.inc(host, Counter::PriorityAdmittedHeadroom);
            }
            let Some(address) = endpoints.get(took.at).cloned() else {
                return Decision::Fallback(Cause::NoHealthyEndpoint);
            };
            let fallbacks = order
                .iter()
                .skip(1)
                .filter_map(|&e| endpoints.get(e).cloned())
                .collect();
            let lease = counted(
                host,
                env.tel,
                (key, address),
                cost,
                &admission,
                (&took, None),
            );
            routed(lease, fallbacks, Reason::LeastRequest)
        }
        Ok(Ok(None)) => no_room(class),
        Ok(Err(refused)) => refusal(host, env.tel, refused, class),
        Err(e) => shared_data_failed(host, env.tel, input.ctx, &admission, &e),
    }
}

/// The count a plain-Envoy pick `took`: `cost` at `address` in the counts under `key`, with
/// the request's tenant, its prefill `booking` and what its release teaches failure memory;
/// a pick that found every endpoint ejected is counted `ai_lb.eject.fail_open`.
pub fn counted<T>(
    host: &mut dyn Host,
    tel: &Telemetry,
    (key, address): (Rc<str>, String),
    cost: u64,
    admission: &Admission,
    (took, booking): (&Took<T>, Option<Booking>),
) -> LocalLease {
    if took.fail_open {
        tel.inc(host, Counter::EjectedFailOpen);
    }
    LocalLease {
        key,
        endpoint: address,
        cost,
        tenant: admission.tenant.as_ref().map(|(id, _)| id.clone()),
        memory: admission.ejection.on().then_some(LeaseMemory {
            rules: admission.ejection,
            pool: admission.pool,
            trial: took.trial,
        }),
        failed: false,
        booking,
    }
}

/// Routed to `lease`'s endpoint, holding its count until stream end.
pub fn routed(lease: LocalLease, fallbacks: Vec<String>, reason: Reason) -> Decision {
    Decision::Route {
        place: Placement::on(lease.endpoint.clone()).with_fallbacks(fallbacks),
        hold: Some(Box::new(lease)),
        reason,
    }
}

/// Waiting queue with priority classes: how many requests of a higher class than `class` wait
/// in this proxy (docs/sessions-and-queues.md "Waiting queue"); they hold back the room they wait for. 0 without a
/// queue.
pub fn waiting_above(host: &dyn Host, input: &Input, class: Option<Class>) -> u64 {
    match (input.config.common.queue, class) {
        (Some(_), Some(c)) if c.rank > 0 => {
            waiters::above(host, &waiters::key(&input.config.endpoints), c.rank)
        }
        _ => 0,
    }
}

/// No endpoint had room: a request with a priority class was shed at its class cap
/// (`shed_priority`), any other refused at `maxRequestCount`.
pub fn no_room(class: Option<Class>) -> Decision {
    if class.is_some() {
        Decision::Reject(Rejection::ShedPriority)
    } else {
        Decision::Reject(Rejection::MaxRequestCount)
    }
}

/// The pool cap or the tenant's share refused the request (nothing was counted): the pool
/// cap answers as the endpoint cap does (`shed_priority` with a class, else
/// `maxRequestCount`), the tenant's share with `shed_tenant`.
pub fn refusal(
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
pub fn shared_data_failed(
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
/// same pod without talking (docs/redis-data-model.md §10); a continuation's `home` is instead
/// the pod this proxy recorded for its previous response. It walks on (home first, then the
/// ring) past a pod over the guard Redis applies (the cap, or busier than this proxy's
/// least-loaded pod by more than 8 and 1.5 times) or ejected by failure memory (health.rs):
/// `session_rebound`.
fn sticky(
    host: &mut dyn Host,
    env: Env,
    input: &Input,
    (ring, home, sticky): (&Ring, usize, &Sticky),
    class: Option<Class>,
) -> Decision {
    let endpoints = &input.config.endpoints;
    let key = session::ring_key(&sticky.id);
    let walk = || std::iter::once(home).chain(ring.walk(key).filter(move |&e| e != home));
    let base_cap = input.config.common.max_load;
    let cap = class_cap(input.config, class);
    let cost = cost_of(input.config, input.body_bytes);
    let counts = counts_key(endpoints);
    let admission = Admission::of(host, input.config, class);
    let above = waiting_above(host, input, class);
    let picked = take(host, &counts, endpoints, cost, &admission, |loads, out| {
        if waiters::outranked(loads, cap, admission.pool_cap, cost, above) {
            return None;
        }
        let min = loads.iter().copied().min().unwrap_or(0) as f64;
        let ok = |e: usize| {
            let load = loads.get(e).copied().unwrap_or(0);
            // As the script's cap: an idle endpoint takes a request whatever its cost (a
            // costly sticky request was refused 429 by every idle pod).
            let over_cap = cap > 0 && load > 0 && load.saturating_add(cost) > cap;
            let load = load as f64;
            let imbalanced = load - min > SESSION_MAX_IMBALANCE as f64
                && load > min * SESSION_MAX_IMBALANCE_RATIO;
            !over_cap && !imbalanced && !out.get(e).copied().unwrap_or(false)
        };
        walk()
            .find(|&e| ok(e))
            .map(|e| (e, loads.get(e).copied().unwrap_or(0)))
    });
    match picked {
        Ok(Ok(Some(took))) => {
            let (chosen, load) = (took.at, took.value);
            if base_cap > 0 && load >= base_cap {
                // Only the highest class gets past `maxRequestCount`: its headroom.
                env.tel.inc(host, Counter::PriorityAdmittedHeadroom);
            }
            let Some(address) = endpoints.get(chosen).cloned() else {
                return Decision::Fallback(Cause::NoHealthyEndpoint);
            };
            let (reason, counter) = if home == chosen {
                (sticky.kept(), Counter::SessionHit)
            } else {
                (Reason::SessionRebound, Counter::SessionRebound)
            };
            env.tel.inc(host, counter);
            let fallbacks = walk()
                .filter(|&e| e != chosen)
                .filter_map(|e| endpoints.get(e).cloned())
                .take(16)
                .collect();
            let lease = counted(
                host,
                env.tel,
                (counts, address),
                cost,
                &admission,
                (&took, None),
            );
            routed(lease, fallbacks, reason)
        }
        Ok(Ok(None)) => no_room(class),
        Ok(Err(refused)) => refusal(host, env.tel, refused, class),
        Err(e) => {
            env.tel.inc(host, Counter::SessionFallback);
            shared_data_failed(host, env.tel, input.ctx, &admission, &e)
        }
    }
}

/// Endpoint positions by load, ties rotated by `start` so equal endpoints share the traffic;
/// the ones failure memory passes over (`out`) come last (a pod that fails fast or stopped
/// answering holds little, so it would otherwise be first every time), still there as
/// fallbacks (docs/plain-envoy.md "Failure memory").
fn least_first(loads: &[u64], start: u64, out: &[bool]) -> Vec<usize> {
    let n = loads.len().max(1);
    let offset = (start % n as u64) as usize;
    let mut v: Vec<(bool, u64, usize, usize)> = loads
        .iter()
        .enumerate()
        .map(|(i, &load)| {
            let passed = out.get(i).copied().unwrap_or(false);
            (passed, load, (i + n - offset) % n, i)
        })
        .collect();
    v.sort_unstable();
    v.into_iter().map(|(_, _, _, i)| i).collect()
}
