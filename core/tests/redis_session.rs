//! Session stickiness in the acquire scripts against a real redis-server, driven through the
//! plugin's own call builders and reply parser (docs/redis-data-model.md §10).

// Test scaffolding helpers outside #[test] fns fail loudly by design.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ailb_core::config::TokenGate;
use ailb_core::redis::resp::Value;
use ailb_core::redis::scripts::{
    self, session_key, AcquireArgs, AcquireReply, Keys, PrefixArgs, PrefixChain, Scripts,
    SessionArgs, SessionState,
};
use ailb_core::upstream::fingerprint;
use ailb_testkit::{Conn, RedisServer};
use std::collections::HashMap;

struct Bed {
    keys: Keys,
    scripts: Scripts,
    eps: Vec<String>,
    fp: String,
    cap: u64,
}

/// One acquire's reply: the endpoint and the session's state.
type Got = (String, SessionState);

impl Bed {
    fn new(eps: &[&str]) -> Bed {
        let mut eps: Vec<String> = eps.iter().map(|e| e.to_string()).collect();
        eps.sort();
        Bed {
            keys: Keys::new("ailb", "route", "outbound|8000||llm.static"),
            scripts: Scripts::new(),
            fp: fingerprint(&eps),
            eps,
            cap: 0,
        }
    }

    /// Replaces the healthy set (a pod died or came back); the next acquire syncs it.
    fn set_members(&mut self, eps: &[&str]) {
        let mut eps: Vec<String> = eps.iter().map(|e| e.to_string()).collect();
        eps.sort();
        self.fp = fingerprint(&eps);
        self.eps = eps;
    }

    fn raw(
        &self,
        c: &mut Conn,
        rid: &str,
        session: Option<&str>,
        chain: Option<&[String]>,
        sync: bool,
    ) -> AcquireReply {
        let key = session.map(|s| session_key(&self.keys.namespace, s.as_bytes()));
        let args = AcquireArgs {
            now_ms: 1_000_000,
            lease_ttl_ms: 600_000,
            request_id: rid,
            cost: 1,
            cap: self.cap,
            random: 0,
            fingerprint: &self.fp,
            reclaim: 0,
            endpoints: sync.then_some(self.eps.as_slice()),
            session: key.as_deref().map(|key| SessionArgs {
                key,
                ttl_s: 120,
                max_imbalance: 8,
                max_imbalance_ratio: 1.5,
            }),
            wait_rank: None,
            pool_cap: 0,
            tenant: None,
            trials: 0,
        };
        let chain = chain.map(|keys| PrefixChain {
            keys: keys.to_vec(),
            ..PrefixChain::default()
        });
        let prefix = chain.as_ref().map(|chain| PrefixArgs {
            chain,
            ttl_s: 1800,
            max_imbalance: 8,
            max_imbalance_ratio: 1.5,
            gate: TokenGate::default(),
            latency: None,
        });
        let q = scripts::pick_call(&self.scripts, false, &self.keys, &args, prefix.as_ref());
        scripts::parse_acquire(&c.raw_reply(&q)).unwrap()
    }

    /// An acquire that must pick; resyncs first when Redis asks for the set.
    fn acquire(&self, c: &mut Conn, rid: &str, session: Option<&str>) -> Got {
        self.acquire_chain(c, rid, session, None)
    }

