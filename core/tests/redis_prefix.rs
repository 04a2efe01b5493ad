//! The prefix_cache script against a real redis-server, with keys from the real canonicaliser
//! and chain, through the plugin's own call builder and reply parser.

// Test scaffolding helpers outside #[test] fns fail loudly by design.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ailb_core::config::TokenGate;
use ailb_core::prefix::{canonicalize, prefix_key, CanonConfig};
use ailb_core::redis::resp::Value;
use ailb_core::redis::scripts::{
    self, AcquireArgs, AcquireReply, Keys, PrefixArgs, PrefixChain, Scripts,
};
use ailb_core::upstream::fingerprint;
use ailb_testkit::{Conn, RedisServer};
use serde_json::json;

struct Px {
    keys: Keys,
    scripts: Scripts,
    eps: Vec<String>,
    fp: String,
}

#[derive(Debug, PartialEq)]
struct Pick {
    endpoint: String,
    depth: u32,
    spilled: bool,
}

impl Px {
    fn new(eps: &[&str]) -> Px {
        let mut eps: Vec<String> = eps.iter().map(|e| e.to_string()).collect();
        eps.sort();
        Px {
            keys: Keys::new("ailb", "chat", "outbound|8000||llm.static"),
            scripts: Scripts::new(),
            fp: fingerprint(&eps),
            eps,
        }
    }

    /// The Redis keys of a chat's prefix chain.
    fn chain(&self, messages: serde_json::Value) -> Vec<String> {
        let body = json!({"model": "m", "messages": messages}).to_string();
        let canon = canonicalize(body.as_bytes(), &CanonConfig::default()).unwrap();
        canon
            .chain_keys()
            .iter()
            .map(|k| prefix_key(&self.keys.namespace, k))
            .collect()
    }

    fn acquire(&self, c: &mut Conn, rid: &str, chain: &[String], sync: bool) -> AcquireReply {
        let args = AcquireArgs {
            now_ms: 1_000,
            lease_ttl_ms: 600_000,
            request_id: rid,
            cost: 1,
            cap: 0,
            random: 7,
            fingerprint: &self.fp,
            reclaim: 0,
            endpoints: sync.then_some(self.eps.as_slice()),
            session: None,
            wait_rank: None,
            pool_cap: 0,
            tenant: None,
            trials: 0,
        };
        let chain = PrefixChain {
            keys: chain.to_vec(),
            ..PrefixChain::default()
        };
        let prefix = PrefixArgs {
            chain: &chain,
            ttl_s: 1800,
            max_imbalance: 4,
            max_imbalance_ratio: 1.5,
            gate: TokenGate::default(),
            latency: None,
        };
        let q = scripts::pick_call(&self.scripts, false, &self.keys, &args, Some(&prefix));
        scripts::parse_acquire(&c.raw_reply(&q)).unwrap()
    }

    fn pick(&self, c: &mut Conn, rid: &str, chain: &[String]) -> Pick {
        match self.acquire(c, rid, chain, false) {
            AcquireReply::Picked {
                endpoint,
                depth,
                spilled,
                ..
            } => Pick {
                endpoint,
                depth,
                spilled,
            },
            other => panic!("{other:?}"),
        }
    }

    fn sync(&self, c: &mut Conn) {
        match self.acquire(c, "sync", &[], true) {
            AcquireReply::Picked { endpoint, .. } => self.release(c, "sync", &endpoint),
            other => panic!("{other:?}"),
        }
    }

    fn release(&self, c: &mut Conn, rid: &str, ep: &str) {
        let q = scripts::release::release_call(
            (&self.scripts, false),
            &self.keys,
            &[scripts::lease_member(rid, ep, 1, None)],
            true,
            (
                scripts::release::Learned::Nothing,
                0,
                &ailb_core::config::Ejection::OFF,
            ),
        );
        assert!(
            (scripts::parse_release(&c.raw_reply(&q)).unwrap() != scripts::Released::Nothing),
            "release {rid} on {ep}"
        );
    }

    fn set_load(&self, c: &mut Conn, ep: &str, load: u32) {
        c.cmd(&["ZADD", &self.keys.load, "XX", &load.to_string(), ep]);
    }
}

fn turn(system: &str, user_turns: &[&str]) -> serde_json::Value {
    let mut m = vec![json!({"role": "system", "content": system})];
    for (i, u) in user_turns.iter().enumerate() {
        if i > 0 {
            m.push(
                json!({"role": "assistant", "content": format!("answer to {}", user_turns[i - 1])}),
            );
        }
        m.push(json!({"role": "user", "content": u}));
    }
    serde_json::Value::Array(m)
}

