//! cluster_metrics' global in-flight scripts against a real redis-server, through the call
//! builders and reply parser the plugin uses (docs/redis-data-model.md §8): Higress's choice
//! rule and hash, plus the leases that heal a crashed gateway's counts.

// Test scaffolding helpers outside #[test] fns fail loudly by design.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ailb_core::redis::inflight::{self, InflightKeys, ServiceAcquireArgs};
use ailb_core::redis::resp::Value;
use ailb_core::redis::scripts::Scripts;
use ailb_testkit::{Conn, RedisServer};
use std::collections::HashSet;

const PREFIX: &str = "higress:adaptive_score_inflight";

struct Bed {
    keys: InflightKeys,
    scripts: Scripts,
}

impl Bed {
    fn new() -> Bed {
        Bed {
            keys: InflightKeys::new(PREFIX, "default/chat"),
            scripts: Scripts::new(),
        }
    }

    fn acquire(
        &self,
        c: &mut Conn,
        rid: &str,
        now: u64,
        random: u32,
        cands: &[(&str, f64)],
    ) -> String {
        let candidates: Vec<(String, f64)> =
            cands.iter().map(|(s, v)| (s.to_string(), *v)).collect();
        let args = ServiceAcquireArgs {
            now_ms: now,
            lease_ttl_ms: 1_000,
            key_ttl_s: 1800,
            request_id: rid,
            random,
            reclaim: 8,
            candidates: &candidates,
        };
        let q = inflight::acquire_call(&self.scripts, false, &self.keys, &args);
        inflight::parse_acquire(&c.raw_reply(&q))
            .unwrap()
            .expect("a service")
    }

    fn release(&self, c: &mut Conn, members: &[String]) -> i64 {
        let q = inflight::release_call(&self.scripts, false, &self.keys, members);
        c.cmd_raw(&q).as_i64().unwrap()
    }

    fn count(&self, c: &mut Conn, svc: &str) -> Option<i64> {
        match c.cmd(&["HGET", &self.keys.counts, svc]) {
            Value::Bulk(None) => None,
            v => Some(v.as_str().unwrap().parse().unwrap()),
        }
    }
}

#[test]
fn lowest_local_score_times_global_count_wins_and_is_counted() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let bed = Bed::new();
    // A Go gateway already has 3 requests on llm-a: HINCRBY as Higress does.
    c.cmd(&["HINCRBY", &bed.keys.counts, "llm-a", "3"]);
    // llm-a: 1.0 × 4 = 4; llm-b: 2.5 × 1 = 2.5.
    let got = bed.acquire(&mut c, "r1", 100, 7, &[("llm-a", 1.0), ("llm-b", 2.5)]);
    assert_eq!(got, "llm-b");
    assert_eq!(bed.count(&mut c, "llm-b"), Some(1));
    // llm-a 4, llm-b 2.5 × 2 = 5: now llm-a.
    let got = bed.acquire(&mut c, "r2", 100, 7, &[("llm-a", 1.0), ("llm-b", 2.5)]);
    assert_eq!(got, "llm-a");
    assert_eq!(bed.count(&mut c, "llm-a"), Some(4));
    assert!(c.cmd(&["TTL", &bed.keys.counts]).as_i64().unwrap() > 1700);
    assert!(c.cmd(&["PTTL", &bed.keys.leases]).as_i64().unwrap() > 1_700_000);
    assert_eq!(c.cmd(&["ZCARD", &bed.keys.leases]).as_i64(), Some(2));
}

#[test]
fn ties_are_broken_by_the_callers_random_number() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let bed = Bed::new();
    let mut seen = HashSet::new();
    for r in 0..64u32 {
        let rid = format!("r{r}");
        let got = bed.acquire(
            &mut c,
            &rid,
            1,
            r.wrapping_mul(2_654_435_761),
            &[("x", 1.0), ("y", 1.0), ("z", 1.0)],
        );
        bed.release(&mut c, &[inflight::member(&rid, &got)]);
        seen.insert(got);
    }
    assert_eq!(
        seen.len(),
        3,
        "every tied service is chosen sometimes: {seen:?}"
    );
}

