//! The global_least_request and release scripts against a real redis-server, driven through
//! the same call builders and reply parsers the plugin uses.

// Test scaffolding helpers outside #[test] fns fail loudly by design.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ailb_core::redis::resp::Value;
use ailb_core::redis::scripts::{self, AcquireArgs, AcquireReply, Keys, ReplyError, Scripts};
use ailb_core::upstream::fingerprint;
use ailb_testkit::{Conn, RedisServer};
use std::collections::HashMap;

struct Glr {
    keys: Keys,
    scripts: Scripts,
    eps: Vec<String>,
    fp: String,
}

impl Glr {
    fn new(n: usize) -> Glr {
        let eps: Vec<String> = (1..=n)
            .map(|i| format!("10.0.{}.{}:8000", i / 250, i % 250))
            .collect();
        Glr::with(eps)
    }

    fn with(mut eps: Vec<String>) -> Glr {
        eps.sort();
        Glr {
            keys: Keys::new("ailb", "route", "outbound|8000||llm.static"),
            scripts: Scripts::new(),
            fp: fingerprint(&eps),
            eps,
        }
    }

    fn acquire(&self, c: &mut Conn, a: Acq) -> Result<AcquireReply, ReplyError> {
        let args = AcquireArgs {
            now_ms: a.now,
            lease_ttl_ms: a.ttl,
            request_id: a.rid,
            cost: a.cost,
            cap: a.cap,
            random: a.random,
            fingerprint: &self.fp,
            reclaim: a.reclaim,
            endpoints: a.sync.then_some(self.eps.as_slice()),
            session: None,
            wait_rank: None,
            pool_cap: 0,
            tenant: None,
            trials: 0,
        };
        let q = scripts::acquire_call(&self.scripts, false, &self.keys, &args);
        scripts::parse_acquire(&c.raw_reply(&q))
    }

    fn pick(&self, c: &mut Conn, rid: &str, random: u32) -> String {
        match self
            .acquire(
                c,
                Acq {
                    rid,
                    random,
                    ..Acq::default()
                },
            )
            .unwrap()
        {
            AcquireReply::Picked { endpoint, .. } => endpoint,
            other => panic!("expected a pick, got {other:?}"),
        }
    }

    fn sync(&self, c: &mut Conn) {
        // A pick with the list syncs membership; release it again.
        let ep = match self
            .acquire(
                c,
                Acq {
                    rid: "sync",
                    sync: true,
                    ..Acq::default()
                },
            )
            .unwrap()
        {
            AcquireReply::Picked { endpoint, .. } => endpoint,
            other => panic!("{other:?}"),
        };
        assert!(self.release(c, &[scripts::lease_member("sync", &ep, 1, None)]));
    }

    fn release(&self, c: &mut Conn, members: &[String]) -> bool {
        let q = scripts::release::release_call(
            (&self.scripts, false),
            &self.keys,
            members,
            false,
            (
                scripts::release::Learned::Nothing,
                0,
                &ailb_core::config::Ejection::OFF,
            ),
        );
        scripts::parse_release(&c.raw_reply(&q)).unwrap() != scripts::Released::Nothing
    }

    fn loads(&self, c: &mut Conn) -> HashMap<String, f64> {
        let Value::Array(Some(items)) =
            c.cmd(&["ZRANGE", &self.keys.load, "0", "-1", "WITHSCORES"])
        else {
            panic!()
        };
        items
            .chunks(2)
            .map(|p| (p[0].as_str().unwrap().to_string(), p[1].as_f64().unwrap()))
            .collect()
    }

    fn lease_count(&self, c: &mut Conn) -> i64 {
        c.cmd(&["ZCARD", &self.keys.leases]).as_i64().unwrap()
    }
}

#[derive(Clone, Copy)]
struct Acq<'a> {
    rid: &'a str,
    now: u64,
    ttl: u64,
    cost: u64,
    cap: u64,
    random: u32,
    reclaim: u32,
    sync: bool,
}

impl Default for Acq<'_> {
    fn default() -> Self {
        Acq {
            rid: "r",
            now: 1_000_000,
            ttl: 600_000,
            cost: 1,
            cap: 0,
            random: 0,
            reclaim: 0,
            sync: false,
        }
    }
}

#[test]
fn it_picks_least_loaded_and_counts_unknown_endpoints_as_zero() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let g = Glr::new(3);
    // Nothing synced yet: the script asks for the list instead of guessing.
    assert_eq!(g.acquire(&mut c, Acq::default()), Ok(AcquireReply::Sync));
    g.sync(&mut c);
    let mut picked = Vec::new();
    for i in 0..6 {
        picked.push(g.pick(&mut c, &format!("r{i}"), i * 7919));
    }
    let loads = g.loads(&mut c);
    assert_eq!(loads.len(), 3);
    assert!(loads.values().all(|&l| l == 2.0), "{loads:?}");
    assert_eq!(g.lease_count(&mut c), 6);
}

