//! Failure memory (docs/redis-data-model.md §14) against a real redis-server: releases learn
//! from outcomes, an endpoint failing `ejectAfterFailures` times in a row is passed over by
//! every pick (global_least_request and prefix_cache) until its ejection ends, then tried by a
//! bounded number of requests, brought back by an answer or ejected again for twice as long;
//! at most `maxEjectedPercent` are out, every endpoint out fails open, and a failed request's
//! count stays on its endpoint for `failurePenaltyMs`.

// Test scaffolding helpers outside #[test] fns fail loudly by design.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ailb_core::config::Ejection;
use ailb_core::redis::resp::Value;
use ailb_core::redis::scripts::release::Learned;
use ailb_core::redis::scripts::{
    self, AcquireArgs, AcquireReply, Keys, PrefixArgs, PrefixChain, Released, Scripts,
};
use ailb_core::upstream::fingerprint;
use ailb_testkit::{Conn, RedisServer};

const TTL_MS: u64 = 60_000;

struct Bed {
    keys: Keys,
    scripts: Scripts,
    eps: Vec<String>,
    fp: String,
    ejection: Ejection,
    now: u64,
    next: u32,
}

impl Bed {
    fn new(n: usize, ejection: Ejection) -> Bed {
        let eps: Vec<String> = (1..=n).map(|i| format!("10.0.0.{i}:8000")).collect();
        Bed {
            keys: Keys::new("ailb", "route", "outbound|8000||llm.static"),
            scripts: Scripts::new(),
            fp: fingerprint(&eps),
            eps,
            ejection,
            now: 1_000_000,
            next: 0,
        }
    }

    /// One pick (global_least_request, or prefix_cache with `chain`): its endpoint and lease
    /// member, and whether every endpoint was ejected.
    fn pick_with(&mut self, c: &mut Conn, chain: Option<&PrefixChain>) -> (String, String, bool) {
        self.next += 1;
        let rid = format!("r{}", self.next);
        let args = AcquireArgs {
            now_ms: self.now,
            lease_ttl_ms: TTL_MS,
            request_id: &rid,
            cost: 1,
            cap: 0,
            random: self.next,
            fingerprint: &self.fp,
            reclaim: 8,
            endpoints: Some(self.eps.as_slice()),
            session: None,
            wait_rank: None,
            pool_cap: 0,
            tenant: None,
            trials: self.ejection.trials(),
        };
        let prefix = chain.map(|chain| PrefixArgs {
            chain,
            ttl_s: 600,
            max_imbalance: 8,
            max_imbalance_ratio: 1.5,
            gate: Default::default(),
            latency: None,
        });
        let q = scripts::pick_call(&self.scripts, false, &self.keys, &args, prefix.as_ref());
        match scripts::parse_acquire(&c.raw_reply(&q)).unwrap() {
            AcquireReply::Picked {
                endpoint,
                all_ejected,
                ..
            } => {
                let member = scripts::lease_member(&rid, &endpoint, 1, None);
                (endpoint, member, all_ejected)
            }
            other => panic!("expected a pick, got {other:?}"),
        }
    }

    fn pick(&mut self, c: &mut Conn) -> (String, String) {
        let (ep, member, _) = self.pick_with(c, None);
        (ep, member)
    }

    fn release(&self, c: &mut Conn, member: &str, learned: Learned, prefix: bool) -> Released {
        let q = scripts::release::release_call(
            (&self.scripts, false),
            &self.keys,
            &[member.to_string()],
            prefix,
            (learned, self.now, &self.ejection),
        );
        scripts::parse_release(&c.raw_reply(&q)).unwrap()
    }

    /// Picks until `ep` is chosen (ties among idle endpoints break at random) and gives the
    /// request on it `learned`; the others are answered.
    fn outcome_on(&mut self, c: &mut Conn, ep: &str, learned: Learned) -> Released {
        for _ in 0..50 {
            let (got, member) = self.pick(c);
            if got == ep {
                return self.release(c, &member, learned, false);
            }
            self.release(c, &member, Learned::Answered, false);
        }
        panic!("{ep} never picked");
    }

    fn fail_on(&mut self, c: &mut Conn, ep: &str) -> Released {
        self.outcome_on(c, ep, Learned::Failed)
    }

    /// `n` picks, each answered at once: how many went to `ep`.
    fn share(&mut self, c: &mut Conn, ep: &str, n: usize) -> usize {
        (0..n)
            .filter(|_| {
                let (got, member) = self.pick(c);
                self.release(c, &member, Learned::Answered, false);
                got == ep
            })
            .count()
    }

    fn load(&self, c: &mut Conn, ep: &str) -> f64 {
        c.cmd(&["ZSCORE", &self.keys.load, ep])
            .as_str()
            .map_or(0.0, |s| s.parse().unwrap())
    }
}

fn ejection() -> Ejection {
    Ejection {
        eject_after: 3,
        ejection_ms: 1_000,
        max_ejection_ms: 8_000,
        max_ejected_percent: 50,
        half_open_trials: 1,
        failure_penalty_ms: 0,
    }
}