#[test]
fn release_gives_back_once_and_never_below_zero() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let bed = Bed::new();
    let got = bed.acquire(&mut c, "r1", 1, 0, &[("llm-a", 1.0)]);
    let member = inflight::member("r1", &got);
    assert_eq!(bed.release(&mut c, std::slice::from_ref(&member)), 1);
    assert_eq!(
        bed.count(&mut c, "llm-a"),
        None,
        "a zero count is deleted, as Go reads absent"
    );
    assert_eq!(bed.release(&mut c, &[member]), 0, "idempotent");
    assert_eq!(bed.count(&mut c, "llm-a"), None);
    // A lost reply releases every candidate's member: only the one written counts.
    bed.acquire(&mut c, "r2", 1, 0, &[("llm-a", 1.0), ("llm-b", 5.0)]);
    let all = vec![
        inflight::member("r2", "llm-b"),
        inflight::member("r2", "llm-a"),
    ];
    assert_eq!(bed.release(&mut c, &all), 1);
    assert_eq!(bed.count(&mut c, "llm-a"), None);
    assert_eq!(bed.count(&mut c, "llm-b"), None);
}

#[test]
fn a_crashed_gateways_counts_heal_when_its_leases_expire() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let bed = Bed::new();
    for r in 0..3 {
        bed.acquire(&mut c, &format!("dead{r}"), 1_000, 0, &[("llm-a", 1.0)]);
    }
    assert_eq!(bed.count(&mut c, "llm-a"), Some(3));
    // The gateway died: nobody releases. Past the lease TTL (1 s) the next acquire reclaims.
    let got = bed.acquire(&mut c, "live", 2_500, 0, &[("llm-a", 1.0)]);
    assert_eq!(got, "llm-a");
    assert_eq!(
        bed.count(&mut c, "llm-a"),
        Some(1),
        "only the live request remains"
    );
    assert_eq!(c.cmd(&["ZCARD", &bed.keys.leases]).as_i64(), Some(1));
}

#[test]
fn both_keys_share_a_slot_on_a_cluster_node() {
    let redis = RedisServer::start_cluster();
    let mut c = redis.conn();
    let bed = Bed::new();
    // A cross-slot script call is refused by a cluster node (CROSSSLOT); this one is served.
    let got = bed.acquire(&mut c, "r1", 1, 0, &[("llm-a", 1.0), ("llm-b", 1.0)]);
    assert!(got == "llm-a" || got == "llm-b");
    assert_eq!(bed.release(&mut c, &[inflight::member("r1", &got)]), 1);
}

#[test]
fn evalsha_answers_noscript_until_loaded() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let bed = Bed::new();
    let cands = vec![("llm-a".to_string(), 1.0)];
    let args = ServiceAcquireArgs {
        now_ms: 1,
        lease_ttl_ms: 1_000,
        key_ttl_s: 0,
        request_id: "r",
        random: 0,
        reclaim: 0,
        candidates: &cands,
    };
    let q = inflight::acquire_call(&bed.scripts, true, &bed.keys, &args);
    assert_eq!(
        inflight::parse_acquire(&c.raw_reply(&q)),
        Err(ailb_core::redis::scripts::ReplyError::NoScript)
    );
    c.cmd_raw(&ailb_core::redis::scripts::load(
        &bed.scripts.service_acquire,
    ));
    assert_eq!(
        inflight::parse_acquire(&c.raw_reply(&q)),
        Ok(Some("llm-a".into()))
    );
    assert_eq!(
        c.cmd(&["TTL", &bed.keys.counts]).as_i64(),
        Some(-1),
        "key_ttl 0: no expiry, as Go"
    );
}
