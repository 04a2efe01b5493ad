//! The pool cap and tenant fairness in the acquire scripts (docs/redis-data-model.md §11)
//! against a real redis-server, through the plugin's own call builders and reply parsers: two
//! connections stand for two gateways sharing the counts.

// Test scaffolding helpers outside #[test] fns fail loudly by design.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ailb_core::config::TokenGate;
use ailb_core::config::{Fairness, PluginConfig};
use ailb_core::redis::resp::Value;
use ailb_core::redis::scripts::{
    self, AcquireArgs, AcquireReply, Keys, PrefixArgs, PrefixChain, Scripts, TenantArgs,
};
use ailb_core::upstream::fingerprint;
use ailb_testkit::{Conn, RedisServer};

const WINDOW_MS: u64 = 1_000;

struct Bed {
    keys: Keys,
    scripts: Scripts,
    eps: Vec<String>,
    fp: String,
}

/// One acquire: request id, tenant (id, limit), pool cap, clock, lease TTL, reclaim.
#[derive(Clone)]
struct Acq<'a> {
    rid: String,
    tenant: Option<(&'a str, u64)>,
    pool_cap: u64,
    now: u64,
    ttl: u64,
    reclaim: u32,
    prefix: bool,
}

impl Default for Acq<'_> {
    fn default() -> Self {
        Acq {
            rid: "r".into(),
            tenant: None,
            pool_cap: 0,
            now: 1_000_000,
            ttl: 600_000,
            reclaim: 0,
            prefix: false,
        }
    }
}

impl Bed {
    fn new(n: usize) -> Bed {
        let mut eps: Vec<String> = (1..=n).map(|i| format!("10.0.0.{i}:8000")).collect();
        eps.sort();
        Bed {
            keys: Keys::new("ailb", "chat", "outbound|8000||llm.static"),
            scripts: Scripts::new(),
            fp: fingerprint(&eps),
            eps,
        }
    }

    fn acquire(&self, c: &mut Conn, a: &Acq, sync: bool) -> AcquireReply {
        let args = AcquireArgs {
            now_ms: a.now,
            lease_ttl_ms: a.ttl,
            request_id: &a.rid,
            cost: 1,
            cap: 0,
            random: 7,
            fingerprint: &self.fp,
            reclaim: a.reclaim,
            endpoints: sync.then_some(self.eps.as_slice()),
            session: None,
            wait_rank: None,
            pool_cap: a.pool_cap,
            tenant: a.tenant.map(|(id, limit)| TenantArgs {
                id,
                limit,
                window_ms: WINDOW_MS,
            }),
            trials: 0,
        };
        let chain = PrefixChain {
            keys: vec![format!("{}:px:0000000000000001", self.keys.namespace)],
            ..PrefixChain::default()
        };
        let prefix = PrefixArgs {
            chain: &chain,
            ttl_s: 60,
            max_imbalance: 8,
            max_imbalance_ratio: 1.5,
            gate: TokenGate::default(),
            latency: None,
        };
        let q = scripts::pick_call(
            &self.scripts,
            false,
            &self.keys,
            &args,
            a.prefix.then_some(&prefix),
        );
        scripts::parse_acquire(&c.raw_reply(&q)).unwrap()
    }

    /// Acquires; the lease member it wrote when it picked.
    fn take(&self, c: &mut Conn, a: &Acq) -> Result<String, AcquireReply> {
        match self.acquire(c, a, false) {
            AcquireReply::Picked { endpoint, .. } => Ok(scripts::lease_member(
                &a.rid,
                &endpoint,
                1,
                a.tenant.map(|(t, _)| t),
            )),
            other => Err(other),
        }
    }

    fn sync(&self, c: &mut Conn) {
        let a = Acq {
            rid: "sync".into(),
            ..Acq::default()
        };
        let AcquireReply::Picked { endpoint, .. } = self.acquire(c, &a, true) else {
            panic!("sync")
        };
        assert!(self.release(c, &[scripts::lease_member("sync", &endpoint, 1, None)]));
    }