#[test]
fn it_releases_idempotently() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let g = Glr::new(2);
    g.sync(&mut c);
    let ep = g.pick(&mut c, "a", 0);
    let lease = scripts::lease_member("a", &ep, 1, None);
    assert!(g.release(&mut c, std::slice::from_ref(&lease)));
    assert!(!g.release(&mut c, &[lease]), "second release is a no-op");
    assert!(g.loads(&mut c).values().all(|&l| l == 0.0));
    assert_eq!(g.lease_count(&mut c), 0);
}

#[test]
fn it_releases_the_one_present_lease_among_candidates() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let g = Glr::new(4);
    g.sync(&mut c);
    let ep = g.pick(&mut c, "lost", 3);
    // After a lost reply the plugin offers every possible member.
    let all: Vec<String> = g
        .eps
        .iter()
        .map(|e| scripts::lease_member("lost", e, 1, None))
        .collect();
    assert!(g.release(&mut c, &all));
    assert_eq!(g.loads(&mut c)[&ep], 0.0);
    assert!(!g.release(&mut c, &all));
}

#[test]
fn it_reclaims_expired_leases() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let g = Glr::new(2);
    g.sync(&mut c);
    for i in 0..5 {
        g.acquire(
            &mut c,
            Acq {
                rid: &format!("crashed{i}"),
                ttl: 10,
                ..Acq::default()
            },
        )
        .unwrap();
    }
    assert_eq!(g.loads(&mut c).values().sum::<f64>(), 5.0);
    // Later, picks with a reclaim budget give the expired leases back, a few at a time.
    let later = Acq {
        now: 2_000_000,
        reclaim: 4,
        ..Acq::default()
    };
    let ep = match g.acquire(&mut c, Acq { rid: "x", ..later }).unwrap() {
        AcquireReply::Picked { endpoint, .. } => endpoint,
        other => panic!("{other:?}"),
    };
    assert_eq!(g.lease_count(&mut c), 2, "4 reclaimed, 1 left, 1 new");
    g.acquire(&mut c, Acq { rid: "y", ..later }).unwrap();
    assert_eq!(
        g.lease_count(&mut c),
        2,
        "the last expired one reclaimed, 1 new"
    );
    assert_eq!(g.loads(&mut c).values().sum::<f64>(), 2.0);
    // A reclaimed lease's late release does not subtract again.
    assert!(!g.release(&mut c, &[scripts::lease_member("crashed0", &ep, 1, None)]));
    assert!(g.loads(&mut c).values().all(|&l| l >= 0.0));
}

#[test]
fn it_follows_membership_changes() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let abc = Glr::with(vec!["a:1".into(), "b:1".into(), "c:1".into()]);
    abc.sync(&mut c);
    let mut held = Vec::new();
    for i in 0..3 {
        let rid = format!("h{i}");
        let ep = abc.pick(&mut c, &rid, i);
        held.push(scripts::lease_member(&rid, &ep, 1, None));
    }
    // c leaves: another view of the set; the old fingerprint no longer matches.
    let ab = Glr::with(vec!["a:1".into(), "b:1".into()]);
    ab.sync(&mut c);
    // The old view's fingerprint no longer matches: it is asked to resync, nothing is taken.
    assert_eq!(
        abc.acquire(
            &mut c,
            Acq {
                rid: "z",
                ..Acq::default()
            }
        ),
        Ok(AcquireReply::Sync)
    );
    let loads = ab.loads(&mut c);
    assert_eq!(loads.keys().count(), 2, "{loads:?}");
    assert!(!loads.contains_key("c:1"));
    for _ in 0..4 {
        assert_ne!(ab.pick(&mut c, "n", 1), "c:1");
    }
    // Releasing a lease on the removed endpoint does not bring it back.
    for m in &held {
        ab.release(&mut c, std::slice::from_ref(m));
    }
    assert!(!ab.loads(&mut c).contains_key("c:1"));
    // d joins and starts at 0, so it is picked first.
    let abd = Glr::with(vec!["a:1".into(), "b:1".into(), "d:1".into()]);
    abd.sync(&mut c);
    assert_eq!(abd.loads(&mut c)["d:1"], 0.0);
    assert_eq!(abd.pick(&mut c, "d", 0), "d:1");
}

