//! The request state machine with a cluster_metrics global in-flight pick
//! (docs/higress-cluster-policies.md §3.6): Redis counts the service, or the local path
//! decides; either way the Redis lease and this proxy's count come back exactly once.

use super::*;
use crate::balancer::policies::cluster_metrics::holding::{GlobalLease, Local, Start};
use crate::balancer::policies::cluster_metrics::pick::ServicePick;
use crate::balancer::policies::cluster_metrics::reply::{counted, counted_reply};
use crate::balancer::policies::cluster_metrics::{ServiceLease, SharedStats};
use crate::config::{PluginConfig, PolicyConfig};
use crate::hash::SplitMix64;

const CONFIG: &str = r#"{"lb_type":"cluster","lb_policy":"cluster_metrics","lb_config":{
    "mode":"AdaptiveScore","service_list":["a","b","c"],"global_inflight_enabled":true,
    "serviceFQDN":"redis.static","servicePort":6379}}"#;

fn service_pick(config: &Rc<RouteConfig>) -> Box<dyn Pick> {
    let PolicyConfig::ClusterMetrics(cm) = &config.policy else {
        panic!("{config:?}")
    };
    let global = config
        .policy
        .global_inflight()
        .expect("global in-flight on");
    Box::new(ServicePick {
        config: config.clone(),
        keys: Rc::new(InflightKeys::new(&global.key_prefix, "chat")),
        request_id: "rid".into(),
        key_ttl_s: global.key_ttl_s,
        candidates: Rc::new(vec![("a".into(), 2.0), ("b".into(), 1.0)]),
        local: "b".into(),
        stats: Rc::new(SharedStats::new(0, cm)),
        start_ms: 5,
        by_sha: true,
    })
}

/// Headers, the decision, the send: the request holds a service pick under `token`.
fn picking(token: u32) -> Request {
    let config = PluginConfig::parse(CONFIG.as_bytes())
        .unwrap()
        .global
        .unwrap();
    let mut r = Request::new(config.clone(), None);
    let e = r.handle(Event::Headers {
        end_of_stream: false,
        withheld: false,
    });
    assert!(matches!(e.as_slice(), [Effect::Decide { .. }]), "{e:?}");
    let e = r.handle(Event::Decided(Decision::Acquire(service_pick(&config))));
    let [Effect::Send(p)] = <[Effect; 1]>::try_from(e).unwrap() else {
        panic!("one send")
    };
    assert!(r
        .handle(Event::Sent {
            result: Ok(token),
            pick: p,
        })
        .is_empty());
    assert!(r.phase().is_held() && r.phase().awaits(token));
    r
}

/// The service counted in this proxy after a reply (cluster_metrics' `Start`).
fn started(e: &[Effect]) -> Option<&ServiceLease> {
    e.iter().find_map(|x| match x {
        Effect::Act(a) => a.as_any().downcast_ref::<Start>().map(|s| &s.0),
        _ => None,
    })
}

/// A reply's note that the local path chose (cluster_metrics' `Local`).
fn local(e: Option<&Effect>) -> Option<Cause> {
    match e {
        Some(Effect::Act(a)) => a.as_any().downcast_ref::<Local>().map(|l| l.0),
        _ => None,
    }
}

#[test]
fn redis_choice_is_counted_here_published_and_released_at_stream_end() {
    let mut r = picking(3);
    let e = r.handle(Event::PickReply(counted_reply("a")));
    let lease = started(&e).expect("counted in this proxy");
    assert_eq!(lease.name(), "a");
    assert_eq!(lease.global.as_ref().unwrap().member, "rid|a|1");
    assert!(matches!(
        e.first(),
        Some(Effect::Count(Counter::ClusterInflightGlobal))
    ));
    assert!(matches!(e.last(), Some(Effect::Publish(p)) if p.to.endpoint == "a"));
    assert!(!r.phase().is_held());
    let Some(Effect::GiveBack { held, outcome }) = r.finish(9) else {
        panic!("the count comes back")
    };
    assert_eq!(held.ledger(), ["local|service", "rid|a|1"]);
    assert!(
        outcome.is_some_and(|o| !o.success()),
        "no response: an error, as Higress counts it"
    );
}

#[test]
fn redis_trouble_takes_the_local_choice_with_nothing_counted_in_redis() {
    for reply in [
        PickReply::Failed(Cause::RedisError),
        PickReply::Failed(Cause::BadReply),
        PickReply::Full,
        PickReply::Resync,
    ] {
        let mut r = picking(3);
        let e = r.handle(Event::PickReply(reply.clone()));
        assert!(local(e.first()).is_some(), "{reply:?}: {e:?}");
        let lease = started(&e).unwrap();
        assert_eq!(lease.name(), "b", "{reply:?}");
        assert!(lease.global.is_none());
        assert!(!e.iter().any(|x| matches!(x, Effect::ReleaseAll(_))));
    }
    // A lost reply: the script may have counted any candidate; all are given back.
    let mut r = picking(3);
    let e = r.handle(Event::PickReply(PickReply::Failed(Cause::RedisTimeout)));
    let Some(Effect::ReleaseAll(p)) = e.first() else {
        panic!("{e:?}")
    };
    let Some(p) = p.as_any().downcast_ref::<ServicePick>() else {
        panic!("a service pick")
    };
    assert_eq!(p.every_member(), ["rid|a|1", "rid|b|1"]);
    assert_eq!(started(&e).unwrap().name(), "b");
    // Never sent (Redis not ready): the local choice at once.
    let config = PluginConfig::parse(CONFIG.as_bytes())
        .unwrap()
        .global
        .unwrap();
    let mut r = Request::new(config.clone(), None);
    r.handle(Event::Headers {
        end_of_stream: true,
        withheld: false,
    });
    r.handle(Event::Decided(Decision::Acquire(service_pick(&config))));
    let e = r.handle(Event::Sent {
        result: Err(Cause::RedisUnavailable),
        pick: service_pick(&config),
    });
    assert_eq!(started(&e).unwrap().name(), "b");
}