    fn release(&self, c: &mut Conn, members: &[String]) -> bool {
        let q = scripts::release::release_call(
            (&self.scripts, false),
            &self.keys,
            members,
            true,
            (
                scripts::release::Learned::Nothing,
                0,
                &ailb_core::config::Ejection::OFF,
            ),
        );
        scripts::parse_release(&c.raw_reply(&q)).unwrap() != scripts::Released::Nothing
    }

    fn pool_load(&self, c: &mut Conn) -> f64 {
        let Value::Array(Some(items)) =
            c.cmd(&["ZRANGE", &self.keys.load, "0", "-1", "WITHSCORES"])
        else {
            panic!()
        };
        items.chunks(2).map(|p| p[1].as_f64().unwrap()).sum()
    }

    fn tenant_load(&self, c: &mut Conn, tenant: &str) -> i64 {
        match c.cmd(&["HGET", &self.keys.tenants, tenant]) {
            Value::Bulk(None) => 0,
            v => v.as_str().unwrap().parse().unwrap(),
        }
    }

    fn tenants_held(&self, c: &mut Conn) -> i64 {
        c.cmd(&["HLEN", &self.keys.tenants]).as_i64().unwrap()
    }

    fn lease_count(&self, c: &mut Conn) -> i64 {
        c.cmd(&["ZCARD", &self.keys.leases]).as_i64().unwrap()
    }
}

#[test]
fn the_pool_cap_holds_across_gateways_and_class_caps_apply_to_it() {
    // The caps each gateway sends, from the plugin's own config reading.
    let doc = r#"{"lb_policy":"global_least_request","lb_config":{"serviceFQDN":"redis.static",
        "servicePort":6379,"maxPoolRequests":6,"priorityHeader":"x-priority",
        "criticalHeadroom":2,"priorityReserve":2}}"#;
    let route = PluginConfig::parse(doc.as_bytes()).unwrap().global.unwrap();
    let p = route.common.priority.clone().unwrap();
    let cap = |v: &str| p.cap_for(p.class_of(Some(v)).rank, route.common.max_pool);
    assert_eq!(
        [cap("critical"), cap("standard"), cap("sheddable")],
        [8, 6, 4]
    );

    let redis = RedisServer::start();
    let mut gw = [redis.conn(), redis.conn()];
    let b = Bed::new(3);
    b.sync(&mut gw[0]);
    let mut held = Vec::new();
    let mut n = 0;
    for prefix in [false, true] {
        let mut fill = |gw: &mut [Conn; 2], class: &str| -> usize {
            let mut admitted = 0;
            loop {
                n += 1;
                let a = Acq {
                    rid: format!("r{n}"),
                    pool_cap: cap(class),
                    prefix,
                    ..Acq::default()
                };
                match b.take(&mut gw[n % 2], &a) {
                    Ok(m) => {
                        held.push(m);
                        admitted += 1;
                    }
                    Err(AcquireReply::PoolFull) => return admitted,
                    Err(other) => panic!("{other:?}"),
                }
            }
        };
        assert_eq!(fill(&mut gw, "sheddable"), 4, "prefix={prefix}");
        assert_eq!(fill(&mut gw, "standard"), 2);
        assert_eq!(fill(&mut gw, "critical"), 2);
        assert_eq!(fill(&mut gw, "sheddable"), 0);
        assert_eq!(b.pool_load(&mut gw[0]), 8.0);
        assert_eq!(b.lease_count(&mut gw[1]), 8, "a refusal writes no lease");
        for (i, m) in held.drain(..).enumerate() {
            assert!(b.release(&mut gw[i % 2], std::slice::from_ref(&m)));
        }
        assert_eq!(b.pool_load(&mut gw[0]), 0.0);
        assert_eq!(b.lease_count(&mut gw[0]), 0);
    }
}

