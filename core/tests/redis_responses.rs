//! Responses continuations against a real redis-server, through the plugin's own call builders
//! and reply parsers (docs/redis-data-model.md §10 "Responses continuations"): a response's pod
//! recorded (`SET … EX`), and the acquire that reads a response's key in its session slot, on
//! two connections as two gateways.

// Test scaffolding helpers outside #[test] fns fail loudly by design.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ailb_core::config::TokenGate;
use ailb_core::redis::bind::{bind_call, response_key, Bind};
use ailb_core::redis::resp::Value;
use ailb_core::redis::scripts::{
    self, AcquireArgs, AcquireReply, Keys, PrefixArgs, PrefixChain, Scripts, SessionArgs,
    SessionState,
};
use ailb_core::upstream::fingerprint;
use ailb_testkit::{Conn, RedisServer};

const A: &str = "10.0.0.1:80";
const B: &str = "10.0.0.2:80";
const C: &str = "10.0.0.3:80";

struct Bed {
    keys: Keys,
    scripts: Scripts,
    eps: Vec<String>,
    fp: String,
}

impl Bed {
    fn new() -> Bed {
        let eps: Vec<String> = [A, B, C].iter().map(|e| e.to_string()).collect();
        Bed {
            keys: Keys::new("ailb", "route", "outbound|8000||llm.static"),
            scripts: Scripts::new(),
            fp: fingerprint(&eps),
            eps,
        }
    }

    fn key(&self, id: &str) -> String {
        response_key(&self.keys.namespace, id.as_bytes())
    }

    /// An acquire continuing response `previous` (its key in the session slot, as the plugin
    /// sends it), least-request or prefix_cache (`prefix`).
    fn acquire(
        &self,
        c: &mut Conn,
        rid: &str,
        previous: Option<&str>,
        prefix: bool,
    ) -> (String, SessionState) {
        let key = previous.map(|p| self.key(p));
        let chain = PrefixChain {
            keys: vec![format!("{}:px:00", self.keys.namespace)],
            cached_tokens: vec![10],
            prompt_tokens: 20,
            stream: false,
        };
        let prefix = prefix.then(|| PrefixArgs {
            chain: &chain,
            ttl_s: 1800,
            max_imbalance: 8,
            max_imbalance_ratio: 1.5,
            gate: TokenGate::default(),
            latency: None,
        });
        let mut sync = false;
        loop {
            let args = AcquireArgs {
                now_ms: 1_000_000,
                lease_ttl_ms: 600_000,
                request_id: rid,
                cost: 1,
                cap: 0,
                random: 0,
                fingerprint: &self.fp,
                reclaim: 0,
                endpoints: sync.then_some(self.eps.as_slice()),
                session: key.as_deref().map(|key| SessionArgs {
                    key,
                    ttl_s: 300,
                    max_imbalance: 8,
                    max_imbalance_ratio: 1.5,
                }),
                wait_rank: None,
                pool_cap: 0,
                tenant: None,
                trials: 0,
            };
            let q = scripts::pick_call(&self.scripts, false, &self.keys, &args, prefix.as_ref());
            match scripts::parse_acquire(&c.raw_reply(&q)).unwrap() {
                AcquireReply::Sync if !sync => sync = true,
                AcquireReply::Picked {
                    endpoint, session, ..
                } => return (endpoint, session),
                other => panic!("expected a pick, got {other:?}"),
            }
        }
    }

    /// Records response `id` on `ep`, as the plugin does when the answer names itself.
    fn record(&self, c: &mut Conn, id: &str, ep: &str) {
        let bind = Bind {
            key: self.key(id),
            value: ep.to_string(),
            ttl_s: 300,
        };
        assert_eq!(c.cmd_raw(&bind_call(&bind)).as_str(), Some("OK"));
    }

    /// Releases `rid`'s lease on `ep` (`booked`: a prefix_cache route's); whether it was held.
    fn release(&self, c: &mut Conn, rid: &str, ep: &str, booked: bool) -> bool {
        let member = scripts::lease_member(rid, ep, 1, None);
        let q = scripts::release::release_call(
            (&self.scripts, false),
            &self.keys,
            &[member],
            booked,
            (
                scripts::release::Learned::Nothing,
                0,
                &ailb_core::config::Ejection::OFF,
            ),
        );
        scripts::parse_release(&c.raw_reply(&q)).unwrap() != scripts::Released::Nothing
    }

    fn bound(&self, c: &mut Conn, id: &str) -> Option<String> {
        c.cmd(&["GET", self.key(id).as_str()])
            .as_str()
            .map(str::to_string)
    }

    fn ttl(&self, c: &mut Conn, id: &str) -> i64 {
        c.cmd(&["TTL", self.key(id).as_str()]).as_i64().unwrap()
    }

