//! The request state machine alone: events in, effects out, no host. The last test drives
//! random event sequences and checks the rule the module exists for: every acquire is
//! released exactly once, whatever order things happen in.

use super::*;
use crate::balancer::pick::{LocalLease, ServiceLease};
use crate::config::PluginConfig;
use crate::hash::SplitMix64;
use crate::stats::Counter;

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

fn pick(config: &Rc<RouteConfig>, id: &str) -> Box<Pick> {
    Box::new(Pick::Endpoint(EndpointPick {
        config: config.clone(),
        keys: keys(),
        request_id: id.into(),
        cost: 1,
        candidates: Rc::new(vec!["10.0.0.1:80".into(), "10.0.0.2:80".into()]),
        fingerprint: "fp".into(),
        sent_list: false,
        by_sha: true,
        chain: None,
        cap: config.common.max_load,
        class: None,
        session: None,
        wait_rank: None,
        pool_cap: 0,
        tenant: None,
    }))
}

/// Headers and a complete body: the request asks to decide, with the body.
fn to_decision(r: &mut Request) {
    assert!(r
        .handle(Event::Headers {
            end_of_stream: false,
            withheld: false,
        })
        .is_empty());
    assert!(r.is_held() && r.wants_body());
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
    assert!(r.awaits(token) && !r.awaits(token + 1) && r.is_held());
}

fn picked(endpoint: &str) -> Event {
    Event::PickReply(PickReply::Picked {
        endpoint: endpoint.into(),
        depth: 0,
        spilled: false,
        session: SessionState::None,
        load_before: Some(0),
    })
}

fn released(effects: &[Effect]) -> Vec<String> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Release(l) => Some(l.member.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_routed_pick_publishes_then_releases_at_stream_end() {
    let mut r = request("");
    to_picking(&mut r, 7);
    let e = r.handle(picked("10.0.0.2:80"));
    assert!(matches!(
        e.as_slice(),
        [Effect::Synced { .. }, Effect::Publish { endpoint, .. }] if endpoint == "10.0.0.2:80"
    ));
    assert!(!r.is_held(), "a routed request is no longer held");
    let e = r.handle(Event::Published(Ok(())));
    assert!(matches!(
        e.as_slice(),
        [Effect::Count(Counter::Decision(_, Outcome::Routed))]
    ));
    assert_eq!(r.describe(), (Some("10.0.0.2:80"), Reason::LeastRequest));
    let done = r.finish();
    assert!(matches!(&done, Some(Effect::Release(l)) if l.member == "rid|10.0.0.2:80|1"));
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
    assert!(r.finish().is_none(), "nothing left to give back");
}

#[test]
fn a_reply_naming_an_endpoint_we_did_not_offer_is_released() {
    let mut r = request("");
    to_picking(&mut r, 7);
    let e = r.handle(picked("10.9.9.9:80"));
    assert_eq!(released(&e), ["rid|10.9.9.9:80|1"]);
    assert!(matches!(e.first(), Some(Effect::Unsynced { .. })));
    assert!(r.finish().is_none());
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
        let Pick::Endpoint(ep) = &*p else {
            panic!("an endpoint pick")
        };
        assert!(ep.sent_list || !ep.by_sha);
        assert!(r.is_held(), "still held while resending");
        r.handle(Event::Sent {
            result: Ok(11),
            pick: p,
        });
        let e = r.handle(Event::PickReply(reply.clone()));
        assert!(
            e.iter().any(|x| matches!(x, Effect::FellBack { .. })),
            "{reply:?}"
        );
        assert!(!r.is_held() && r.finish().is_none());
    }
}

#[test]
fn a_lost_reply_releases_every_possible_lease_other_failures_nothing() {
    let mut r = request("");
    to_picking(&mut r, 7);
    let e = r.handle(Event::PickReply(PickReply::Failed(Cause::RedisTimeout)));
    assert!(
        matches!(e.first(), Some(Effect::ReleaseAll(p)) if matches!(&**p, Pick::Endpoint(ep) if ep.every_lease().len() == 2))
    );
    let mut r = request("");
    to_picking(&mut r, 7);
    let e = r.handle(Event::PickReply(PickReply::Failed(Cause::RedisError)));
    assert!(!e
        .iter()
        .any(|x| matches!(x, Effect::ReleaseAll(_) | Effect::Release(_))));
}