#[test]
fn a_tenant_is_held_to_its_share_only_while_another_is_active() {
    let redis = RedisServer::start();
    let mut gw = [redis.conn(), redis.conn()];
    let b = Bed::new(2);
    b.sync(&mut gw[0]);
    // Capacity 8 (the pool cap), shares 0.5: each tenant's limit is 4.
    let limit = Fairness::limit(0.5, 8);
    assert_eq!(limit, 4);
    let (flood, quiet) = ("aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb");
    let mut n = 0;
    let mut held = Vec::new();
    let mut go = |gw: &mut [Conn; 2], held: &mut Vec<String>, tenant: &str, now: u64| {
        n += 1;
        let a = Acq {
            rid: format!("r{n}"),
            tenant: Some((tenant, limit)),
            pool_cap: 8,
            now,
            ..Acq::default()
        };
        let r = b.take(&mut gw[n % 2], &a);
        if let Ok(m) = &r {
            held.push(m.clone());
        }
        r.map(|_| ())
    };
    let t0 = 1_000_000;
    // Alone, the flooding tenant uses the whole pool (work-conserving)...
    for i in 0..8 {
        assert_eq!(go(&mut gw, &mut held, flood, t0), Ok(()), "alone {i}");
    }
    assert_eq!(
        go(&mut gw, &mut held, flood, t0),
        Err(AcquireReply::PoolFull)
    );
    // ...and the quiet tenant, arriving at a full pool, is refused by the pool cap but is now
    // active (it asked), so freed room goes to it, not to the flood.
    assert_eq!(
        go(&mut gw, &mut held, quiet, t0),
        Err(AcquireReply::PoolFull)
    );
    assert!(b.release(&mut gw[0], &[held.remove(0)]));
    assert_eq!(go(&mut gw, &mut held, flood, t0), Err(AcquireReply::Tenant));
    for m in held.drain(..4) {
        assert!(b.release(&mut gw[0], &[m]));
    }
    assert_eq!(b.tenant_load(&mut gw[0], flood), 3);
    assert_eq!(go(&mut gw, &mut held, quiet, t0 + 1), Ok(()));
    assert_eq!(
        go(&mut gw, &mut held, flood, t0 + 2),
        Ok(()),
        "3 < 4: under its share"
    );
    assert_eq!(
        go(&mut gw, &mut held, flood, t0 + 3),
        Err(AcquireReply::Tenant),
        "at its share while the quiet tenant is active"
    );
    for _ in 0..3 {
        assert_eq!(go(&mut gw, &mut held, quiet, t0 + 4), Ok(()));
    }
    assert_eq!(
        go(&mut gw, &mut held, quiet, t0 + 5),
        Err(AcquireReply::PoolFull)
    );
    assert_eq!(b.tenant_load(&mut gw[1], quiet), 4);
    // The quiet tenant finishes and stays quiet past the window: the flood has it all again.
    let quiet_leases: Vec<String> = held
        .iter()
        .filter(|m| m.contains(&format!("~{quiet}|")))
        .cloned()
        .collect();
    assert_eq!(quiet_leases.len(), 4);
    for m in &quiet_leases {
        assert!(b.release(&mut gw[1], std::slice::from_ref(m)));
    }
    held.retain(|m| !quiet_leases.contains(m));
    assert_eq!(
        go(&mut gw, &mut held, flood, t0 + 100),
        Err(AcquireReply::Tenant),
        "the quiet tenant was seen within the window"
    );
    let later = t0 + 5 + WINDOW_MS + 1;
    for i in 0..4 {
        assert_eq!(
            go(&mut gw, &mut held, flood, later),
            Ok(()),
            "after the window {i}"
        );
    }
    assert_eq!(b.tenant_load(&mut gw[0], flood), 8);
    for (i, m) in held.drain(..).enumerate() {
        assert!(b.release(&mut gw[i % 2], std::slice::from_ref(&m)));
    }
    assert_eq!(b.pool_load(&mut gw[0]), 0.0);
    assert_eq!(b.tenants_held(&mut gw[0]), 0, "counts at 0 are deleted");
    assert_eq!(b.lease_count(&mut gw[0]), 0);
}