    fn acquire_chain(
        &self,
        c: &mut Conn,
        rid: &str,
        session: Option<&str>,
        chain: Option<&[String]>,
    ) -> Got {
        let mut r = self.raw(c, rid, session, chain, false);
        if r == AcquireReply::Sync {
            r = self.raw(c, rid, session, chain, true);
        }
        match r {
            AcquireReply::Picked {
                endpoint, session, ..
            } => (endpoint, session),
            other => panic!("expected a pick, got {other:?}"),
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
        assert!(scripts::parse_release(&c.raw_reply(&q)).unwrap() != scripts::Released::Nothing);
    }

    fn bound(&self, c: &mut Conn, session: &str) -> Option<String> {
        let key = session_key(&self.keys.namespace, session.as_bytes());
        c.cmd(&["GET", key.as_str()]).as_str().map(str::to_string)
    }

    fn ttl(&self, c: &mut Conn, session: &str) -> i64 {
        let key = session_key(&self.keys.namespace, session.as_bytes());
        c.cmd(&["TTL", key.as_str()]).as_i64().unwrap()
    }

    /// Other gateways' load on `ep`.
    fn add_load(&self, c: &mut Conn, ep: &str, n: u64) {
        c.cmd(&["ZINCRBY", &self.keys.load, &n.to_string(), ep]);
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
}

const A: &str = "10.0.0.1:80";
const B: &str = "10.0.0.2:80";
const C: &str = "10.0.0.3:80";

#[test]
fn a_session_is_bound_then_kept_within_the_guard_and_counts_nothing_extra() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let bed = Bed::new(&[A, B, C]);
    let (first, state) = bed.acquire(&mut c, "r0", Some("conv"));
    assert_eq!(state, SessionState::New);
    assert_eq!(bed.bound(&mut c, "conv").as_deref(), Some(first.as_str()));
    let t = bed.ttl(&mut c, "conv");
    assert!((1..=120).contains(&t), "TTL {t}");
    // Ten more turns, each held while the next comes (the pod gets busier than the rest, but
    // never by more than the guard): all on the first pod.
    let mut held = vec![("r0".to_string(), first.clone())];
    for i in 1..=8 {
        let rid = format!("r{i}");
        let (ep, state) = bed.acquire(&mut c, &rid, Some("conv"));
        assert_eq!(
            (ep.as_str(), state),
            (first.as_str(), SessionState::Kept),
            "turn {i}"
        );
        held.push((rid, ep));
    }
    // Without a session the least-loaded pod is still taken.
    let (other, state) = bed.acquire(&mut c, "x", None);
    assert_ne!(other, first);
    assert_eq!(state, SessionState::None);
    held.push(("x".into(), other));
    for (rid, ep) in &held {
        bed.release(&mut c, rid, ep);
    }
    assert!(
        bed.loads(&mut c).values().all(|&l| l == 0.0),
        "no count leaked"
    );
    // The binding outlives the requests (until its TTL), and each use refreshed it.
    assert_eq!(bed.bound(&mut c, "conv").as_deref(), Some(first.as_str()));
}

/// A kept session's TTL (120 s here) is refreshed once a tenth of it has passed (less than 108 s
/// left), not on every turn: a refresh is a write, two reads are cheaper (pick.lua
/// `session_get`, docs/redis-data-model.md §10).
#[test]
fn a_kept_session_has_its_ttl_refreshed_once_a_tenth_of_it_has_passed() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let bed = Bed::new(&[A, B]);
    let (first, _) = bed.acquire(&mut c, "r0", Some("conv"));
    let key = session_key(&bed.keys.namespace, b"conv");
    for (left, refreshed) in [(5, true), (107, true), (109, false), (115, false)] {
        c.cmd(&["EXPIRE", key.as_str(), &left.to_string()]);
        let (ep, state) = bed.acquire(&mut c, "r1", Some("conv"));
        assert_eq!((ep.as_str(), state), (first.as_str(), SessionState::Kept));
        bed.release(&mut c, "r1", &ep);
        let t = bed.ttl(&mut c, "conv");
        if refreshed {
            assert!((115..=120).contains(&t), "{left} s left: TTL {t} refreshed");
        } else {
            assert!(
                (left - 5..=left).contains(&t),
                "{left} s left: TTL {t} kept"
            );
        }
    }
}

