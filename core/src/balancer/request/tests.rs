//! The request state machine alone: events in, effects out, no host. The last test drives
//! random event sequences and checks the rule the module exists for: every acquire is
//! released exactly once, whatever order things happen in.

use super::*;
use crate::balancer::holding::Holding;
use crate::balancer::policies::cluster_metrics::pick::ServicePick;
use crate::balancer::policies::cluster_metrics::reply::{counted, counted_reply};
use crate::balancer::policies::cluster_metrics::ServiceLease;
use crate::balancer::policies::continuation::{Continued, Record, Store};
use crate::balancer::policies::least_request::lease::{LeaseMemory, LocalLease};
use crate::balancer::policies::least_request::pick::EndpointPick;
use crate::balancer::policies::prefix_cache::expect::{Expect, Index};
use crate::balancer::policies::prefix_cache::verified::{Corrects, Verified, VerifyReply};
use crate::balancer::policies::session::Kind as SessionKind;
use crate::balancer::publish::{Placed, Placement, Role};
use crate::config::PluginConfig;
use crate::hash::SplitMix64;
use crate::redis::inflight::InflightKeys;
use crate::redis::scripts::PrefixChain;
use crate::redis::scripts::SessionState;
use crate::stats::Counter;
use crate::stats::Outcome as Decided;

fn config(extra: &str) -> Rc<RouteConfig> {
    let json = format!(
        r#"{{"lb_policy":"global_least_request","lb_config":{{"serviceFQDN":"redis.static","servicePort":6379{extra}}}}}"#
    );
    PluginConfig::parse(json.as_bytes())
        .unwrap()
        .global
        .unwrap()
}

fn keys() -> Rc<Keys> {
    Rc::new(Keys::new("ailb", "chat", "outbound|80||llm"))
}

fn request(extra: &str) -> Request {
    Request::new(config(extra), Some(keys()))
}

fn pick(config: &Rc<RouteConfig>, id: &str) -> Box<dyn Pick> {
    Box::new(EndpointPick {
        config: config.clone(),
        keys: keys(),
        request_id: id.into(),
        cost: 1,
        candidates: Rc::new(vec!["10.0.0.1:80".into(), "10.0.0.2:80".into()]),
        fingerprint: "fp".into(),
        sent_list: false,
        by_sha: true,
        chain: None,
        planned_ms: 0,
        cap: config.common.max_load,
        class: None,
        session: None,
        session_kind: SessionKind::Configured,
        session_ttl_s: 0,
        record: None,
        wait_rank: None,
        pool_cap: 0,
        tenant: None,
        wrap: None,
        latency: None,
    })
}

/// Headers and a complete body: the request asks to decide, with the body.
fn to_decision(r: &mut Request) {
    assert!(r
        .handle(Event::Headers {
            end_of_stream: false,
            withheld: false,
        })
        .is_empty());
    assert!(r.phase().is_held() && r.phase().wants_body());
    assert!(r
        .handle(Event::Body {
            size: 10,
            end_of_stream: false
        })
        .is_empty());
    let e = r.handle(Event::Body {
        size: 20,
        end_of_stream: true,
    });
    assert!(matches!(e.as_slice(), [Effect::Decide { read_body: true }]));
    assert_eq!(r.body_bytes, 20);
}

/// Decided to acquire, sent under `token`.
fn to_picking(r: &mut Request, token: u32) {
    to_decision(r);
    let p = pick(&r.config, "rid");
    let e = r.handle(Event::Decided(Decision::Acquire(p)));
    let [Effect::Send(p)] = <[Effect; 1]>::try_from(e).unwrap() else {
        panic!("expected one send")
    };
    assert!(r
        .handle(Event::Sent {
            result: Ok(token),
            pick: p
        })
        .is_empty());
    assert!(r.phase().awaits(token) && !r.phase().awaits(token + 1) && r.phase().is_held());
}

fn picked(endpoint: &str) -> Event {
    Event::PickReply(PickReply::Picked {
        endpoint: endpoint.into(),
        depth: 0,
        spilled: false,
        session: SessionState::None,
        load_before: Some(0),
        booked: None,
        all_ejected: false,
    })
}