#[test]
fn it_answers_full_at_the_cap_without_incrementing() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let g = Glr::new(2);
    g.sync(&mut c);
    // Each pick also answers its endpoint's load before it (the plugin counts the top class's
    // headroom from it): least-loaded first, so 0, 0, then 1, 1.
    for (i, want) in [0, 0, 1, 1].into_iter().enumerate() {
        let r = g.acquire(
            &mut c,
            Acq {
                rid: &format!("r{i}"),
                cap: 2,
                random: i as u32,
                ..Acq::default()
            },
        );
        assert!(
            matches!(r, Ok(AcquireReply::Picked { load_before: Some(l), .. }) if l == want),
            "{r:?}"
        );
    }
    assert_eq!(
        g.acquire(
            &mut c,
            Acq {
                rid: "over",
                cap: 2,
                ..Acq::default()
            }
        ),
        Ok(AcquireReply::Full)
    );
    assert_eq!(
        g.loads(&mut c).values().sum::<f64>(),
        4.0,
        "nothing to roll back"
    );
    assert_eq!(g.lease_count(&mut c), 4);
}

#[test]
fn it_weights_by_cost() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let g = Glr::new(2);
    g.sync(&mut c);
    let big = match g
        .acquire(
            &mut c,
            Acq {
                rid: "big",
                cost: 1000,
                ..Acq::default()
            },
        )
        .unwrap()
    {
        AcquireReply::Picked { endpoint, .. } => endpoint,
        other => panic!("{other:?}"),
    };
    // Ten small requests all go to the other endpoint.
    for i in 0..10 {
        assert_ne!(g.pick(&mut c, &format!("s{i}"), i), big);
    }
    assert!(g.release(&mut c, &[scripts::lease_member("big", &big, 1000, None)]));
    assert_eq!(g.loads(&mut c)[&big], 0.0);
}

#[test]
fn it_reports_noscript_for_an_unknown_sha() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let g = Glr::new(2);
    let args = AcquireArgs {
        now_ms: 1,
        lease_ttl_ms: 1,
        request_id: "r",
        cost: 1,
        cap: 0,
        random: 0,
        fingerprint: &g.fp,
        reclaim: 0,
        endpoints: None,
        session: None,
        wait_rank: None,
        pool_cap: 0,
        tenant: None,
        trials: 0,
    };
    let q = scripts::acquire_call(&g.scripts, true, &g.keys, &args);
    assert_eq!(
        scripts::parse_acquire(&c.raw_reply(&q)),
        Err(ReplyError::NoScript)
    );
}

#[test]
fn it_breaks_ties_uniformly() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let g = Glr::new(4);
    g.sync(&mut c);
    let mut counts: HashMap<String, u32> = HashMap::new();
    let mut rng: u64 = 12345;
    let trials = 4000;
    for i in 0..trials {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let rid = format!("t{i}");
        let ep = g.pick(&mut c, &rid, (rng >> 32) as u32);
        assert!(g.release(&mut c, &[scripts::lease_member(&rid, &ep, 1, None)]));
        *counts.entry(ep).or_default() += 1;
    }
    let expected = trials as f64 / 4.0;
    let chi2: f64 = g
        .eps
        .iter()
        .map(|e| {
            let o = f64::from(*counts.get(e).unwrap_or(&0));
            (o - expected).powi(2) / expected
        })
        .sum();
    // 3 degrees of freedom: P(chi2 > 16.27) = 0.001 for a uniform choice.
    assert!(chi2 < 16.27, "ties not uniform: {counts:?} chi2={chi2}");
}