#[test]
fn a_session_over_the_imbalance_guard_or_the_cap_is_rebound() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let mut bed = Bed::new(&[A, B]);
    let (first, _) = bed.acquire(&mut c, "r0", Some("s"));
    bed.release(&mut c, "r0", &first);
    // Busier than the other by 9 (> 8) and more than 1.5 times: the session moves.
    bed.add_load(&mut c, &first, 9);
    let (moved, state) = bed.acquire(&mut c, "r1", Some("s"));
    assert_ne!(moved, first);
    assert_eq!(state, SessionState::Rebound);
    assert_eq!(bed.bound(&mut c, "s").as_deref(), Some(moved.as_str()));
    bed.release(&mut c, "r1", &moved);
    // At the cap: the session pod is full, the other is not: rebound back.
    bed.cap = 3;
    c.cmd(&["ZADD", &bed.keys.load, "3", &moved]);
    c.cmd(&["ZADD", &bed.keys.load, "0", &first]);
    let (back, state) = bed.acquire(&mut c, "r2", Some("s"));
    assert_eq!(
        (back.as_str(), state),
        (first.as_str(), SessionState::Rebound)
    );
    bed.release(&mut c, "r2", &back);
    // Every pod at the cap: FULL, nothing counted, the binding untouched.
    c.cmd(&["ZADD", &bed.keys.load, "3", &first]);
    assert_eq!(
        bed.raw(&mut c, "r3", Some("s"), None, false),
        AcquireReply::Full
    );
    assert_eq!(bed.bound(&mut c, "s").as_deref(), Some(first.as_str()));
    assert_eq!(c.cmd(&["ZCARD", &bed.keys.leases]).as_i64(), Some(0));
    // Within the guard (busier by 1 only) the session stays even though another is freer.
    bed.cap = 0;
    c.cmd(&["ZADD", &bed.keys.load, "1", &first]);
    c.cmd(&["ZADD", &bed.keys.load, "0", &moved]);
    let (kept, state) = bed.acquire(&mut c, "r4", Some("s"));
    assert_eq!((kept.as_str(), state), (first.as_str(), SessionState::Kept));
}

#[test]
fn a_session_whose_pod_left_the_healthy_set_is_rebound_to_a_member() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let mut bed = Bed::new(&[A, B, C]);
    let (first, _) = bed.acquire(&mut c, "r0", Some("s"));
    bed.release(&mut c, "r0", &first);
    let rest: Vec<&str> = [A, B, C].into_iter().filter(|e| *e != first).collect();
    bed.set_members(&rest);
    let (moved, state) = bed.acquire(&mut c, "r1", Some("s"));
    assert_eq!(state, SessionState::Rebound);
    assert!(rest.contains(&moved.as_str()), "{moved}");
    // Then it stays on its new pod, even once the old one is back.
    bed.release(&mut c, "r1", &moved);
    bed.set_members(&[A, B, C]);
    let (again, state) = bed.acquire(&mut c, "r2", Some("s"));
    assert_eq!(
        (again.as_str(), state),
        (moved.as_str(), SessionState::Kept)
    );
}

#[test]
fn a_sticky_session_wins_over_a_prefix_match_unless_over_the_guard() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let bed = Bed::new(&[A, B]);
    let ns = bed.keys.namespace.clone();
    let chain = vec![format!("{ns}:px:1"), format!("{ns}:px:2")];
    // The session lives on one pod; the prompt's prefix is known on the other.
    let (home, state) = bed.acquire(&mut c, "r0", Some("s"));
    assert_eq!(state, SessionState::New);
    bed.release(&mut c, "r0", &home);
    let elsewhere = if home == A { B } else { A };
    c.cmd(&["SET", chain[0].as_str(), elsewhere]);
    let (ep, state) = bed.acquire_chain(&mut c, "r1", Some("s"), Some(&chain));
    assert_eq!((ep.as_str(), state), (home.as_str(), SessionState::Kept));
    bed.release(&mut c, "r1", &ep);
    // The prompt's deeper keys now point at the session's pod (it holds the whole prompt).
    assert_eq!(
        c.cmd(&["GET", chain[1].as_str()]).as_str(),
        Some(home.as_str())
    );
    // Session pod over the guard: the prefix match decides (its own pod is not over it).
    bed.add_load(&mut c, &home, 20);
    c.cmd(&["DEL", chain[1].as_str()]);
    let (ep, state) = bed.acquire_chain(&mut c, "r2", Some("s"), Some(&chain));
    assert_eq!((ep.as_str(), state), (elsewhere, SessionState::Rebound));
    assert_eq!(bed.bound(&mut c, "s").as_deref(), Some(elsewhere));
}