#[test]
fn it_keeps_a_conversation_on_one_endpoint() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let px = Px::new(&["a:1", "b:1", "c:1"]);
    px.sync(&mut c);
    let t1 = px.chain(turn("sys", &["hello"]));
    let first = px.pick(&mut c, "r1", &t1);
    assert_eq!(first.depth, 0, "nothing known yet");
    px.release(&mut c, "r1", &first.endpoint);
    // Turn 2 extends turn 1's chain: the whole of turn 1 matches.
    let t2 = px.chain(turn("sys", &["hello", "and then?"]));
    assert_eq!(t2[..t1.len()], t1[..]);
    let second = px.pick(&mut c, "r2", &t2);
    assert_eq!(
        second,
        Pick {
            endpoint: first.endpoint.clone(),
            depth: t1.len() as u32,
            spilled: false
        }
    );
    px.release(&mut c, "r2", &second.endpoint);
    // Another question under the same system prompt shares the first block.
    let other = px.chain(turn("sys", &["something else"]));
    assert_eq!(other[0], t1[0]);
    let third = px.pick(&mut c, "r3", &other);
    assert_eq!(
        (third.endpoint.as_str(), third.depth),
        (first.endpoint.as_str(), 1)
    );
}

#[test]
fn it_skips_a_stale_endpoint_without_corrupting_the_chain() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let px = Px::new(&["a:1", "b:1"]);
    px.sync(&mut c);
    let t1 = px.chain(turn("sys", &["q"]));
    // The first prefix key points at an endpoint that is gone (Higress then wrote wrong keys).
    c.cmd(&["SET", &t1[0], "10.9.9.9:80"]);
    let p = px.pick(&mut c, "r1", &t1);
    assert_eq!(p.depth, 0);
    assert_ne!(p.endpoint, "10.9.9.9:80");
    for key in &t1 {
        assert_eq!(
            c.cmd(&["GET", key]).as_str(),
            Some(p.endpoint.as_str()),
            "every key of the chain now points to the pick"
        );
    }
    px.release(&mut c, "r1", &p.endpoint);
    let t2 = px.chain(turn("sys", &["q", "more"]));
    assert_eq!(
        px.pick(&mut c, "r2", &t2).depth,
        t1.len() as u32,
        "the next turn still matches"
    );
    // Only healthy (member) endpoints match: a deeper key to a departed endpoint is skipped.
    let t3 = px.chain(turn("sys", &["q", "more", "again"]));
    c.cmd(&["SET", t3.last().unwrap(), "10.9.9.9:80"]);
    assert_eq!(px.pick(&mut c, "r3", &t3).depth, t2.len() as u32);
}

#[test]
fn it_can_choose_endpoints_absent_from_the_counters() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let px = Px::new(&["a:1"]);
    px.sync(&mut c);
    px.set_load(&mut c, "a:1", 5);
    // b joins: the sync adds it at 0 and the least-loaded choice takes it.
    let px2 = Px::new(&["a:1", "b:1"]);
    match px2.acquire(&mut c, "n", &px2.chain(turn("s", &["x"])), true) {
        AcquireReply::Picked { endpoint, .. } => assert_eq!(endpoint, "b:1"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn it_spills_a_hot_prefix_and_comes_back_when_load_evens_out() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let px = Px::new(&["a:1", "b:1", "c:1"]);
    px.sync(&mut c);
    let warm = px.chain(turn("shared system prompt", &["first"]));
    let home = px.pick(&mut c, "w", &warm).endpoint;
    px.release(&mut c, "w", &home);
    // The home endpoint gets busy: 10 in flight vs 0 elsewhere (> 4 more and > 1.5x).
    px.set_load(&mut c, &home, 10);
    let s1 = px.chain(turn("shared system prompt", &["question one"]));
    let spill = px.pick(&mut c, "s1", &s1);
    assert!(spill.spilled, "{spill:?}");
    assert_ne!(spill.endpoint, home);
    assert_eq!(spill.depth, 1, "it did match the shared prefix");
    assert_eq!(
        c.cmd(&["GET", &s1[0]]).as_str(),
        Some(home.as_str()),
        "the shared key stays home"
    );
    assert_eq!(
        c.cmd(&["GET", s1.last().unwrap()]).as_str(),
        Some(spill.endpoint.as_str()),
        "the conversation follows the spill"
    );
    px.release(&mut c, "s1", &spill.endpoint);
    // Within the thresholds the prefix wins over a small imbalance...
    px.set_load(&mut c, &home, 3);
    let s2 = px.chain(turn("shared system prompt", &["question two"]));
    let back = px.pick(&mut c, "s2", &s2);
    assert_eq!(
        (back.endpoint.as_str(), back.spilled),
        (home.as_str(), false)
    );
}

#[test]
fn it_refreshes_the_ttl_of_the_deepest_match() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let px = Px::new(&["a:1", "b:1"]);
    px.sync(&mut c);
    let t = px.chain(turn("s", &["q"]));
    let p = px.pick(&mut c, "r", &t);
    px.release(&mut c, "r", &p.endpoint);
    for k in &t {
        c.cmd(&["EXPIRE", k, "5"]);
    }
    px.pick(&mut c, "r2", &t);
    let ttl = |c: &mut Conn, k: &str| c.cmd(&["TTL", k]).as_i64().unwrap();
    assert!(
        ttl(&mut c, t.last().unwrap()) > 1000,
        "deepest match refreshed to redisKeyTTL"
    );
    assert!(
        ttl(&mut c, &t[0]) <= 5,
        "shallower keys are left alone (one EXPIRE per pick)"
    );
}