#[test]
fn it_never_double_counts_under_concurrency() {
    let redis = RedisServer::start();
    let g = std::sync::Arc::new(Glr::new(8));
    g.sync(&mut redis.conn());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // A checker compares the loads with the leases atomically while 16 clients churn.
    let checker = {
        let (port, g, stop) = (redis.port, g.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut c = Conn::try_connect(port).unwrap();
            let check = "local s = 0 local m = 0 local z = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES') \
                for i = 2, #z, 2 do s = s + tonumber(z[i]) if tonumber(z[i]) < m then m = tonumber(z[i]) end end \
                return {tostring(s), redis.call('ZCARD', KEYS[2]), tostring(m)}";
            let mut samples = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let Value::Array(Some(v)) =
                    c.cmd(&["EVAL", check, "2", &g.keys.load, &g.keys.leases])
                else {
                    panic!()
                };
                let (sum, leases, min) = (
                    v[0].as_f64().unwrap(),
                    v[1].as_i64().unwrap(),
                    v[2].as_f64().unwrap(),
                );
                assert_eq!(sum, leases as f64, "load sum must equal live leases");
                assert!(min >= 0.0, "negative load {min}");
                samples += 1;
            }
            samples
        })
    };
    let workers: Vec<_> = (0..16)
        .map(|t| {
            let (port, g) = (redis.port, g.clone());
            std::thread::spawn(move || {
                let mut c = Conn::try_connect(port).unwrap();
                let mut held: Vec<String> = Vec::new();
                for i in 0..300u32 {
                    let rid = format!("w{t}-{i}");
                    let ep = g.pick(&mut c, &rid, i.wrapping_mul(2654435761) ^ t);
                    held.push(scripts::lease_member(&rid, &ep, 1, None));
                    if held.len() > 3 || i % 5 == 0 {
                        let m = held.remove(0);
                        assert!(g.release(&mut c, std::slice::from_ref(&m)));
                        // A duplicate release (e.g. on_log after on_done) changes nothing.
                        assert!(!g.release(&mut c, &[m]));
                    }
                }
                for m in held {
                    assert!(g.release(&mut c, &[m]));
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let samples = checker.join().unwrap();
    assert!(samples > 10, "checker ran {samples} times");
    let mut c = redis.conn();
    assert!(
        g.loads(&mut c).values().all(|&l| l == 0.0),
        "{:?}",
        g.loads(&mut c)
    );
    assert_eq!(g.lease_count(&mut c), 0);
}

#[test]
fn it_runs_on_a_redis_cluster_node() {
    // One-node Redis Cluster: a script touching keys in two slots (as Higress's do) fails
    // with CROSSSLOT there; ours declares every key and shares one hash tag.
    let redis = RedisServer::start_cluster();
    let mut c = redis.conn();
    let g = Glr::new(3);
    g.sync(&mut c);
    let ep = g.pick(&mut c, "k", 1);
    assert!(g.release(&mut c, &[scripts::lease_member("k", &ep, 1, None)]));
    // The same test harness does see CROSSSLOT for keys in different slots.
    let bad = c.cmd(&["EVAL", "return 1", "2", "{a}x", "{b}y"]);
    assert!(
        matches!(bad, Value::Error(ref e) if e.contains("CROSSSLOT")),
        "{bad:?}"
    );
}

#[test]
fn priority_class_caps_shed_lower_classes_first_across_gateways() {
    // The class cap each gateway sends (docs/sessions-and-queues.md "Priority classes"), from the plugin's own
    // config reading; two connections stand for two gateways sharing the counts.
    let doc = r#"{"lb_policy":"global_least_request","lb_config":{"serviceFQDN":"redis.static",
        "servicePort":6379,"maxRequestCount":4,"priorityHeader":"x-priority",
        "criticalHeadroom":2,"priorityReserve":1}}"#;
    let cfg = ailb_core::config::PluginConfig::parse(doc.as_bytes()).unwrap();
    let route = cfg.global.unwrap();
    let p = route.common.priority.clone().unwrap();
    let cap = |value: &str| p.cap_for(p.class_of(Some(value)).rank, route.common.max_load);
    assert_eq!(
        [cap("critical"), cap("standard"), cap("sheddable")],
        [6, 4, 3]
    );

    let redis = RedisServer::start();
    let mut gateways = [redis.conn(), redis.conn()];
    let g = Glr::new(2);
    g.sync(&mut gateways[0]);
    let mut leases = Vec::new();
    let mut n = 0u32;
    // Admits requests of `class` until the first Full; how many got in.
    let mut fill = |gateways: &mut [Conn; 2], class: &str| -> usize {
        let mut admitted = 0;
        loop {
            n += 1;
            let rid = format!("r{n}");
            let c = &mut gateways[n as usize % 2];
            let r = g.acquire(
                c,
                Acq {
                    rid: &rid,
                    cap: cap(class),
                    random: n,
                    ..Acq::default()
                },
            );
            match r {
                Ok(AcquireReply::Picked { endpoint, .. }) => {
                    leases.push(scripts::lease_member(&rid, &endpoint, 1, None));
                    admitted += 1;
                }
                Ok(AcquireReply::Full) => return admitted,
                other => panic!("{other:?}"),
            }
        }
    };
    assert_eq!(
        fill(&mut gateways, "sheddable"),
        6,
        "sheddable: up to 3 per endpoint"
    );
    assert_eq!(fill(&mut gateways, "sheddable"), 0);
    assert_eq!(
        fill(&mut gateways, "standard"),
        2,
        "standard: up to the cap of 4"
    );
    assert_eq!(
        fill(&mut gateways, "critical"),
        4,
        "critical: 2 of headroom each"
    );
    assert_eq!(fill(&mut gateways, "standard"), 0);
    assert_eq!(g.loads(&mut gateways[0]).values().sum::<f64>(), 12.0);
    assert_eq!(
        g.lease_count(&mut gateways[1]),
        12,
        "a Full writes no lease"
    );
    for (i, m) in leases.iter().enumerate() {
        assert!(g.release(&mut gateways[i % 2], std::slice::from_ref(m)));
    }
    assert_eq!(g.loads(&mut gateways[0]).values().sum::<f64>(), 0.0);
    assert_eq!(g.lease_count(&mut gateways[0]), 0);
}
