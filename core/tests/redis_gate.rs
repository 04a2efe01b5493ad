//! prefix_cache's prefill bookings and token gate against a real redis-server
//! (docs/redis-data-model.md §13), through the plugin's own call builders and reply parser:
//! a pick books its uncached tokens, which go back exactly once (first bytes, release or
//! reclaim); a warm endpoint is kept until its estimated TTFT exceeds the best cold one's by
//! the penalty; a match under the affinity threshold is not sticky; rates are learned.

// Test scaffolding helpers outside #[test] fns fail loudly by design.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ailb_core::config::{PrefillRate, TokenGate};
use ailb_core::redis::resp::Value;
use ailb_core::redis::scripts::{
    self, AcquireArgs, AcquireReply, Booked, Keys, PrefixArgs, PrefixChain, Scripts,
};
use ailb_core::upstream::fingerprint;
use ailb_testkit::{Conn, RedisServer};

const A: &str = "10.0.0.1:8000";
const B: &str = "10.0.0.2:8000";
const C: &str = "10.0.0.3:8000";

struct Gate {
    keys: Keys,
    scripts: Scripts,
    eps: Vec<String>,
    fp: String,
    gate: TokenGate,
}

/// `chain` with its last key made this request's own: the same known prefix, a new turn.
fn new_turn(mut chain: PrefixChain, turn: &str) -> PrefixChain {
    if let Some(last) = chain.keys.last_mut() {
        last.push_str(turn);
    }
    chain
}

/// A chain of `blocks` keys of 1,000 tokens each, named by `conv`, of a prompt of `prompt`
/// tokens.
fn chain(keys: &Keys, conv: &str, blocks: u64, prompt: u64) -> PrefixChain {
    PrefixChain {
        keys: (1..=blocks)
            .map(|i| format!("{}:px:{conv}{i:04}", keys.namespace))
            .collect(),
        cached_tokens: (1..=blocks).map(|i| i * 1000).collect(),
        prompt_tokens: prompt,
        stream: true,
    }
}

impl Gate {
    fn new(gate: TokenGate) -> Gate {
        let eps: Vec<String> = [A, B, C].iter().map(|e| e.to_string()).collect();
        Gate {
            keys: Keys::new("ailb", "chat", "llm"),
            scripts: Scripts::new(),
            fp: fingerprint(&eps),
            eps,
            gate,
        }
    }

    fn acquire(&self, c: &mut Conn, rid: &str, chain: &PrefixChain, now_ms: u64) -> AcquireReply {
        let send = |sync: bool, c: &mut Conn| {
            let args = AcquireArgs {
                now_ms,
                lease_ttl_ms: 60_000,
                request_id: rid,
                cost: 1,
                cap: 0,
                random: 0,
                fingerprint: &self.fp,
                reclaim: 4,
                endpoints: sync.then_some(self.eps.as_slice()),
                session: None,
                wait_rank: None,
                pool_cap: 0,
                tenant: None,
                trials: 0,
            };
            let prefix = PrefixArgs {
                chain,
                ttl_s: 1800,
                max_imbalance: 1000,
                max_imbalance_ratio: 1000.0,
                gate: self.gate,
                latency: None,
            };
            let q = scripts::pick_call(&self.scripts, false, &self.keys, &args, Some(&prefix));
            scripts::parse_acquire(&c.raw_reply(&q)).unwrap()
        };
        match send(false, c) {
            AcquireReply::Sync => send(true, c),
            other => other,
        }
    }

    /// A pick: (endpoint, matched depth, spilled, booking).
    fn pick(
        &self,
        c: &mut Conn,
        rid: &str,
        chain: &PrefixChain,
    ) -> (String, u32, bool, Option<Booked>) {
        match self.acquire(c, rid, chain, 1_000) {
            AcquireReply::Picked {
                endpoint,
                depth,
                spilled,
                booked,
                ..
            } => (endpoint, depth, spilled, booked),
            other => panic!("{other:?}"),
        }
    }

    fn release(&self, c: &mut Conn, rid: &str, ep: &str) -> bool {
        let member = scripts::lease_member(rid, ep, 1, None);
        let q = scripts::release::release_call(
            (&self.scripts, false),
            &self.keys,
            &[member],
            true,
            (
                scripts::release::Learned::Nothing,
                0,
                &ailb_core::config::Ejection::OFF,
            ),
        );
        scripts::parse_release(&c.raw_reply(&q)).unwrap() != scripts::Released::Nothing
    }

