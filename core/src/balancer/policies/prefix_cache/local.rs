//! prefix_cache in the plain-Envoy build (docs/redis-data-model.md §9). There is no Redis host
//! call there, so:
//! - the prefix index is per proxy, in shared data (prefix/local_index.rs): each request's
//!   conversation keys (its anchor and deepest keys) → the endpoint it was sent to;
//! - a request whose conversation the index does not know goes where consistent hashing with
//!   bounded loads puts its anchor key (prefix/chwbl.rs). Every proxy computes the same, so
//!   replicas that share nothing send a conversation to the same pod while it is within the
//!   bound;
//! - the load is this proxy's in-flight load, counted by local least-request's own path
//!   (`least_request::counts::take`: the same record, the same `costMode` weight) and held as a
//!   `LocalLease` holding: stream end gives it back on the existing path;
//! - with a metrics guard configured (`scrapeCluster`), the scraped engine metrics count too: a
//!   pod whose queue or KV cache is saturated is left, and not chosen while another pod is not;
//! - a request naming a session (`sessionHeader`, ...) goes to the first endpoint of its session
//!   id's walk over the same ring, ahead of any prefix match, unless that pod is over the guard
//!   (then it is placed as without a session, past that pod: `session_rebound`;
//!   docs/redis-data-model.md §10).
//!
//! A body that is not a usable prompt (or too large to read) gets a plain-Envoy least-request
//! pick.

use super::expect::{Expect, Index};
use super::gate::{self, Verdict};
use super::index::LocalPrefix;
use super::latency::local::{by_latency, placed, sheddable, LocalLatency};
use super::latency::Timed;
use super::prompt::{keeping, read_prompt, window};
use super::verified::{Corrects, Verified};
use crate::balancer::events::{Decision, Placement, Rejection};
use crate::balancer::holding::Holding;
use crate::balancer::pick::{class_cap, cost_of, Booking};
use crate::balancer::policies::continuation::{self, Table};
use crate::balancer::policies::least_request::{counts, local as least};
use crate::balancer::policies::policy::{priority_class, Env, Input, Policy};
use crate::balancer::policies::session::{self, Kind};
use crate::balancer::redis_client::RedisClient;
use crate::balancer::telemetry::Telemetry;
use crate::config::{Build, PrefixSettings, RouteConfig};
use crate::host::Host;
use crate::latency::choose::draw;
use crate::latency::{Choice, Features, Prediction, Rule};
use crate::reason::{Cause, Reason};
use crate::redis::scripts::{Booked, Predicted};
use crate::stats::Counter;
use crate::verify::flush::Flushes;
use std::cell::RefCell;
use std::rc::Rc;

/// The most fallbacks a route publishes (`fallbackCount` ≤ 16).
const MAX_FALLBACKS: usize = 16;

/// prefix_cache without Redis: the route's settings and its index, built at configure.
pub struct LocalPrefixCache {
    settings: PrefixSettings,
    /// Shared with the requests it verifies (verified.rs corrects it).
    state: Rc<LocalPrefix>,
    /// The engine-verified index's emptied-pod rule, per route (verified.rs).
    flushes: Rc<RefCell<Flushes>>,
    /// With agent sessions: this proxy's responses (continuation.rs).
    table: Option<Rc<Table>>,
    /// Latency-aware placement (`latencyModel`; latency/local.rs).
    latency: Option<LocalLatency>,
}

impl LocalPrefixCache {
    /// `position`: the config's place among the plugin's route configs (global first), so each
    /// route keeps its own index.
    pub fn new(position: usize, config: &RouteConfig, settings: &PrefixSettings) -> Self {
        LocalPrefixCache {
            settings: settings.clone(),
            state: Rc::new(LocalPrefix::new(position, config, settings)),
            flushes: Rc::default(),
            table: config
                .agents
                .as_ref()
                .map(|_| Rc::new(Table::new(position, config))),
            latency: settings
                .latency
                .filter(|_| Build::has(Build::Envoy))
                .map(|l| LocalLatency::new(position, config, l, settings.gate.start_rate())),
        }
    }
}

impl Policy for LocalPrefixCache {
    fn decide(&mut self, host: &mut dyn Host, env: Env, input: &Input) -> Decision {
        let verify = (self.flushes.clone(), Corrects::Local(self.state.clone()));
        let sessions = least::Sessions {
            ring: Some(&self.state.ring),
            table: self.table.as_ref(),
        };
        decide(
            host,
            env,
            input,
            (
                &self.settings,
                self.latency.as_mut().filter(|_| Build::has(Build::Envoy)),
            ),
            (&self.state, verify, sessions),
        )
    }

    /// The root tick: the latency models' merge across this proxy's workers.
    fn tick(&mut self, host: &mut dyn Host, tel: &mut Telemetry, _redis: &mut RedisClient) {
        match &mut self.latency {
            Some(l) if Build::has(Build::Envoy) => l.tick(host, tel),
            _ => {}
        }
    }
}