#[test]
fn full_rejects_with_429_and_holds_nothing() {
    let mut r = request("");
    to_picking(&mut r, 7);
    let e = r.handle(Event::PickReply(PickReply::Full));
    assert!(e
        .iter()
        .any(|x| matches!(x, Effect::Reply(LocalReply { status: 429, .. }))));
    assert!(r.replied() && r.finish().is_none());
}

#[test]
fn stream_end_during_the_pick_orphans_it_and_undo_releases_on_arrival() {
    let mut r = request("");
    to_picking(&mut r, 7);
    let Some(Effect::Orphan { token: 7, pick }) = r.finish() else {
        panic!("expected an orphan")
    };
    let reply = PickReply::Picked {
        endpoint: "10.0.0.1:80".into(),
        depth: 0,
        spilled: false,
        session: SessionState::None,
        load_before: Some(0),
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
            Effect::Count(Counter::Fallback(Cause::BodyTooLarge)),
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
    assert!(r.replied());
    assert_eq!(
        r.describe(),
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
    assert!(!r.is_held());
}

#[test]
fn local_decisions_give_back_their_count_once() {
    let mut r = request("");
    to_decision(&mut r);
    let local = LocalLease {
        tenant: None,
        failed: false,
        key: "k".into(),
        endpoint: "10.0.0.1:80".into(),
        cost: 1,
    };
    let e = r.handle(Event::Decided(Decision::Route {
        endpoint: "10.0.0.1:80".into(),
        fallbacks: vec!["10.0.0.2:80".into()],
        reason: Reason::Metrics,
        hold: Some(Hold::Local(local.clone())),
    }));
    assert!(matches!(e.as_slice(), [Effect::Publish { fallbacks, .. }] if fallbacks.len() == 1));
    r.handle(Event::Published(Ok(())));
    assert!(matches!(r.finish(), Some(Effect::ReleaseLocal(l)) if l == local));
}

/// Random event orders against one ledger: an acquire happens when Redis answers `Picked` (or
/// may have happened on a lost reply); it must be released exactly once, by the live request
/// or by `undo` on its orphan.
#[test]
fn every_acquire_is_released_exactly_once_in_any_event_order() {
    let mut rng = SplitMix64(0x5eed);
    for round in 0..2000 {
        let mut first = request("");
        to_picking(&mut first, 7);
        let mut slot = Some(first);
        let mut acquired: Vec<String> = Vec::new();
        let mut released_members: Vec<String> = Vec::new();
        let mut covered_by_release_all = false;
        let mut orphan: Option<Box<Pick>> = None;
        let mut token = 7;
        for _ in 0..6 {
            let roll = rng.next_u64() % 8;
            let Some(r) = slot.as_mut() else {
                break;
            };
            let effects = if roll == 0 {
                // Stream end now.
                match slot.take().and_then(Request::finish) {
                    Some(Effect::Orphan { pick, .. }) => {
                        orphan = Some(pick);
                        Vec::new()
                    }
                    Some(other) => vec![other],
                    None => Vec::new(),
                }
            } else if r.awaits(token) {
                let reply = match roll {
                    1..=3 => PickReply::Picked {
                        endpoint: "10.0.0.2:80".into(),
                        depth: 1,
                        spilled: false,
                        session: SessionState::None,
                        load_before: Some(0),
                    },
                    4 => PickReply::Resync,
                    5 => PickReply::NoScript,
                    6 => PickReply::Failed(Cause::RedisTimeout),
                    _ => PickReply::Full,
                };
                if matches!(reply, PickReply::Picked { .. }) {
                    acquired.push(format!("{}|10.0.0.2:80|1", "rid"));
                }
                let mut out = r.handle(Event::PickReply(reply));
                // A resend goes out under a new token.
                if let Some(pos) = out.iter().position(|e| matches!(e, Effect::Send(_))) {
                    let Effect::Send(p) = out.remove(pos) else {
                        unreachable!()
                    };
                    token += 4;
                    out.extend(r.handle(Event::Sent {
                        result: Ok(token),
                        pick: p,
                    }));
                }
                if out.iter().any(|e| matches!(e, Effect::Publish { .. })) {
                    let ok = !rng.next_u64().is_multiple_of(4);
                    let result = if ok {
                        Ok(())
                    } else {
                        Err(Cause::OverrideFailed)
                    };
                    out.extend(r.handle(Event::Published(result)));
                }
                out
            } else {
                Vec::new()
            };
            for e in effects {
                match e {
                    Effect::Release(l) => released_members.push(l.member),
                    Effect::ReleaseAll(_) => covered_by_release_all = true,
                    _ => {}
                }
            }
        }
        if let Some(r) = slot.take() {
            match r.finish() {
                Some(Effect::Release(l)) => released_members.push(l.member),
                Some(Effect::Orphan { pick, .. }) => orphan = Some(pick),
                _ => {}
            }
        }
        if let Some(p) = orphan {
            // The pick's reply arrives after the stream ended.
            let reply = PickReply::Picked {
                endpoint: "10.0.0.2:80".into(),
                depth: 0,
                spilled: false,
                session: SessionState::None,
                load_before: Some(0),
            };
            acquired.push("rid|10.0.0.2:80|1".into());
            released_members.extend(released(&undo(p, &reply)));
        }
        assert_eq!(
            released_members, acquired,
            "round {round}: released {released_members:?} acquired {acquired:?} \
             (release-all: {covered_by_release_all})"
        );
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
        endpoint: "a".into(),
        fallbacks: Vec::new(),
        reason: Reason::ClusterMetrics,
        hold: Some(Hold::Service(lease.clone())),
    }));
    assert!(matches!(e.as_slice(), [Effect::Publish { endpoint, .. }] if endpoint == "a"));
}