    /// First bytes of (lease id, endpoint, rate sample) triples; how many were given back.
    fn first_bytes(&self, c: &mut Conn, done: &[(&str, &str, u64)]) -> i64 {
        let args: Vec<String> = done
            .iter()
            .flat_map(|(id, ep, s)| [id.to_string(), ep.to_string(), s.to_string()])
            .collect();
        let q = scripts::release::prefill_done_call(&self.scripts, false, &self.keys, &args);
        match c.cmd_raw(&q) {
            Value::Integer(n) => n,
            other => panic!("{other:?}"),
        }
    }

    fn prefill(&self, c: &mut Conn, ep: &str) -> f64 {
        c.cmd(&["ZSCORE", &self.keys.prefill, ep])
            .as_f64()
            .unwrap_or(-1.0)
    }

    fn booked_count(&self, c: &mut Conn) -> i64 {
        c.cmd(&["HLEN", &self.keys.booked]).as_i64().unwrap()
    }

    fn rate(&self, c: &mut Conn, ep: &str) -> Option<i64> {
        c.cmd(&["HGET", &self.keys.rates, ep])
            .as_str()
            .map(|s| s.parse().unwrap())
    }

    fn set_prefill(&self, c: &mut Conn, ep: &str, tokens: u64) {
        c.cmd(&["ZADD", &self.keys.prefill, &tokens.to_string(), ep]);
    }
}

#[test]
fn a_booking_goes_back_once_whichever_comes_first() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let g = Gate::new(TokenGate::default());
    // A cold prompt books all of its tokens; the same conversation's next turn only its new ones.
    let t1 = chain(&g.keys, "c1", 3, 3_500);
    let (ep, depth, _, booked) = g.pick(&mut c, "r1", &t1);
    assert_eq!(depth, 0);
    assert_eq!(
        booked,
        Some(Booked {
            predicted: None,
            ahead: 0,
            tokens: 3_500
        })
    );
    assert_eq!(g.prefill(&mut c, &ep), 3_500.0);
    let t2 = chain(&g.keys, "c1", 5, 5_200);
    let (ep2, depth, spilled, booked) = g.pick(&mut c, "r2", &t2);
    assert_eq!((ep2.as_str(), depth, spilled), (ep.as_str(), 3, false));
    assert_eq!(
        booked,
        Some(Booked {
            predicted: None,
            ahead: 3_500,
            tokens: 2_200
        }),
        "5,200 - 3,000 cached"
    );
    assert_eq!(g.prefill(&mut c, &ep), 5_700.0);
    // r1's first bytes give its tokens back; its release then gives back the lease only.
    assert_eq!(g.first_bytes(&mut c, &[("r1", &ep, 0)]), 1);
    assert_eq!(g.prefill(&mut c, &ep), 2_200.0);
    assert_eq!(g.first_bytes(&mut c, &[("r1", &ep, 0)]), 0, "idempotent");
    assert!(g.release(&mut c, "r1", &ep));
    assert_eq!(g.prefill(&mut c, &ep), 2_200.0);
    // r2 ends before its first bytes: the release gives its booking back; a late first-bytes
    // batch finds nothing.
    assert!(g.release(&mut c, "r2", &ep));
    assert_eq!(g.prefill(&mut c, &ep), 0.0);
    assert_eq!(g.first_bytes(&mut c, &[("r2", &ep, 0)]), 0);
    assert_eq!(g.prefill(&mut c, &ep), 0.0, "never below what was booked");
    assert_eq!(g.booked_count(&mut c), 0);
}

#[test]
fn a_crashed_gateways_bookings_heal_with_its_leases() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let g = Gate::new(TokenGate::default());
    let (lost, _, _, _) = g.pick(&mut c, "lost", &chain(&g.keys, "x", 2, 4_000));
    assert_eq!(g.prefill(&mut c, &lost), 4_000.0);
    // The gateway never releases; past the lease TTL the next acquire reclaims both.
    match g.acquire(&mut c, "next", &chain(&g.keys, "y", 1, 10), 1_000 + 60_001) {
        AcquireReply::Picked { .. } => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(
        [A, B, C].iter().map(|e| g.prefill(&mut c, e)).sum::<f64>(),
        10.0,
        "only the new request's 10 tokens are booked"
    );
    assert_eq!(g.booked_count(&mut c), 1);
}