/// `latency`: the route's latency models (None: the token gate places); `verify`: where a
/// verified answer's shortfall is judged and corrected; `sessions`: the route's ring and
/// responses.
fn decide(
    host: &mut dyn Host,
    env: Env,
    input: &Input,
    (settings, mut latency): (&PrefixSettings, Option<&mut LocalLatency>),
    (state, verify, sessions): (
        &LocalPrefix,
        (Rc<RefCell<Flushes>>, Corrects),
        least::Sessions,
    ),
) -> Decision {
    let endpoints = &input.config.endpoints;
    if endpoints.is_empty() {
        return Decision::Fallback(Cause::NoHealthyEndpoint);
    }
    // A waiting request's retry decides with what its first decision read (the held body is
    // not readable outside its callback), and leaves the body as it is: the usage request is
    // added only to a body read in its own callback (docs/sessions-and-queues.md).
    let (read, with_usage) = match input.read {
        Some(read) => (read.clone(), None),
        None if input.read_body => match read_prompt(
            host,
            env.tel,
            input,
            (settings, settings.verify || latency.is_some()),
        ) {
            Some((read, with_usage)) => (Rc::new(read), with_usage),
            None => return least::decide(host, env, input, sessions),
        },
        None => return least::decide(host, env, input, sessions),
    };
    let (keys, at) = (&read.keys, read.anchor);
    let Some(&home) = keys.get(at) else {
        return least::decide(host, env, input, sessions);
    };
    let home = u64::from_le_bytes(home);
    let window = window(keys.len(), at);
    // One clock read: the index's ms and the latency models' µs.
    let now_us = host.now_us();
    let now = now_us / 1000;
    let tags = state.tags(host);
    let known = state.lookup(host, keys, &window, now, &tags);
    let hot = match &settings.guard {
        Some(mc) => env.metrics.saturated(host, input.config, mc),
        None => Vec::new(),
    };
    let sticky = read.session.as_ref();
    let session = sticky.and_then(|s| match s.kind {
        Kind::Continuation => sessions.continued(host, env.tel, s, endpoints),
        Kind::Configured | Kind::Agent => state.ring.walk(session::ring_key(&s.id)).next(),
    });
    let record = sessions.record(input.config, read.answer);
    let class = priority_class(host, env.tel, input.ctx, input.config);
    let cap = class_cap(input.config, class);
    let cost = cost_of(input.config, input.body_bytes);
    let admission = counts::Admission::of(host, input.config, class);
    let above = least::waiting_above(host, input, class);
    let tokens = &read.tokens;
    // Placed by the latency models (latency/local.rs) when they predict well: the rule of
    // the Redis build's script, over this proxy's counts and bookings. None: the token gate.
    let rule = match latency.as_deref_mut() {
        Some(l) => l.objectives(host, env.tel, input.ctx).map(|o| Rule {
            slo_ttft_ms: o.ttft_ms,
            slo_tpot_ms: o.tpot_ms,
            penalty_ms: settings.gate.penalty_ms,
            shed_draw: sheddable(input.config, class).then(|| draw(env.rng.next_u64())),
        }),
        None => None,
    };
    let latency: Option<&LocalLatency> = latency.map(|l| &*l);
    let mut shed = None;
    let taken = counts::take_booking(
        host,
        &state.counts_key,
        endpoints,
        cost,
        &admission,
        true,
        |loads, out, prefill| {
            // This attempt's verdict only (a lost CAS runs the choice again).
            shed = None;
            if crate::balancer::waiters::outranked(loads, cap, admission.pool_cap, cost, above) {
                return None;
            }
            // The endpoints failure memory passes over are left as saturated ones are: the
            // match's and the session's guard, the walk, the gate's cold candidates
            // (docs/plain-envoy.md "Failure memory").
            let merged: Vec<bool>;
            let hot: &[bool] = if out.is_empty() {
                &hot
            } else {
                merged = (0..endpoints.len())
                    .map(|e| {
                        hot.get(e).copied().unwrap_or(false) || out.get(e).copied().unwrap_or(false)
                    })
                    .collect();
                &merged
            };
            let modelled = match (latency, &rule, prefill) {
                (Some(l), Some(rule), Some(p)) => {
                    let view = (loads, p.booked.as_slice(), hot, cap);
                    by_latency(l, rule, state, view, (known, session, tokens))
                }
                _ => None,
            };
            let choice = match modelled {
                Some(Choice::Shed(p)) => {
                    shed = Some(p);
                    return None;
                }
                Some(Choice::Place(e, p)) => Some((e, placed(e, known, session), false, Some(p))),
                None => {
                    // The token gate (gate.rs) over a match the session does not override.
                    let open = |e: usize| {
                        let room = cap == 0 || loads.get(e).is_some_and(|&l| l < cap);
                        room && !hot.get(e).copied().unwrap_or(false)
                    };
                    let verdict = match (known, session, prefill) {
                        (Some(k), None, Some(p)) => gate::judge(
                            &settings.gate,
                            tokens.total,
                            tokens.through(k.depth),
                            k.endpoint,
                            p,
                            open,
                        ),
                        _ => Verdict::Keep,
                    };
                    match verdict {
                        Verdict::Spill(cold) => Some((cold, Reason::PrefixSpill, false, None)),
                        v => state
                            .choose(
                                loads,
                                cost,
                                cap,
                                hot,
                                known,
                                home,
                                session,
                                v == Verdict::Keep,
                            )
                            .map(|(e, reason, passed)| (e, reason, passed, None)),
                    }
                }
            };
            choice.map(|(e, reason, passed, predicted)| {
                let cached = known
                    .filter(|k| k.endpoint == e)
                    .map_or(0, |k| tokens.through(k.depth));
                let booked = Booked {
                    ahead: prefill.and_then(|p| p.booked.get(e).copied()).unwrap_or(0),
                    tokens: tokens.total.saturating_sub(cached),
                    predicted: predicted.map(|p: Prediction| Predicted {
                        ttft_us: (p.ttft_ms * 1000.0) as u64,
                        tpot_us: (p.tpot_ms * 1000.0) as u64,
                    }),
                };
                let load = loads.get(e).copied().unwrap_or(0);
                (e, (reason, passed, booked, load), booked.tokens)
            })
        },
    );
    match taken {
        Ok(Ok(Some(took))) => {
            let (chosen, (reason, passed, booked, load)) = (took.at, took.value);
            let Some(address) = endpoints.get(chosen).cloned() else {
                return Decision::Fallback(Cause::NoHealthyEndpoint);
            };
            if passed {
                env.tel.inc(host, Counter::PrefixSaturated);
            }
            let reason = match (reason, sticky) {
                (Reason::Session, Some(s)) => {
                    env.tel.inc(host, Counter::SessionHit);
                    s.kept()
                }
                (Reason::SessionRebound, _) => {
                    env.tel.inc(host, Counter::SessionRebound);
                    reason
                }
                (reason, _) => reason,
            };
            state.record(
                host, env.tel, input.ctx, keys, &window, known, chosen, now, &tags,
            );
            let mut expect = None;
            if settings.verify && !read.prefix_bytes.is_empty() {
                let mut e = Expect::new(
                    read.prefix_bytes.clone(),
                    read.tokens.total,
                    with_usage.is_some(),
                    Index::Local {
                        keys: keys.clone(),
                        window: window.clone(),
                    },
                );
                // A known prefix ends at its key's block; an unknown one predicts nothing.
                e.matched = Some(
                    known
                        .filter(|k| k.endpoint == chosen)
                        .map_or(0, |k| k.depth + 1),
                );
                expect = Some(e);
            }
            let fallbacks = state
                .ring
                .walk(home)
                .filter(|&e| e != chosen)
                .take(MAX_FALLBACKS)
                .filter_map(|e| endpoints.get(e).cloned())
                .collect();
            let booking = (booked.tokens > 0).then_some(Booking {
                booked,
                since_ms: now,
                timed: tokens.stream,
            });
            let key = state.counts_key.clone();
            let lease = least::counted(
                host,
                env.tel,
                (key, address),
                cost,
                &admission,
                (&took, booking),
            );
            let endpoint = lease.endpoint.clone();
            let mut held: Box<dyn Holding> = Box::new(lease);
            let verified = expect.is_some();
            if let Some(expect) = expect {
                held = Box::new(Verified::new(held, endpoint.clone(), expect, verify));
            }
            // The usage request goes out only with a holding that takes its event out again.
            let body = with_usage.filter(|_| verified || latency.is_some());
            if let Some(l) = latency {
                let features = Features {
                    ahead_tokens: booked.ahead as f64,
                    uncached_tokens: booked.tokens as f64,
                    running: load as f64,
                    prompt_tokens: tokens.total as f64,
                };
                let pick = (endpoint.clone(), features, booked.predicted);
                let timing = (tokens.stream, now_us, body.is_some() && !verified);
                held = Box::new(Timed::new(held, l.shared.clone(), pick, timing));
            }
            let decision = Decision::Route {
                hold: Some(held),
                place: Placement {
                    body,
                    ..Placement::on(endpoint).with_fallbacks(fallbacks)
                },
                reason,
            };
            continuation::hold(decision, record)
        }
        Ok(Ok(None)) if shed.is_some() => Decision::Reject(Rejection::ShedLatency),
        Ok(Ok(None)) => keeping(least::no_room(class), read),
        Ok(Err(refused)) => keeping(least::refusal(host, env.tel, refused, class), read),
        Err(e) => {
            if session.is_some() {
                env.tel.inc(host, Counter::SessionFallback);
            }
            least::shared_data_failed(host, env.tel, input.ctx, &admission, &e)
        }
    }
}