    fn total_load(&self, c: &mut Conn) -> f64 {
        let Value::Array(Some(items)) =
            c.cmd(&["ZRANGE", &self.keys.load, "0", "-1", "WITHSCORES"])
        else {
            panic!()
        };
        items.chunks(2).map(|p| p[1].as_f64().unwrap()).sum()
    }
}

#[test]
fn a_recorded_response_is_continued_on_its_pod_by_the_next_gateway() {
    let redis = RedisServer::start();
    let (mut a, mut b) = (redis.conn(), redis.conn());
    let bed = Bed::new();
    for prefix in [false, true] {
        c_flush(&mut a);
        // Gateway A: a first turn, placed by the policy; its answer is recorded.
        let (pod, state) = bed.acquire(&mut a, "r0", None, prefix);
        assert_eq!(state, SessionState::None);
        bed.record(&mut a, "resp_1", &pod);
        assert!(bed.release(&mut a, "r0", &pod, prefix));
        assert_eq!(bed.bound(&mut a, "resp_1").as_deref(), Some(pod.as_str()));
        let t = bed.ttl(&mut a, "resp_1");
        assert!((1..=300).contains(&t), "TTL {t}");
        // Gateway B: its continuation is kept there, each turn recording the next.
        let mut prev = "resp_1".to_string();
        for turn in 1..=5 {
            let rid = format!("r{turn}");
            let gw = if turn % 2 == 0 { &mut a } else { &mut b };
            let (ep, state) = bed.acquire(gw, &rid, Some(&prev), prefix);
            assert_eq!(
                (ep.as_str(), state),
                (pod.as_str(), SessionState::Kept),
                "turn {turn}"
            );
            let next = format!("resp_{}", turn + 1);
            bed.record(gw, &next, &ep);
            assert!(bed.release(gw, &rid, &ep, prefix));
            prev = next;
        }
        assert_eq!(bed.total_load(&mut a), 0.0, "no count leaked");
    }
}

fn c_flush(c: &mut Conn) {
    c.cmd(&["FLUSHALL"]);
}

#[test]
fn an_unknown_or_expired_response_is_placed_and_bound_where_it_went() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let bed = Bed::new();
    let (ep, state) = bed.acquire(&mut c, "r0", Some("resp_never"), false);
    assert_eq!(state, SessionState::New);
    // Bound there, so a retry of the same request finds that pod.
    assert_eq!(
        bed.bound(&mut c, "resp_never").as_deref(),
        Some(ep.as_str())
    );
    bed.release(&mut c, "r0", &ep, false);
    // A recorded response whose key expired is unknown again.
    bed.record(&mut c, "resp_old", A);
    c.cmd(&["PEXPIRE", bed.key("resp_old").as_str(), "1"]);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let (_, state) = bed.acquire(&mut c, "r1", Some("resp_old"), false);
    assert_eq!(state, SessionState::New);
}

#[test]
fn a_response_pod_over_the_guard_or_gone_is_left() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let bed = Bed::new();
    bed.record(&mut c, "resp_1", B);
    // Other gateways' load on B, over both bounds of the guard.
    c.cmd(&["ZADD", &bed.keys.load, "0", A, "0", C]);
    let (ep, _) = bed.acquire(&mut c, "sync", None, false);
    bed.release(&mut c, "sync", &ep, false);
    c.cmd(&["ZINCRBY", &bed.keys.load, "20", B]);
    let (ep, state) = bed.acquire(&mut c, "r0", Some("resp_1"), false);
    assert_eq!(state, SessionState::Rebound);
    assert_ne!(ep, B);
    assert_eq!(
        bed.bound(&mut c, "resp_1").as_deref(),
        Some(ep.as_str()),
        "moved with it"
    );
    bed.release(&mut c, "r0", &ep, false);
    // A pod that left the healthy set loses its responses too.
    bed.record(&mut c, "resp_2", C);
    c.cmd(&["ZREM", &bed.keys.load, C]);
    let (ep, state) = bed.acquire(&mut c, "r1", Some("resp_2"), false);
    assert_eq!(state, SessionState::Rebound);
    assert_ne!(ep, C);
}

#[test]
fn a_response_is_a_plain_key_with_its_ttl_in_the_routes_hash_tag() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let bed = Bed::new();
    let bind = Bind {
        key: bed.key("resp_3"),
        value: C.into(),
        ttl_s: 42,
    };
    assert_eq!(c.cmd_raw(&bind_call(&bind)).as_str(), Some("OK"));
    assert_eq!(bed.bound(&mut c, "resp_3").as_deref(), Some(C));
    assert!((1..=42).contains(&bed.ttl(&mut c, "resp_3")));
    // Ids of any length or bytes are hashed into the route's hash tag.
    let huge = "r".repeat(100_000);
    assert!(bed
        .key(&huge)
        .starts_with("ailb:{route|outbound|8000||llm.static}:resp:"));
    assert_eq!(bed.key(&huge).len(), bed.key("x").len());
}