#[test]
fn the_warm_endpoint_is_kept_until_its_ttft_exceeds_the_best_cold_ones_by_the_penalty() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    // 10,000 tokens/s, 500 ms penalty.
    let g = Gate::new(TokenGate {
        threshold: 0.0,
        penalty_ms: 500,
        rate: PrefillRate::Fixed(10_000),
    });
    let t1 = chain(&g.keys, "doc", 8, 8_000);
    let (warm, _, _, _) = g.pick(&mut c, "r1", &t1);
    assert!(g.release(&mut c, "r1", &warm));
    let next = |turn| new_turn(chain(&g.keys, "doc", 9, 9_000), turn);
    // Warm: 4,000 tokens booked + 1,000 uncached = 500 ms; cold: 0 + 9,000 = 900 ms. Kept.
    g.set_prefill(&mut c, &warm, 4_000);
    let (ep, depth, spilled, _) = g.pick(&mut c, "r2", &next("a"));
    assert_eq!((ep.as_str(), depth, spilled), (warm.as_str(), 8, false));
    assert!(g.release(&mut c, "r2", &warm));
    // Warm: 20,000 + 1,000 = 2,100 ms; best cold 900 ms: 1,200 ms worse, over the penalty.
    g.set_prefill(&mut c, &warm, 20_000);
    let (ep, depth, spilled, booked) = g.pick(&mut c, "r3", &next("b"));
    assert_ne!(ep, warm);
    assert_eq!((depth, spilled), (8, true));
    assert_eq!(
        booked.map(|b| b.tokens),
        Some(9_000),
        "cold: the whole prompt"
    );
    assert!(g.release(&mut c, "r3", &ep));
    // The cold endpoints are busy too: warm 2,100 ms vs cold 1,500 + 900 = 2,400 ms. Kept.
    for e in [A, B, C].into_iter().filter(|e| *e != warm) {
        g.set_prefill(&mut c, e, 15_000);
    }
    let (ep, _, spilled, _) = g.pick(&mut c, "r4", &next("c"));
    assert_eq!((ep.as_str(), spilled), (warm.as_str(), false));
}

#[test]
fn a_match_under_the_affinity_threshold_is_not_sticky() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let g = Gate::new(TokenGate {
        threshold: 0.8,
        ..TokenGate::default()
    });
    let (warm, _, _, _) = g.pick(&mut c, "r1", &chain(&g.keys, "d", 2, 2_000));
    assert!(g.release(&mut c, "r1", &warm));
    // Load the warm endpoint so that least-request would not choose it.
    c.cmd(&["ZADD", &g.keys.load, "XX", "5", &warm]);
    // 2 of 3 blocks known: 2,000 of 3,000 tokens, under 80 %.
    let (ep, depth, spilled, booked) = g.pick(&mut c, "r2", &chain(&g.keys, "d", 3, 3_000));
    assert_ne!(ep, warm);
    assert_eq!((depth, spilled), (2, true));
    assert_eq!(booked.map(|b| b.tokens), Some(3_000));
    // 2 of 2.2: over 80 %, kept despite its load (the request guard is wide open here).
    let mut longer = new_turn(chain(&g.keys, "d", 3, 2_200), "other");
    longer.cached_tokens[2] = 2_200;
    let (ep, _, spilled, booked) = g.pick(&mut c, "r3", &longer);
    assert_eq!((ep.as_str(), spilled), (warm.as_str(), false));
    assert_eq!(booked.map(|b| b.tokens), Some(200));
}

#[test]
fn rates_are_learned_from_first_bytes_and_a_slow_endpoint_is_left_sooner() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let g = Gate::new(TokenGate {
        threshold: 0.0,
        penalty_ms: 500,
        rate: PrefillRate::Learned,
    });
    assert_eq!(g.rate(&mut c, A), None, "nothing learned yet");
    assert_eq!(g.first_bytes(&mut c, &[("x", A, 20_000)]), 0);
    assert_eq!(
        g.rate(&mut c, A),
        Some(20_000),
        "the first sample is taken as is"
    );
    g.first_bytes(&mut c, &[("y", A, 10_000), ("z", B, 0)]);
    assert_eq!(g.rate(&mut c, A), Some(18_000), "a fifth of the way");
    assert_eq!(g.rate(&mut c, B), None, "no sample, no rate");
    // Warm endpoint slow (1,000 tokens/s): 1,000 uncached tokens = 1,000 ms against 9,000 at the
    // default 16,000 tokens/s = 562 ms: over the 500 ms penalty only because it is slow.
    let (warm, _, _, _) = g.pick(&mut c, "r1", &chain(&g.keys, "s", 8, 8_000));
    assert!(g.release(&mut c, "r1", &warm));
    let next = |turn| new_turn(chain(&g.keys, "s", 9, 9_000), turn);
    c.cmd(&["HSET", &g.keys.rates, &warm, "1000"]);
    let (ep, _, spilled, _) = g.pick(&mut c, "r2", &next("a"));
    assert!(!spilled, "1,000 - 562 ms is within the penalty");
    assert_eq!(ep, warm);
    assert!(g.release(&mut c, "r2", &warm));
    c.cmd(&["HSET", &g.keys.rates, &warm, "500"]);
    let (ep, _, spilled, _) = g.pick(&mut c, "r3", &next("b"));
    assert!(spilled && ep != warm, "2,000 ms against 562 ms: left");
}
