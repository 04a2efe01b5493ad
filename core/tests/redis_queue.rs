//! The waiting queue's Redis side (docs/redis-data-model.md §12) against a real redis-server:
//! the acquire scripts refuse a lower class while higher classes wait (any gateway's entries in
//! the route's wait set) and the free room at its cap is no more than their number; expired
//! entries neither count nor stay; the same through the prefix_cache script with a session.

// Test scaffolding helpers outside #[test] fns fail loudly by design.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ailb_core::balancer::WAIT_RANK;
use ailb_core::config::TokenGate;
use ailb_core::redis::scripts::{
    self, AcquireArgs, AcquireReply, Keys, PrefixArgs, PrefixChain, Scripts, SessionArgs,
    TenantArgs,
};
use ailb_core::upstream::fingerprint;
use ailb_testkit::{Conn, RedisServer};

const NOW: u64 = 1_700_000_000_000;

struct Route {
    keys: Keys,
    scripts: Scripts,
    eps: Vec<String>,
    fp: String,
}

impl Route {
    fn new() -> Route {
        let eps = vec!["10.0.0.1:80".to_string(), "10.0.0.2:80".to_string()];
        Route {
            keys: Keys::new("ailb", "chat", "outbound|8000||llm.static"),
            scripts: Scripts::new(),
            fp: fingerprint(&eps),
            eps,
        }
    }

    /// One acquire at cap `cap` with the waiting-queue `rank` (None: no check); `prefix`: through
    /// prefix_cache's script with a one-key chain and a session.
    fn acquire(
        &self,
        c: &mut Conn,
        rid: &str,
        cap: u64,
        rank: Option<usize>,
        prefix: bool,
    ) -> AcquireReply {
        self.acquire_pool(c, rid, cap, 0, None, rank, prefix)
    }

    /// [`Route::acquire`] with `maxPoolRequests` `pool_cap` and a tenant (id, limit).
    #[allow(clippy::too_many_arguments)]
    fn acquire_pool(
        &self,
        c: &mut Conn,
        rid: &str,
        cap: u64,
        pool_cap: u64,
        tenant: Option<(&str, u64)>,
        rank: Option<usize>,
        prefix: bool,
    ) -> AcquireReply {
        let session_key = scripts::session_key(&self.keys.namespace, b"s1");
        let chain = vec![format!("{}:px:0000000000000001", self.keys.namespace)];
        let args = AcquireArgs {
            now_ms: NOW,
            lease_ttl_ms: 600_000,
            request_id: rid,
            cost: 1,
            cap,
            random: 0,
            fingerprint: &self.fp,
            reclaim: 0,
            endpoints: Some(&self.eps),
            session: prefix.then(|| SessionArgs {
                key: &session_key,
                ttl_s: 60,
                max_imbalance: 8,
                max_imbalance_ratio: 1.5,
            }),
            wait_rank: rank,
            pool_cap,
            tenant: tenant.map(|(id, limit)| TenantArgs {
                id,
                limit,
                window_ms: 10_000,
            }),
            trials: 0,
        };
        let chain = PrefixChain {
            keys: chain,
            ..PrefixChain::default()
        };
        let px = PrefixArgs {
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
            prefix.then_some(&px),
        );
        scripts::parse_acquire(&c.raw_reply(&q)).unwrap()
    }

    fn picked(&self, c: &mut Conn, rid: &str, cap: u64, rank: Option<usize>, prefix: bool) -> bool {
        match self.acquire(c, rid, cap, rank, prefix) {
            AcquireReply::Picked { .. } => true,
            AcquireReply::Full => false,
            other => panic!("{other:?}"),
        }
    }

    /// A waiter of `rank` whose deadline is `deadline` (as the plugin writes it).
    fn wait(&self, c: &mut Conn, id: &str, rank: u64, deadline: u64) {
        let score = (rank * WAIT_RANK + deadline).to_string();
        c.cmd(&["ZADD", self.keys.wait.as_str(), score.as_str(), id]);
    }

    fn unwait(&self, c: &mut Conn, id: &str) {
        c.cmd(&["ZREM", self.keys.wait.as_str(), id]);
    }

    fn waiters(&self, c: &mut Conn) -> i64 {
        c.cmd(&["ZCARD", self.keys.wait.as_str()]).as_i64().unwrap()
    }

    fn set_loads(&self, c: &mut Conn, a: u64, b: u64) {
        let (a, b) = (a.to_string(), b.to_string());
        c.cmd(&[
            "ZADD",
            self.keys.load.as_str(),
            a.as_str(),
            &self.eps[0],
            b.as_str(),
            &self.eps[1],
        ]);
    }
}