#[test]
fn it_handles_thousands_of_blocks_in_one_call() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let px = Px::new(&["a:1", "b:1"]);
    px.sync(&mut c);
    let long: Vec<String> = (0..256)
        .map(|i| format!("{}:px:{i:016x}", px.keys.namespace))
        .collect();
    let p = px.pick(&mut c, "r", &long);
    assert_eq!(p.depth, 0);
    assert_eq!(px.pick(&mut c, "r2", &long).depth, 256);
}

#[test]
fn it_runs_on_a_redis_cluster_node() {
    let redis = RedisServer::start_cluster();
    let mut c = redis.conn();
    let px = Px::new(&["a:1", "b:1"]);
    px.sync(&mut c);
    let t = px.chain(turn("s", &["q", "r"]));
    let p = px.pick(&mut c, "r", &t);
    assert!(matches!(c.cmd(&["GET", &t[0]]), Value::Bulk(Some(_))));
    px.release(&mut c, "r", &p.endpoint);
}

/// Engine-verified keys (docs/redis-data-model.md §5): after a pod's generation bump its older
/// keys are unknown, the bumping request's chain matches again at the new generation, and
/// the pick writes new keys at the pod's current generation.
#[test]
fn it_ignores_keys_of_an_older_generation_and_rewrites_the_bumping_chain() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let px = Px::new(&["a:1"]);
    px.sync(&mut c);
    let forget = |c: &mut Conn, chain: &[String], now: u64| -> Vec<i64> {
        let q = scripts::release::forget_call(&px.keys, chain, "a:1", 1800, now);
        match c.cmd_raw(&q) {
            Value::Array(Some(v)) => v.iter().map(|x| x.as_i64().unwrap()).collect(),
            other => panic!("{other:?}"),
        }
    };
    let old = px.chain(turn("other sys", &["an old conversation"]));
    let p = px.pick(&mut c, "r1", &old);
    px.release(&mut c, "r1", &p.endpoint);
    assert_eq!(
        c.cmd(&["GET", &old[1]]).as_str(),
        Some("a:1"),
        "generation 0: the pod alone"
    );
    let t1 = px.chain(turn("sys", &["verified"]));
    let p = px.pick(&mut c, "r2", &t1);
    px.release(&mut c, "r2", &p.endpoint);
    // The engine answered r2 with a severe shortfall: the pod restarted.
    assert_eq!(forget(&mut c, &t1, 10_000), vec![1, 1]);
    for key in &t1 {
        assert_eq!(c.cmd(&["GET", key]).as_str(), Some("a:1#1"));
    }
    let next = px.chain(turn("other sys", &["an old conversation", "more"]));
    assert_eq!(
        px.pick(&mut c, "r3", &next).depth,
        0,
        "the old generation's keys are unknown"
    );
    px.release(&mut c, "r3", "a:1");
    assert_eq!(
        c.cmd(&["GET", next.last().unwrap()]).as_str(),
        Some("a:1#1"),
        "written at the current generation"
    );
    let t2 = px.chain(turn("sys", &["verified", "next turn"]));
    assert_eq!(
        px.pick(&mut c, "r4", &t2).depth,
        t1.len() as u32,
        "the re-written chain matches"
    );
    px.release(&mut c, "r4", "a:1");
    // The other requests in flight on the restarted pod come back short too: within the
    // interval they re-write their chains without a second bump.
    let t3 = px.chain(turn("sys", &["in flight"]));
    assert_eq!(forget(&mut c, &t3, 10_000 + 100), vec![0, 1]);
    assert_eq!(c.cmd(&["GET", &t3[0]]).as_str(), Some("a:1#1"));
    assert_eq!(px.pick(&mut c, "r5", &t2).depth, t2.len() as u32);
    px.release(&mut c, "r5", "a:1");
    assert_eq!(
        forget(&mut c, &t3, 10_000 + scripts::release::FORGET_INTERVAL_MS)[0],
        1,
        "a later shortfall bumps again"
    );
    assert_eq!(
        px.pick(&mut c, "r6", &t2).depth,
        1,
        "only the system prompt the bumping chain shares is known now"
    );
}