#[test]
fn requests_without_a_tenant_are_neither_counted_nor_refused() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let b = Bed::new(2);
    b.sync(&mut c);
    let t = "cccccccccccccccc";
    let a = |rid: &str, tenant: Option<(&'static str, u64)>| Acq {
        rid: rid.into(),
        tenant,
        ..Acq::default()
    };
    let m1 = b.take(&mut c, &a("t1", Some((t, 1)))).unwrap();
    // Anonymous traffic makes nobody "active": the tenant goes past its limit of 1.
    let m2 = b.take(&mut c, &a("n1", None)).unwrap();
    let m3 = b.take(&mut c, &a("t2", Some((t, 1)))).unwrap();
    assert_eq!(b.tenant_load(&mut c, t), 2);
    assert_eq!(b.tenants_held(&mut c), 1);
    for m in [m1, m2, m3] {
        assert!(b.release(&mut c, &[m]));
    }
    assert_eq!(b.tenants_held(&mut c), 0);
    assert_eq!(b.pool_load(&mut c), 0.0);
}

#[test]
fn reclaim_heals_the_pool_and_the_tenant_counts_of_a_crashed_gateway() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let b = Bed::new(2);
    b.sync(&mut c);
    let (x, y) = ("1111111111111111", "2222222222222222");
    for (i, t) in [x, x, y].iter().enumerate() {
        // A gateway that dies holding these: short leases, never released.
        b.take(
            &mut c,
            &Acq {
                rid: format!("dead{i}"),
                tenant: Some((t, 10)),
                pool_cap: 3,
                ttl: 10,
                prefix: i == 2,
                ..Acq::default()
            },
        )
        .unwrap();
    }
    assert_eq!(b.pool_load(&mut c), 3.0);
    assert_eq!((b.tenant_load(&mut c, x), b.tenant_load(&mut c, y)), (2, 1));
    // The pool is full until the leases expire and an acquire reclaims them.
    let next = |rid: &str, now, reclaim| Acq {
        rid: rid.into(),
        tenant: Some((x, 10)),
        pool_cap: 3,
        now,
        reclaim,
        ..Acq::default()
    };
    assert_eq!(
        b.take(&mut c, &next("n0", 1_000_005, 4)),
        Err(AcquireReply::PoolFull)
    );
    let m = b.take(&mut c, &next("n1", 1_000_011, 4)).unwrap();
    assert_eq!(b.pool_load(&mut c), 1.0);
    assert_eq!(b.tenant_load(&mut c, x), 1);
    assert_eq!(b.tenant_load(&mut c, y), 0);
    assert!(b.release(&mut c, &[m]));
    assert_eq!(b.tenants_held(&mut c), 0);
    assert_eq!(b.lease_count(&mut c), 0);
}

#[test]
fn a_lost_reply_releases_the_tenant_count_too() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let b = Bed::new(3);
    b.sync(&mut c);
    let t = "abcdefabcdefabcd";
    let a = Acq {
        rid: "lost".into(),
        tenant: Some((t, 5)),
        ..Acq::default()
    };
    b.take(&mut c, &a).unwrap();
    // The plugin offers every member the pick could have written (EndpointPick::every_lease).
    let all: Vec<String> = b
        .eps
        .iter()
        .map(|e| scripts::lease_member("lost", e, 1, Some(t)))
        .collect();
    assert!(b.release(&mut c, &all));
    assert!(!b.release(&mut c, &all), "idempotent");
    assert_eq!(b.tenants_held(&mut c), 0);
    assert_eq!(b.pool_load(&mut c), 0.0);
}