#[test]
fn failures_in_a_row_eject_an_endpoint_from_every_pick_until_its_time_is_up() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let mut bed = Bed::new(4, ejection());
    let bad = bed.eps[0].clone();
    assert_eq!(bed.fail_on(&mut c, &bad), Released::Released);
    assert_eq!(bed.fail_on(&mut c, &bad), Released::Released);
    // An answer in between ends the run, a 4xx or no answer changes nothing: two more
    // failures do not eject.
    bed.outcome_on(&mut c, &bad, Learned::Answered);
    bed.outcome_on(&mut c, &bad, Learned::Nothing);
    assert_eq!(bed.fail_on(&mut c, &bad), Released::Released);
    assert_eq!(bed.fail_on(&mut c, &bad), Released::Released);
    assert_eq!(
        bed.fail_on(&mut c, &bad),
        Released::Ejected,
        "the third in a row"
    );
    assert_eq!(bed.share(&mut c, &bad, 40), 0, "passed over while ejected");
    assert!(bed.load(&mut c, &bad) >= 1e12, "marked");
    bed.now += 1_000;
    assert!(
        bed.share(&mut c, &bad, 8) > 0,
        "back on trial once its time is up"
    );
    assert!(bed.load(&mut c, &bad) < 1e12);
}

#[test]
fn a_trial_takes_few_requests_and_a_failure_on_trial_doubles_the_ejection() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let mut bed = Bed::new(3, ejection());
    let bad = bed.eps[1].clone();
    for _ in 0..3 {
        bed.fail_on(&mut c, &bad);
    }
    bed.now += 1_000;
    // On trial: one request may go; while it is out, nothing more.
    let mut held = Vec::new();
    let mut on_bad = None;
    for _ in 0..12 {
        let (ep, member) = bed.pick(&mut c);
        if ep == bad {
            assert!(on_bad.is_none(), "a second request on trial");
            on_bad = Some(member);
        } else {
            held.push(member);
        }
    }
    let trial = on_bad.expect("the trial request");
    // It fails: ejected again, for twice as long (2 s).
    assert_eq!(
        bed.release(&mut c, &trial, Learned::Failed, false),
        Released::Ejected
    );
    for m in held.drain(..) {
        bed.release(&mut c, &m, Learned::Answered, false);
    }
    bed.now += 1_500;
    assert_eq!(bed.share(&mut c, &bad, 20), 0, "still out after 1.5 s");
    bed.now += 500;
    // On trial again; this time it answers and is back for good.
    let mut got = None;
    for _ in 0..10 {
        let (ep, member) = bed.pick(&mut c);
        if ep == bad {
            got = Some(member);
            break;
        }
        held.push(member);
    }
    let trial = got.expect("tried again");
    assert_eq!(
        bed.release(&mut c, &trial, Learned::Answered, false),
        Released::Released
    );
    for m in held.drain(..) {
        bed.release(&mut c, &m, Learned::Answered, false);
    }
    let n = bed.share(&mut c, &bad, 30);
    assert!((5..=15).contains(&n), "back in the rotation: {n} of 30");
}

#[test]
fn at_most_the_share_is_ejected_and_all_out_fails_open() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let mut bed = Bed::new(4, ejection());
    let (a, b, d) = (bed.eps[0].clone(), bed.eps[1].clone(), bed.eps[2].clone());
    for _ in 0..3 {
        bed.fail_on(&mut c, &a);
    }
    for _ in 0..3 {
        bed.fail_on(&mut c, &b);
    }
    // 50 % of 4: the third is refused, and stays in.
    let mut last = Released::Released;
    for _ in 0..3 {
        last = bed.fail_on(&mut c, &d);
    }
    assert_eq!(last, Released::EjectionRefused);
    assert!(bed.share(&mut c, &d, 20) > 0);

    // One endpoint, ejected: the pick fails open, and says so.
    let mut one = Bed::new(1, ejection());
    one.keys = Keys::new("ailb", "solo", "outbound|8000||llm.static");
    let only = one.eps[0].clone();
    let mut released = Released::Released;
    for _ in 0..3 {
        released = one.fail_on(&mut c, &only);
    }
    assert_eq!(released, Released::Ejected, "at least one endpoint may go");
    let (ep, member, all_out) = one.pick_with(&mut c, None);
    assert_eq!((ep.as_str(), all_out), (only.as_str(), true));
    one.release(&mut c, &member, Learned::Nothing, false);
}

#[test]
fn a_failed_request_keeps_its_count_for_the_penalty() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let mut bed = Bed::new(
        2,
        Ejection {
            failure_penalty_ms: 2_000,
            ..ejection()
        },
    );
    let bad = bed.eps[0].clone();
    bed.fail_on(&mut c, &bad);
    assert_eq!(
        bed.load(&mut c, &bad),
        1.0,
        "the failed request still counts"
    );
    // So the next picks go to the other endpoint, not to the pod that looks idle.
    let (ep, member) = bed.pick(&mut c);
    assert_ne!(ep, bad);
    bed.release(&mut c, &member, Learned::Answered, false);
    bed.now += 2_000;
    let (ep, member) = bed.pick(&mut c); // its reclaim gives the penalty back first
    let expect = if ep == bad { 1.0 } else { 0.0 };
    assert_eq!(bed.load(&mut c, &bad), expect);
    bed.release(&mut c, &member, Learned::Answered, false);
}