#[test]
fn odd_ids_are_fixed_size_keys_and_the_call_stays_in_one_cluster_slot() {
    // A one-node cluster refuses a script call whose keys span slots (CROSSSLOT).
    let redis = RedisServer::start_cluster();
    let mut c = redis.conn();
    let bed = Bed::new(&[A, B]);
    let huge = "\u{4f1a}".repeat(4 * 1024); // 12 KB of unicode
    for id in ["plain", huge.as_str(), "\u{1F600} \0 ;=\r\n"] {
        let (ep, state) = bed.acquire(&mut c, id, Some(id));
        assert_eq!(state, SessionState::New);
        let (again, state) = bed.acquire(&mut c, &format!("{id}2"), Some(id));
        assert_eq!((again.as_str(), state), (ep.as_str(), SessionState::Kept));
    }
    let ns = bed.keys.namespace.clone();
    let chain = vec![format!("{ns}:px:9")];
    let (_, state) = bed.acquire_chain(&mut c, "p", Some("plain"), Some(&chain));
    assert_eq!(state, SessionState::Kept);
}

/// endpoint_metrics' binding call: (endpoint, state) for a session whose scheduler pick is
/// `choice` and which may stay on `keep`.
fn bind(c: &mut Conn, key: &str, choice: &str, keep: &[&str]) -> Got {
    let keep: Vec<String> = keep.iter().map(|k| k.to_string()).collect();
    let q = scripts::session_bind_call(&Scripts::new(), false, key, 120, choice, &keep);
    match scripts::parse_acquire(&c.raw_reply(&q)).unwrap() {
        AcquireReply::Picked {
            endpoint, session, ..
        } => (endpoint, session),
        other => panic!("expected a pick, got {other:?}"),
    }
}

#[test]
fn endpoint_metrics_sessions_are_kept_while_their_pod_may_keep_them_else_rebound() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let bed = Bed::new(&[A, B, C]);
    let key = session_key(&bed.keys.namespace, "chat".as_bytes());
    // New: bound to the scheduler's pick, with the TTL.
    assert_eq!(
        bind(&mut c, &key, A, &[A, B, C]),
        (A.into(), SessionState::New)
    );
    assert_eq!(bed.bound(&mut c, "chat").as_deref(), Some(A));
    // Kept while its pod may keep it, whatever the scheduler prefers; the TTL is refreshed
    // once a tenth of it (120 s) has passed, as for the acquire scripts.
    c.cmd(&["EXPIRE", key.as_str(), "5"]);
    assert_eq!(
        bind(&mut c, &key, B, &[A, B]),
        (A.into(), SessionState::Kept)
    );
    assert!(bed.ttl(&mut c, "chat") > 100);
    c.cmd(&["EXPIRE", key.as_str(), "112"]);
    assert_eq!(
        bind(&mut c, &key, B, &[A, B]),
        (A.into(), SessionState::Kept)
    );
    assert!(bed.ttl(&mut c, "chat") <= 112);
    // Its pod saturated, gone or unknown (not offered): rebound to the scheduler's pick.
    assert_eq!(
        bind(&mut c, &key, C, &[B, C]),
        (C.into(), SessionState::Rebound)
    );
    assert_eq!(bed.bound(&mut c, "chat").as_deref(), Some(C));
    // The scheduler picks the bound pod itself (every pod as saturated): kept.
    assert_eq!(bind(&mut c, &key, C, &[]), (C.into(), SessionState::Kept));
    // Expired: new again.
    c.cmd(&["DEL", key.as_str()]);
    assert_eq!(bind(&mut c, &key, B, &[A]), (B.into(), SessionState::New));
    // The binding is the only key written.
    let Value::Array(Some(keys)) = c.cmd(&["KEYS", "*"]) else {
        panic!()
    };
    assert_eq!(keys.len(), 1, "{keys:?}");
}