#[test]
fn service_hold_records_first_byte_once_and_ends_with_the_status() {
    let (mut r, lease) = cluster_request();
    cluster_routed(&mut r, &lease);
    let e = r.handle(Event::Published(Ok(())));
    assert!(matches!(
        e.as_slice(),
        [Effect::Count(Counter::Decision(
            crate::config::Policy::ClusterMetrics,
            Outcome::Routed
        ))]
    ));
    assert!(!r.is_held() && r.wants_response_body());
    assert!(r
        .handle(Event::ResponseHeaders { status: Some(200) })
        .is_empty());
    let e = r.handle(Event::ResponseBody);
    assert!(matches!(
        e.as_slice(),
        [Effect::FirstByte { success: true, .. }]
    ));
    assert!(!r.wants_response_body());
    assert!(r.handle(Event::ResponseBody).is_empty());
    assert_eq!(r.describe(), (Some("a"), Reason::ClusterMetrics));
    assert!(matches!(
        r.finish(),
        Some(Effect::ServiceDone {
            outcome: Some(true),
            ..
        })
    ));
}

#[test]
fn service_hold_without_a_response_is_an_error() {
    let (mut r, lease) = cluster_request();
    cluster_routed(&mut r, &lease);
    r.handle(Event::Published(Ok(())));
    // Reset before response headers: Higress counts it as a failure.
    assert!(matches!(
        r.finish(),
        Some(Effect::ServiceDone {
            outcome: Some(false),
            ..
        })
    ));
    let (mut r, lease) = cluster_request();
    cluster_routed(&mut r, &lease);
    r.handle(Event::Published(Ok(())));
    r.handle(Event::ResponseHeaders { status: Some(503) });
    let e = r.handle(Event::ResponseBody);
    assert!(matches!(
        e.as_slice(),
        [Effect::FirstByte { success: false, .. }]
    ));
    assert!(matches!(
        r.finish(),
        Some(Effect::ServiceDone {
            outcome: Some(false),
            ..
        })
    ));
}

#[test]
fn cluster_header_write_failure_answers_500_and_gives_the_count_back() {
    let (mut r, lease) = cluster_request();
    cluster_routed(&mut r, &lease);
    let e = r.handle(Event::Published(Err(Cause::OverrideFailed)));
    assert!(matches!(
        e.as_slice(),
        [
            Effect::ServiceDone { outcome: None, .. },
            Effect::Count(Counter::ClusterHeaderFailed),
            Effect::Reply(LocalReply { status: 500, .. })
        ]
    ));
    assert!(r.replied());
    assert!(r.finish().is_none(), "given back once, at the failure");
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
    assert!(r.replied() && r.finish().is_none());
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
                0 => slot.take().and_then(Request::finish).into_iter().collect(),
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
                _ => r.handle(Event::ResponseBody),
            };
            for e in effects {
                match e {
                    Effect::ServiceDone { .. } => done += 1,
                    Effect::FirstByte { .. } => {
                        assert_eq!(done, 0, "round {round}: TTFT after the count came back");
                        first_bytes += 1;
                    }
                    _ => {}
                }
            }
        }
        if let Some(Effect::ServiceDone { .. }) = slot.take().and_then(Request::finish) {
            done += 1;
        }
        assert_eq!(done, 1, "round {round}");
        assert!(first_bytes <= 1, "round {round}");
    }
}