#[test]
fn prefix_cache_spills_off_an_ejected_pod_that_holds_the_prefix() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let mut bed = Bed::new(3, ejection());
    let chain = PrefixChain {
        keys: vec![format!("{}:px:a", bed.keys.namespace)],
        cached_tokens: vec![100],
        prompt_tokens: 120,
        stream: false,
    };
    let (home, member, _) = bed.pick_with(&mut c, Some(&chain));
    bed.release(&mut c, &member, Learned::Answered, true);
    // The conversation's pod fails three times in a row (on other requests).
    for _ in 0..3 {
        bed.fail_on(&mut c, &home);
    }
    let (ep, member, _) = bed.pick_with(&mut c, Some(&chain));
    assert_ne!(ep, home, "the prefix match yields to the ejection");
    bed.release(&mut c, &member, Learned::Answered, true);
}

#[test]
fn failure_memory_off_learns_nothing() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let mut bed = Bed::new(2, Ejection::OFF);
    let bad = bed.eps[0].clone();
    for _ in 0..10 {
        assert_eq!(bed.fail_on(&mut c, &bad), Released::Released);
    }
    assert!(bed.share(&mut c, &bad, 10) > 0);
    assert_eq!(bed.load(&mut c, &bad), 0.0, "no penalty either");
}

/// The host's retry answered a request from another endpoint (docs/redis-data-model.md §14,
/// "Served elsewhere"): moved.lua moves its count there, under the same request id, and the
/// first endpoint's failure counts towards its ejection; a lease already gone moves nothing;
/// the stream end's release gives the moved count back, and the held count of the failed try
/// goes at its reclaim.
#[test]
fn a_lease_served_elsewhere_moves_to_the_endpoint_that_answered_and_its_own_failure_is_learned() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let mut bed = Bed::new(3, ejection());
    let (bad, good) = (bed.eps[0].clone(), bed.eps[1].clone());
    let moved = |bed: &mut Bed, c: &mut Conn, member: &str, to: &str| {
        let q = scripts::release::moved_call(
            &bed.keys,
            (member, to),
            false,
            (bed.now, bed.now + TTL_MS, &bed.ejection),
        );
        scripts::parse_release(&c.raw_reply(&q)).unwrap()
    };
    for n in 1..=3 {
        let (ep, member) = loop {
            let (ep, member) = bed.pick(&mut c);
            if ep == bad {
                break (ep, member);
            }
            bed.release(&mut c, &member, Learned::Answered, false);
        };
        assert_eq!((bed.load(&mut c, &ep), bed.load(&mut c, &good)), (1.0, 0.0));
        let want = if n < 3 {
            Released::Released
        } else {
            Released::Ejected
        };
        assert_eq!(moved(&mut bed, &mut c, &member, &good), want, "failure {n}");
        assert_eq!(bed.load(&mut c, &good), 1.0, "the count moved");
        assert_eq!(bed.load(&mut c, &bad) % 1e12, 0.0, "no penalty configured");
        // A lease moved (or reclaimed) already: nothing moves twice.
        assert_eq!(moved(&mut bed, &mut c, &member, &good), Released::Nothing);
        assert_eq!(bed.load(&mut c, &good), 1.0);
        // The stream end gives back the moved lease, learning the answer of `good`.
        let now_at_good = member.replacen(&format!("|{bad}|"), &format!("|{good}|"), 1);
        assert_eq!(
            bed.release(&mut c, &now_at_good, Learned::Answered, false),
            Released::Released
        );
        assert_eq!(bed.load(&mut c, &good), 0.0);
    }
    assert_eq!(
        bed.share(&mut c, &bad, 30),
        0,
        "ejected by its failed tries"
    );

    // With a penalty, the failed try's count stays on its endpoint until the reclaim; an
    // endpoint outside the pool takes no count.
    let mut bed = Bed::new(
        3,
        Ejection {
            failure_penalty_ms: 500,
            ..ejection()
        },
    );
    let (ep, member) = bed.pick(&mut c);
    assert_eq!(
        moved(&mut bed, &mut c, &member, "10.9.9.9:1"),
        Released::Released
    );
    assert_eq!(bed.load(&mut c, &ep), 1.0, "held for failurePenaltyMs");
    assert_eq!(
        c.cmd(&["ZCARD", &bed.keys.leases]),
        Value::Integer(1),
        "no lease on an endpoint outside the pool"
    );
    assert!(c
        .cmd(&["ZSCORE", &bed.keys.load, "10.9.9.9:1"])
        .as_str()
        .is_none());
    // Past the hold, the next pick's reclaim gives the failed try's count back: only the new
    // request's count is left in the pool.
    bed.now += 501;
    bed.pick(&mut c);
    let total: f64 = bed
        .eps
        .clone()
        .iter()
        .map(|e| bed.load(&mut c, e) % 1e12)
        .sum();
    assert_eq!(total, 1.0);
}