#[test]
fn a_service_we_did_not_offer_is_released_and_the_local_choice_taken() {
    let mut r = picking(3);
    let e = r.handle(Event::PickReply(counted_reply("zzz")));
    assert!(
        matches!(e.first(), Some(Effect::GiveBack { held, outcome: None })
            if held.as_any().downcast_ref::<GlobalLease>().is_some()
                && held.ledger() == ["rid|zzz|1"]),
        "{e:?}"
    );
    assert_eq!(started(&e).unwrap().name(), "b");
}

#[test]
fn noscript_resends_once_by_text() {
    let mut r = picking(3);
    let e = r.handle(Event::PickReply(PickReply::NoScript));
    let Some(Effect::Send(p)) = e.last() else {
        panic!("{e:?}")
    };
    assert!(!p.by_sha());
    r.handle(Event::Sent {
        result: Ok(4),
        pick: p.clone(),
    });
    let e = r.handle(Event::PickReply(PickReply::NoScript));
    assert_eq!(local(e.first()), Some(Cause::RedisError));
}

/// Random orders of replies, publish results and stream end: every Redis lease the script
/// wrote comes back exactly once, and every count taken in this proxy (`Start`) is given back
/// exactly once (the `ServiceLease` holding).
#[test]
fn every_global_and_local_count_is_given_back_exactly_once_in_any_order() {
    let mut rng = SplitMix64(0x9106a1);
    for round in 0..2000 {
        let mut token = 3;
        let mut slot = Some(picking(token));
        let (mut acquired, mut released) = (Vec::<String>::new(), Vec::<String>::new());
        let (mut starts, mut dones) = (0, 0);
        let mut orphan = None;
        let mut lost = false;
        let mut tally = |e: Effect, released: &mut Vec<String>, lost: &mut bool| match e {
            Effect::Act(a) if a.as_any().is::<Start>() => starts += 1,
            Effect::GiveBack { held, .. } => {
                let mut members = held.ledger();
                if held.as_any().is::<ServiceLease>() {
                    dones += 1;
                    members.retain(|m| m != "local|service");
                }
                released.extend(members);
            }
            Effect::ReleaseAll(_) => *lost = true,
            _ => {}
        };
        for _ in 0..6 {
            let roll = rng.next_u64() % 8;
            let Some(r) = slot.as_mut() else { break };
            let effects = if roll == 0 {
                match slot.take().and_then(|r| r.finish(9)) {
                    Some(Effect::Orphan { pick, .. }) => {
                        orphan = Some(pick);
                        Vec::new()
                    }
                    other => other.into_iter().collect(),
                }
            } else if r.phase().awaits(token) {
                let reply = match roll {
                    1..=3 => counted_reply("a"),
                    4 => counted_reply("zzz"),
                    5 => PickReply::NoScript,
                    6 => PickReply::Failed(Cause::RedisTimeout),
                    _ => PickReply::Failed(Cause::RedisError),
                };
                if let Some(s) = counted(&reply) {
                    acquired.push(format!("rid|{s}|1"));
                }
                let mut out = r.handle(Event::PickReply(reply));
                if let Some(pos) = out.iter().position(|e| matches!(e, Effect::Send(_))) {
                    let Effect::Send(p) = out.remove(pos) else {
                        unreachable!()
                    };
                    token += 1;
                    out.extend(r.handle(Event::Sent {
                        result: Ok(token),
                        pick: p,
                    }));
                }
                if out.iter().any(|e| matches!(e, Effect::Publish(_))) {
                    let result = if rng.next_u64().is_multiple_of(4) {
                        Err(Cause::OverrideFailed)
                    } else {
                        Ok(())
                    };
                    out.extend(r.handle(Event::Published(result)));
                }
                out
            } else {
                Vec::new()
            };
            for e in effects {
                tally(e, &mut released, &mut lost);
            }
        }
        if let Some(r) = slot.take() {
            match r.finish(9) {
                Some(Effect::Orphan { pick, .. }) => orphan = Some(pick),
                Some(e) => tally(e, &mut released, &mut lost),
                None => {}
            }
        }
        if let Some(p) = orphan {
            acquired.push("rid|a|1".into());
            for e in undo(p, &counted_reply("a")) {
                tally(e, &mut released, &mut lost);
            }
        }
        assert_eq!(released, acquired, "round {round} (lost reply: {lost})");
        assert_eq!(starts, dones, "round {round}");
    }
}