#[test]
fn a_lower_class_gives_the_last_room_to_higher_classes_waiting() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let r = Route::new();
    assert!(r.picked(&mut c, "sync", 4, None, false));
    // Cap 4: one slot free in the pool (loads 4 and 3).
    r.set_loads(&mut c, 4, 3);
    r.wait(&mut c, "gw-a-1", 0, NOW + 1000);
    assert!(
        !r.picked(&mut c, "std", 4, Some(1), false),
        "one critical waits, one slot free: the standard request leaves it"
    );
    assert!(!r.picked(&mut c, "shed", 4, Some(2), false));
    assert!(
        r.picked(&mut c, "crit", 4, Some(0), false),
        "the highest class is never outranked"
    );
    // The critical request took the slot (loads 4, 4) and a second slot frees: room 1, one
    // critical still waits on another gateway.
    r.set_loads(&mut c, 4, 3);
    r.wait(&mut c, "gw-b-1", 0, NOW + 1000);
    r.unwait(&mut c, "gw-a-1");
    assert!(!r.picked(&mut c, "std", 4, Some(1), false));
    // Two slots free, one critical waiting: the standard request may take the second.
    r.set_loads(&mut c, 3, 3);
    assert!(r.picked(&mut c, "std2", 4, Some(1), false));
    // Equal or lower classes waiting do not hold a class back.
    r.unwait(&mut c, "gw-b-1");
    r.set_loads(&mut c, 4, 3);
    r.wait(&mut c, "gw-a-2", 1, NOW + 1000);
    r.wait(&mut c, "gw-a-3", 2, NOW + 1000);
    assert!(r.picked(&mut c, "std3", 4, Some(1), false));
    // Without the check (no queue) nothing changes.
    r.set_loads(&mut c, 4, 3);
    r.wait(&mut c, "gw-a-4", 0, NOW + 1000);
    assert!(r.picked(&mut c, "plain", 4, None, false));
    // A sheddable request is held back by a standard waiter as well.
    r.unwait(&mut c, "gw-a-4");
    r.set_loads(&mut c, 4, 3);
    assert!(!r.picked(&mut c, "shed2", 4, Some(2), false));
}

#[test]
fn expired_waiters_neither_count_nor_stay() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let r = Route::new();
    assert!(r.picked(&mut c, "sync", 4, None, false));
    r.set_loads(&mut c, 4, 3);
    // A crashed gateway's critical waiter, deadline passed; a live standard one.
    r.wait(&mut c, "dead", 0, NOW - 1);
    r.wait(&mut c, "live", 1, NOW + 5000);
    assert!(
        r.picked(&mut c, "std", 4, Some(1), false),
        "an expired waiter holds nothing back"
    );
    assert_eq!(r.waiters(&mut c), 1, "and is dropped");
    // Deadline exactly now: expired.
    r.set_loads(&mut c, 4, 3);
    r.wait(&mut c, "edge", 0, NOW);
    assert!(r.picked(&mut c, "std2", 4, Some(1), false));
    // A waiter of the last possible class rank still orders exactly.
    r.unwait(&mut c, "live");
    r.set_loads(&mut c, 4, 3);
    r.wait(&mut c, "r6", 6, NOW + 1);
    assert!(!r.picked(&mut c, "r7", 4, Some(7), false));
    assert!(r.picked(&mut c, "r6b", 4, Some(6), false));
}

#[test]
fn the_prefix_script_checks_waiters_and_keeps_its_session_key() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let r = Route::new();
    assert!(r.picked(&mut c, "sync", 4, Some(1), true));
    let session = scripts::session_key(&r.keys.namespace, b"s1");
    let bound = c.cmd(&["GET", session.as_str()]);
    assert!(
        bound
            .as_str()
            .is_some_and(|ep| r.eps.iter().any(|e| e == ep)),
        "the session key (before the wait key) is bound: {bound:?}"
    );
    assert_eq!(
        c.cmd(&["EXISTS", r.keys.wait.as_str()]).as_i64(),
        Some(0),
        "a check writes no wait set"
    );
    r.set_loads(&mut c, 4, 3);
    r.wait(&mut c, "gw-a-1", 0, NOW + 1000);
    assert!(!r.picked(&mut c, "std", 4, Some(1), true));
    assert!(r.picked(&mut c, "crit", 4, Some(0), true));
}

#[test]
fn a_full_pool_is_room_the_waiters_hold_too() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let r = Route::new();
    for prefix in [false, true] {
        c.cmd(&["FLUSHALL"]);
        let pool = |c: &mut Conn, rid: &str, rank: usize| {
            r.acquire_pool(c, rid, 0, 7, Some(("0a", 100)), Some(rank), prefix)
        };
        assert!(matches!(
            pool(&mut c, "sync", 1),
            AcquireReply::Picked { .. }
        ));
        // maxPoolRequests 7, no endpoint cap: loads 4 + 2, one slot left in the pool.
        r.set_loads(&mut c, 4, 2);
        r.wait(&mut c, "gw-a-1", 0, NOW + 1000);
        assert_eq!(
            pool(&mut c, "std", 1),
            AcquireReply::Full,
            "prefix {prefix}: one critical waits for the pool's last slot"
        );
        assert!(matches!(
            pool(&mut c, "crit", 0),
            AcquireReply::Picked { .. }
        ));
        assert_eq!(
            pool(&mut c, "crit2", 0),
            AcquireReply::PoolFull,
            "the pool is full for every class"
        );
        // Two slots, one critical waiting: the standard request takes the second.
        r.set_loads(&mut c, 3, 2);
        assert!(matches!(
            pool(&mut c, "std2", 1),
            AcquireReply::Picked { .. }
        ));
        let tenants = c.cmd(&["HGET", r.keys.tenants.as_str(), "0a"]);
        assert_eq!(
            tenants.as_str(),
            Some("3"),
            "prefix {prefix}: the tenant counted beside the wait key"
        );
        if prefix {
            let session = scripts::session_key(&r.keys.namespace, b"s1");
            assert!(c
                .cmd(&["GET", session.as_str()])
                .as_str()
                .is_some_and(|ep| r.eps.iter().any(|e| e == ep)));
        }
    }
}