fn released(effects: &[Effect]) -> Vec<String> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::GiveBack { held, .. } => Some(held.ledger()),
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn a_routed_pick_publishes_then_releases_at_stream_end() {
    let mut r = request("");
    to_picking(&mut r, 7);
    let e = r.handle(picked("10.0.0.2:80"));
    assert!(matches!(
        e.as_slice(),
        [Effect::Synced { .. }, Effect::Publish(p)] if p.to.endpoint == "10.0.0.2:80"
    ));
    assert!(!r.phase().is_held(), "a routed request is no longer held");
    let e = r.handle(Event::Published(Ok(())));
    assert!(matches!(
        e.as_slice(),
        [Effect::Count(Counter::Decision(_, Decided::Routed))]
    ));
    assert_eq!(
        r.phase().describe(),
        (Some("10.0.0.2:80"), Reason::LeastRequest)
    );
    let done = r.finish(0);
    assert!(
        matches!(&done, Some(Effect::GiveBack { held, .. }) if held.ledger() == ["rid|10.0.0.2:80|1"])
    );
}

#[test]
fn a_failed_publish_releases_and_falls_back() {
    let mut r = request("");
    to_picking(&mut r, 7);
    r.handle(picked("10.0.0.1:80"));
    let e = r.handle(Event::Published(Err(Cause::OverrideFailed)));
    assert_eq!(released(&e), ["rid|10.0.0.1:80|1"]);
    assert!(e.iter().any(|x| matches!(
        x,
        Effect::FellBack {
            cause: Cause::OverrideFailed,
            denied: false
        }
    )));
    assert!(r.finish(0).is_none(), "nothing left to give back");
}

#[test]
fn a_reply_naming_an_endpoint_we_did_not_offer_is_released() {
    let mut r = request("");
    to_picking(&mut r, 7);
    let e = r.handle(picked("10.9.9.9:80"));
    assert_eq!(released(&e), ["rid|10.9.9.9:80|1"]);
    assert!(matches!(e.first(), Some(Effect::Unsynced { .. })));
    assert!(r.finish(0).is_none());
}

#[test]
fn resync_and_noscript_resend_once_then_fall_back() {
    for reply in [PickReply::Resync, PickReply::NoScript] {
        let mut r = request("");
        to_picking(&mut r, 7);
        let e = r.handle(Event::PickReply(reply.clone()));
        let Some(Effect::Send(p)) = e.into_iter().last() else {
            panic!("{reply:?}: expected a resend")
        };
        let Some(ep) = p.as_any().downcast_ref::<EndpointPick>() else {
            panic!("an endpoint pick")
        };
        assert!(ep.sent_list || !ep.by_sha);
        assert!(r.phase().is_held(), "still held while resending");
        r.handle(Event::Sent {
            result: Ok(11),
            pick: p,
        });
        let e = r.handle(Event::PickReply(reply.clone()));
        assert!(
            e.iter().any(|x| matches!(x, Effect::FellBack { .. })),
            "{reply:?}"
        );
        assert!(!r.phase().is_held() && r.finish(0).is_none());
    }
}

#[test]
fn a_lost_reply_releases_every_possible_lease_other_failures_nothing() {
    let mut r = request("");
    to_picking(&mut r, 7);
    let e = r.handle(Event::PickReply(PickReply::Failed(Cause::RedisTimeout)));
    assert!(
        matches!(e.first(), Some(Effect::ReleaseAll(p)) if p.as_any().downcast_ref::<EndpointPick>().is_some_and(|ep| ep.every_lease().len() == 2))
    );
    let mut r = request("");
    to_picking(&mut r, 7);
    let e = r.handle(Event::PickReply(PickReply::Failed(Cause::RedisError)));
    assert!(!e
        .iter()
        .any(|x| matches!(x, Effect::ReleaseAll(_) | Effect::GiveBack { .. })));
}

#[test]
fn full_rejects_with_429_and_holds_nothing() {
    let mut r = request("");
    to_picking(&mut r, 7);
    let e = r.handle(Event::PickReply(PickReply::Full));
    assert!(e
        .iter()
        .any(|x| matches!(x, Effect::Reply(LocalReply { status: 429, .. }))));
    assert!(r.phase().replied() && r.finish(0).is_none());
}

#[test]
fn stream_end_during_the_pick_orphans_it_and_undo_releases_on_arrival() {
    let mut r = request("");
    to_picking(&mut r, 7);
    let Some(Effect::Orphan { token: 7, pick }) = r.finish(0) else {
        panic!("expected an orphan")
    };
    let reply = PickReply::Picked {
        endpoint: "10.0.0.1:80".into(),
        depth: 0,
        spilled: false,
        session: SessionState::None,
        load_before: Some(0),
        booked: None,
        all_ejected: false,
    };
    assert_eq!(released(&undo(pick.clone(), &reply)), ["rid|10.0.0.1:80|1"]);
    let lost = undo(pick.clone(), &PickReply::Failed(Cause::RedisTimeout));
    assert!(lost.iter().any(|x| matches!(x, Effect::ReleaseAll(_))));
    assert_eq!(
        undo(pick, &PickReply::Full).len(),
        1,
        "only the orphan counter"
    );
}

#[test]
fn oversized_bodies_are_decided_without_reading_them() {
    let mut r = request(r#","maxBodyBytes":100"#);
    r.handle(Event::Headers {
        end_of_stream: false,
        withheld: false,
    });
    let e = r.handle(Event::Body {
        size: 101,
        end_of_stream: false,
    });
    assert!(matches!(
        e.as_slice(),
        [
            Effect::NoBody(Cause::BodyTooLarge),
            Effect::Decide { read_body: false }
        ]
    ));
}

#[test]
fn deny_mode_answers_503_and_the_request_stays_stopped() {
    let mut r = request(r#","failureMode":"deny""#);
    to_decision(&mut r);
    let e = r.handle(Event::Decided(Decision::Fallback(Cause::NoHealthyEndpoint)));
    assert!(e
        .iter()
        .any(|x| matches!(x, Effect::Reply(LocalReply { status: 503, .. }))));
    assert!(r.phase().replied());
    assert_eq!(
        r.phase().describe(),
        (None, Reason::Fallback(Cause::NoHealthyEndpoint))
    );
}

#[test]
fn no_route_names_fall_back_at_headers_when_redis_needs_them() {
    let mut r = Request::new(config(""), None);
    let e = r.handle(Event::Headers {
        end_of_stream: false,
        withheld: false,
    });
    assert!(e.iter().any(|x| matches!(
        x,
        Effect::FellBack {
            cause: Cause::NoRoute,
            ..
        }
    )));
    assert!(!r.phase().is_held());
}

#[test]
fn local_decisions_give_back_their_count_once() {
    let mut r = request("");
    to_decision(&mut r);
    let local = LocalLease {
        tenant: None,
        memory: Some(LeaseMemory {
            rules: crate::config::Ejection::DEFAULT,
            pool: 2,
            trial: false,
        }),
        failed: false,
        booking: None,
        key: "k".into(),
        endpoint: "10.0.0.1:80".into(),
        cost: 1,
    };
    let e = r.handle(Event::Decided(Decision::Route {
        place: Placement::on("10.0.0.1:80".into()).with_fallbacks(vec!["10.0.0.2:80".into()]),
        reason: Reason::Metrics,
        hold: Some(Box::new(local)),
    }));
    assert!(matches!(e.as_slice(), [Effect::Publish(p)] if p.fallbacks.len() == 1));
    r.handle(Event::Published(Ok(())));
    assert_eq!(r.phase().counted_endpoint(), Some("10.0.0.1:80"));
    let Some(Effect::GiveBack { held, outcome }) = r.finish(9) else {
        panic!("the count given back")
    };
    assert_eq!(held.ledger(), ["local|10.0.0.1:80"]);
    assert_eq!(outcome.and_then(|o| o.end_ms), Some(9));
}

/// The kinds of request the random-order test drives: Redis endpoint picks
/// (global_least_request), the same with prefix_cache's verification wrapped round the lease,
/// a plain-Envoy count (with a prefill booking, verified or not), cluster_metrics counted in
/// this proxy, cluster_metrics with its global in-flight count in Redis, and cluster_hash
/// (which holds nothing).
#[derive(Debug, Clone, Copy)]
enum Kind {
    Endpoint,
    Verified,
    /// A Responses request: its holding (Redis lease, verified or not, a local count, or
    /// nothing as endpoint_metrics holds) wrapped to record its answer's id (continuation.rs).
    Continued,
    Local,
    ServiceLocal,
    ServiceGlobal,
    Hash,
}

/// What was acquired and given back, by name: Redis lease members, global in-flight members
/// and this proxy's service counts (`local`). A lost reply may have acquired anything its
/// pick offered: `lost` counts those, each to be covered by one `ReleaseAll`.
#[derive(Default)]
struct Ledger {
    acquired: Vec<String>,
    released: Vec<String>,
    lost: usize,
    released_all: usize,
    /// First bytes told after the holding was given back.
    late_first_byte: bool,
}

impl Ledger {
    /// An effect that is not answered with an event: note what it gives back or takes.
    fn note(&mut self, effect: Effect) {
        match effect {
            Effect::GiveBack { held, .. } => self.released.extend(held.ledger()),
            Effect::ReleaseAll(_) => self.released_all += 1,
            Effect::Act(act) => self.acquired.extend(act.ledger()),
            // Told while nothing is held: its holding was already given back.
            Effect::FirstBytes if self.released.len() >= self.acquired.len() => {
                self.late_first_byte = true;
            }
            _ => {}
        }
    }

    /// Redis answers `reply` to `pick`: what its script acquired.
    fn answered(&mut self, pick: &dyn Pick, reply: &PickReply) {
        let endpoint = pick.as_any().downcast_ref::<EndpointPick>();
        let service = pick.as_any().downcast_ref::<ServicePick>();
        match (endpoint, service, reply) {
            (Some(p), _, PickReply::Picked { endpoint, .. }) => {
                self.acquired.push(p.lease(endpoint).member)
            }
            (_, Some(p), reply) if counted(reply).is_some() => {
                let service = counted(reply).unwrap_or_default();
                self.acquired.push(p.global(service).member)
            }
            (_, _, PickReply::Failed(Cause::RedisTimeout)) => self.lost += 1,
            _ => {}
        }
    }
}

fn hash_config() -> Rc<RouteConfig> {
    let json = r#"{"lb_type":"cluster","lb_policy":"cluster_hash","lb_config":{"hash_header":"x-user","clusters":[{"cluster":"a","weight":50},{"cluster":"b","weight":50}]}}"#;
    PluginConfig::parse(json.as_bytes())
        .unwrap()
        .global
        .unwrap()
}

fn service_pick(config: &Rc<RouteConfig>, lease: &ServiceLease) -> Box<dyn Pick> {
    Box::new(ServicePick {
        config: config.clone(),
        keys: Rc::new(InflightKeys::new("higress:inflight", "chat")),
        request_id: "rid".into(),
        key_ttl_s: 60,
        candidates: Rc::new(vec![("a".into(), 2.0), ("b".into(), 1.0)]),
        local: "b".into(),
        stats: lease.stats.clone(),
        start_ms: 5,
        by_sha: true,
    })
}

/// A prefix_cache pick whose reply wraps its lease in the verification (verified.rs).
fn verified_pick(config: &Rc<RouteConfig>) -> Box<dyn Pick> {
    let mut p = pick(config, "rid")
        .as_any()
        .downcast_ref::<EndpointPick>()
        .expect("an endpoint pick")
        .clone();
    p.wrap = Some(Box::new(VerifyReply {
        expect: Expect::new(vec![100, 200], 50, true, redis_index(config)),
        flushes: Rc::default(),
        body: Some(b"{\"stream_options\":{\"include_usage\":true}}".to_vec()),
    }));
    Box::new(p)
}

fn redis_index(config: &Rc<RouteConfig>) -> Index {
    Index::Redis {
        config: config.clone(),
        keys: keys(),
        chain: Rc::new(PrefixChain {
            keys: vec!["k0".into(), "k1".into()],
            cached_tokens: vec![25, 50],
            prompt_tokens: 50,
            stream: true,
        }),
        anchor: 0,
    }
}

/// How a Responses request's answer is recorded: in the route's Redis.
fn record(config: &Rc<RouteConfig>) -> Record {
    Record {
        store: Store::Redis {
            config: config.clone(),
            keys: keys(),
        },
        ttl_s: 60,
    }
}

/// A pick whose reply wraps its lease (verified now and then) in the recording.
fn continued_pick(config: &Rc<RouteConfig>, verified: bool) -> Box<dyn Pick> {
    let base = if verified {
        verified_pick(config)
    } else {
        pick(config, "rid")
    };
    let mut p = base
        .as_any()
        .downcast_ref::<EndpointPick>()
        .expect("an endpoint pick")
        .clone();
    p.record = Some(record(config));
    Box::new(p)
}

/// A plain-Envoy count with a prefill booking, verified (prefix_cache) or not.
fn local_holding(config: &Rc<RouteConfig>, verified: bool) -> Box<dyn Holding> {
    let booked = crate::redis::scripts::Booked {
        predicted: None,
        ahead: 0,
        tokens: 50,
    };
    let lease = LocalLease {
        key: "k".into(),
        endpoint: "10.0.0.1:80".into(),
        cost: 1,
        tenant: None,
        memory: None,
        failed: false,
        booking: Some(crate::balancer::pick::Booking {
            booked,
            since_ms: 0,
            timed: true,
        }),
    };
    if !verified {
        return Box::new(lease);
    }
    let expect = Expect::new(vec![100, 200], 50, false, redis_index(config));
    let how = (Rc::default(), Corrects::Redis);
    Box::new(Verified::new(
        Box::new(lease),
        "10.0.0.1:80".into(),
        expect,
        how,
    ))
}

/// A random reply to a pick of `kind`.
fn random_reply(kind: Kind, rng: &mut SplitMix64) -> PickReply {
    let roll = rng.next_u64() % 8;
    match (kind, roll) {
        (Kind::Endpoint | Kind::Verified | Kind::Continued, 0..=2) => picked_reply("10.0.0.2:80"),
        // Not offered.
        (Kind::Endpoint | Kind::Verified | Kind::Continued, 3) => picked_reply("10.9.9.9:80"),
        (Kind::Endpoint | Kind::Verified | Kind::Continued, 4) => PickReply::Resync,
        (Kind::Endpoint | Kind::Verified | Kind::Continued, 5) => PickReply::Full,
        (_, 0..=2) => counted_reply("a"),
        (_, 3) => counted_reply("zzz"), // not offered
        (_, 4) => PickReply::Failed(Cause::RedisError),
        (_, 5) => PickReply::Full, // not a service reply
        (_, 6) => PickReply::NoScript,
        _ => PickReply::Failed(Cause::RedisTimeout),
    }
}

fn picked_reply(endpoint: &str) -> PickReply {
    PickReply::Picked {
        endpoint: endpoint.into(),
        depth: 1,
        spilled: false,
        session: SessionState::None,
        load_before: Some(0),
        booked: None,
        all_ejected: false,
    }
}

/// One request of `kind` with its random history.
struct Run {
    kind: Kind,
    lease: ServiceLease,
    token: u32,
    ledger: Ledger,
}

impl Run {
    /// What the route's policy decides.
    fn decision(&mut self, config: &Rc<RouteConfig>, rng: &mut SplitMix64) -> Decision {
        let roll = rng.next_u64() % 8;
        match self.kind {
            Kind::Endpoint => Decision::Acquire(pick(config, "rid")),
            Kind::Verified => Decision::Acquire(verified_pick(config)),
            Kind::Continued if roll < 4 => Decision::Acquire(continued_pick(config, roll < 2)),
            Kind::Continued => {
                // A local count, verified or not, or nothing held (endpoint_metrics).
                let inner = match roll {
                    4 => None,
                    _ => {
                        self.ledger.acquired.push("local|10.0.0.1:80".into());
                        Some(local_holding(config, roll == 5))
                    }
                };
                let place = Placement::on("10.0.0.1:80".into());
                let endpoint = place.to.endpoint.clone();
                Decision::Route {
                    place,
                    reason: Reason::Continuation,
                    hold: Some(Box::new(Continued::new(inner, endpoint, record(config)))),
                }
            }
            Kind::Local if roll == 0 => Decision::Reject(Rejection::MaxRequestCount),
            Kind::Local => {
                // The policy counted the endpoint before it decided.
                self.ledger.acquired.push("local|10.0.0.1:80".into());
                Decision::Route {
                    place: Placement::on("10.0.0.1:80".into()),
                    reason: Reason::PrefixHit,
                    hold: Some(local_holding(config, roll % 2 == 1)),
                }
            }
            Kind::ServiceGlobal => Decision::Acquire(service_pick(config, &self.lease)),
            Kind::ServiceLocal if roll == 0 => Decision::Fallback(Cause::NoHealthyEndpoint),
            Kind::ServiceLocal => {
                // The policy counted the service before it decided.
                self.ledger.acquired.push("local|service".into());
                Decision::Route {
                    place: Placement::on("a".into()),
                    reason: Reason::ClusterMetrics,
                    hold: Some(Box::new(self.lease.clone())),
                }
            }
            Kind::Hash if roll == 0 => Decision::Reject(Rejection::HashHeaderMissing),
            Kind::Hash => Decision::Route {
                place: Placement::on("a".into()),
                reason: Reason::ClusterHash,
                hold: None,
            },
        }
    }

    /// Feeds `event`, then answers every effect that asks for an answer as the balancer
    /// would (decide, send, publish), noting the others.
    fn drive(&mut self, r: &mut Request, event: Event, rng: &mut SplitMix64) {
        let mut next = Some(event);
        while let Some(event) = next.take() {
            for effect in r.handle(event) {
                match effect {
                    Effect::Decide { .. } => {
                        next = Some(Event::Decided(self.decision(&r.config, rng)));
                    }
                    Effect::Send(pick) | Effect::Retry(pick) => {
                        // Now and then the host refuses the call: nothing was sent.
                        let result = if rng.next_u64().is_multiple_of(8) {
                            Err(Cause::RedisError)
                        } else {
                            self.token += 4;
                            Ok(self.token)
                        };
                        next = Some(Event::Sent { result, pick });
                    }
                    Effect::Publish(_) => {
                        let ok = !rng.next_u64().is_multiple_of(4);
                        let result = if ok {
                            Ok(())
                        } else {
                            Err(Cause::OverrideFailed)
                        };
                        next = Some(Event::Published(result));
                    }
                    Effect::Orphan { .. } => unreachable!("only at stream end"),
                    other => self.ledger.note(other),
                }
            }
        }
    }
}

/// Random event orders against one ledger, for every kind of request: an acquire happens when
/// a policy counts (cluster_metrics in this proxy), when Redis answers with a lease (an
/// endpoint or a service, offered or not), or may have happened on a lost reply; each is given
/// back exactly once, by the live request or by `undo` on its orphan, and a service's first
/// byte is never recorded after its count came back.
#[test]
fn every_acquire_is_released_exactly_once_in_any_event_order() {
    let mut rng = SplitMix64(0x5eed);
    let kinds = [
        Kind::Endpoint,
        Kind::Verified,
        Kind::Continued,
        Kind::Local,
        Kind::ServiceLocal,
        Kind::ServiceGlobal,
        Kind::Hash,
    ];
    for round in 0..9000 {
        let kind = kinds[round % kinds.len()];
        let (cluster, lease) = cluster_request();
        let mut r = match kind {
            Kind::Endpoint | Kind::Verified | Kind::Continued | Kind::Local => request(""),
            Kind::ServiceLocal | Kind::ServiceGlobal => cluster,
            Kind::Hash => Request::new(hash_config(), None),
        };
        let mut run = Run {
            kind,
            lease,
            token: 7,
            ledger: Ledger::default(),
        };
        run.drive(
            &mut r,
            Event::Headers {
                end_of_stream: false,
                withheld: false,
            },
            &mut rng,
        );
        if matches!(
            kind,
            Kind::Endpoint | Kind::Verified | Kind::Continued | Kind::Local
        ) {
            let body = Event::Body {
                size: 20,
                end_of_stream: true,
            };
            run.drive(&mut r, body, &mut rng);
        }
        let mut slot = Some(r);
        let mut orphan: Option<(u32, Box<dyn Pick>)> = None;
        for _ in 0..8 {
            let Some(r) = slot.as_mut() else {
                break;
            };
            match rng.next_u64() % 6 {
                0 => match slot.take().and_then(|r| r.finish(5)) {
                    Some(Effect::Orphan { token, pick }) => orphan = Some((token, pick)),
                    Some(other) => run.ledger.note(other),
                    None => {}
                },
                1 | 2 if r.phase().awaits(run.token) => {
                    let reply = random_reply(kind, &mut rng);
                    if let State::Picking { pick, .. } = &r.phase.0 {
                        run.ledger.answered(pick.as_ref(), &reply);
                    }
                    run.drive(r, Event::PickReply(reply), &mut rng);
                }
                3 => {
                    let status = Some(200 + 300 * (rng.next_u64() % 2) as u32);
                    run.drive(r, Event::ResponseHeaders { status }, &mut rng);
                }
                4 if r.phase().wants_response_body() => {
                    run.drive(r, Event::ResponseBody { now_us: 3_000 }, &mut rng)
                }
                _ => {}
            }
        }
        match slot.take().and_then(|r| r.finish(5)) {
            Some(Effect::Orphan { token, pick }) => orphan = Some((token, pick)),
            Some(other) => run.ledger.note(other),
            None => {}
        }
        if let Some((token, pick)) = orphan {
            assert_eq!(token, run.token, "round {round}: the pick in flight");
            // The pick's reply arrives after the stream ended.
            let reply = random_reply(kind, &mut rng);
            run.ledger.answered(pick.as_ref(), &reply);
            for effect in undo(pick, &reply) {
                run.ledger.note(effect);
            }
        }
        let Ledger {
            mut acquired,
            mut released,
            lost,
            released_all,
            late_first_byte,
        } = run.ledger;
        acquired.sort();
        released.sort();
        assert_eq!(released, acquired, "round {round} ({kind:?})");
        assert_eq!(released_all, lost, "round {round} ({kind:?}): lost replies");
        assert!(!late_first_byte, "round {round} ({kind:?})");
    }
}

fn cluster_request() -> (Request, ServiceLease) {
    let json = r#"{"lb_type":"cluster","lb_policy":"cluster_metrics","lb_config":{"mode":"LeastBusy","service_list":["a","b"]}}"#;
    let config = PluginConfig::parse(json.as_bytes())
        .unwrap()
        .global
        .unwrap();
    let crate::config::PolicyConfig::ClusterMetrics(cm) = &config.policy else {
        panic!("{config:?}")
    };
    let lease = ServiceLease {
        stats: Rc::new(crate::balancer::policies::cluster_metrics::SharedStats::new(0, cm)),
        service: 0,
        start_ms: 1000,
        global: None,
        first_byte: false,
    };
    (Request::new(config, None), lease)
}

/// Headers only: a cluster policy decides at once (no body, no Redis keys needed).
fn cluster_routed(r: &mut Request, lease: &ServiceLease) {
    let e = r.handle(Event::Headers {
        end_of_stream: false,
        withheld: false,
    });
    assert!(matches!(e.as_slice(), [Effect::Decide { read_body: true }]));
    let e = r.handle(Event::Decided(Decision::Route {
        place: Placement::on("a".into()),
        reason: Reason::ClusterMetrics,
        hold: Some(Box::new(lease.clone())),
    }));
    assert!(matches!(e.as_slice(), [Effect::Publish(p)] if p.to.endpoint == "a"));
}

/// What stream end gives back: the holding, with the outcome measured.
fn finished(r: Request, now_ms: u64) -> (Box<dyn Holding>, Outcome) {
    let Some(Effect::GiveBack {
        held,
        outcome: Some(outcome),
    }) = r.finish(now_ms)
    else {
        panic!("expected the holding with its outcome")
    };
    (held, outcome)
}

#[test]
fn a_routed_request_measures_its_outcome_and_tells_its_holding_the_first_bytes_once() {
    let (mut r, lease) = cluster_request();
    cluster_routed(&mut r, &lease);
    let e = r.handle(Event::Published(Ok(())));
    assert!(matches!(
        e.as_slice(),
        [Effect::Count(Counter::Decision(
            crate::config::Policy::ClusterMetrics,
            Decided::Routed
        ))]
    ));
    assert!(!r.phase().is_held() && r.phase().wants_response_body() && r.phase().routed());
    assert!(r
        .handle(Event::ResponseHeaders { status: Some(200) })
        .is_empty());
    let e = r.handle(Event::ResponseBody { now_us: 1_040_000 });
    assert!(matches!(e.as_slice(), [Effect::FirstBytes]));
    assert!(!r.phase().wants_response_body());
    assert!(r
        .handle(Event::ResponseBody { now_us: 1_050_000 })
        .is_empty());
    assert_eq!(r.phase().describe(), (Some("a"), Reason::ClusterMetrics));
    let (held, outcome) = finished(r, 1100);
    assert_eq!(held.ledger(), ["local|service"]);
    assert_eq!(
        outcome,
        Outcome {
            endpoints: vec![Placed {
                endpoint: "a".into(),
                role: Role::Serve
            }],
            status: Some(200),
            first_byte_us: Some(1_040_000),
            end_ms: Some(1100),
            ..Outcome::default()
        }
    );
    assert!(outcome.success());
}

#[test]
fn a_request_without_a_response_ends_with_no_status() {
    let (mut r, lease) = cluster_request();
    cluster_routed(&mut r, &lease);
    r.handle(Event::Published(Ok(())));
    // Reset before response headers: Higress counts it as a failure.
    let (_, outcome) = finished(r, 7);
    assert_eq!(outcome.status, None);
    assert!(!outcome.success());
    let (mut r, lease) = cluster_request();
    cluster_routed(&mut r, &lease);
    r.handle(Event::Published(Ok(())));
    r.handle(Event::ResponseHeaders { status: Some(503) });
    let e = r.handle(Event::ResponseBody { now_us: 3_000 });
    assert!(matches!(e.as_slice(), [Effect::FirstBytes]));
    let (_, outcome) = finished(r, 7);
    assert_eq!(outcome.status, Some(503));
    assert!(!outcome.success());
}

#[test]
fn a_holding_that_does_not_want_first_bytes_is_not_told() {
    let mut r = request("");
    to_decision(&mut r);
    let p = pick(&r.config, "rid")
        .as_any()
        .downcast_ref::<EndpointPick>()
        .expect("an endpoint pick")
        .clone();
    r.handle(Event::Decided(Decision::Route {
        place: Placement::on("10.0.0.1:80".into()),
        reason: Reason::LeastRequest,
        hold: Some(Box::new(p.lease("10.0.0.1:80"))),
    }));
    r.handle(Event::Published(Ok(())));
    assert!(
        !r.phase().wants_response_body(),
        "no booking: the chunks pass the glue"
    );
    r.handle(Event::ResponseHeaders { status: Some(502) });
    let (held, outcome) = finished(r, 4);
    assert_eq!(held.ledger(), ["rid|10.0.0.1:80|1"]);
    assert_eq!((outcome.status, outcome.first_byte_us), (Some(502), None));
}

#[test]
fn cluster_header_write_failure_answers_500_and_gives_the_count_back() {
    let (mut r, lease) = cluster_request();
    cluster_routed(&mut r, &lease);
    let e = r.handle(Event::Published(Err(Cause::OverrideFailed)));
    assert!(matches!(
        e.as_slice(),
        [
            Effect::GiveBack { outcome: None, .. },
            Effect::Count(Counter::ClusterHeaderFailed),
            Effect::Reply(LocalReply { status: 500, .. })
        ]
    ));
    assert!(r.phase().replied());
    assert!(r.finish(0).is_none(), "given back once, at the failure");
}

#[test]
fn missing_hash_header_answers_403() {
    let (mut r, _) = cluster_request();
    r.handle(Event::Headers {
        end_of_stream: true,
        withheld: false,
    });
    let e = r.handle(Event::Decided(Decision::Reject(
        Rejection::HashHeaderMissing,
    )));
    assert!(matches!(
        e.as_slice(),
        [
            Effect::Count(Counter::HashHeaderMissing),
            Effect::Reply(LocalReply {
                status: 403,
                body: b"hash header required",
                ..
            })
        ]
    ));
    assert!(r.phase().replied() && r.finish(0).is_none());
}

/// Random orders of response events and stream end against a cluster_metrics hold: the
/// in-flight count comes back exactly once, TTFT is recorded at most once and only before it.
#[test]
fn every_service_hold_is_given_back_exactly_once_in_any_event_order() {
    let mut rng = SplitMix64(0xc1u64);
    for round in 0..2000 {
        let (mut r, lease) = cluster_request();
        cluster_routed(&mut r, &lease);
        let mut slot = Some(r);
        let (mut done, mut first_bytes) = (0, 0);
        let mut published = false;
        for _ in 0..8 {
            let Some(r) = slot.as_mut() else {
                break;
            };
            let effects = match rng.next_u64() % 6 {
                0 => slot.take().and_then(|r| r.finish(9)).into_iter().collect(),
                1 if !published => {
                    published = true;
                    let ok = !rng.next_u64().is_multiple_of(4);
                    let result = if ok {
                        Ok(())
                    } else {
                        Err(Cause::OverrideFailed)
                    };
                    r.handle(Event::Published(result))
                }
                2 => r.handle(Event::ResponseHeaders {
                    status: Some(200 + 300 * (rng.next_u64() % 2) as u32),
                }),
                _ => r.handle(Event::ResponseBody { now_us: 5_000 }),
            };
            for e in effects {
                match e {
                    Effect::GiveBack { .. } => done += 1,
                    Effect::FirstBytes => {
                        assert_eq!(done, 0, "round {round}: TTFT after the count came back");
                        first_bytes += 1;
                    }
                    _ => {}
                }
            }
        }
        if let Some(Effect::GiveBack { .. }) = slot.take().and_then(|r| r.finish(9)) {
            done += 1;
        }
        assert_eq!(done, 1, "round {round}");
        assert!(first_bytes <= 1, "round {round}");
    }
}
