//! Redis CPU per pick and per release (`INFO commandstats` usec_per_call), measured under load:
//! 8 connections issuing pipelined EVALSHA batches in steady state (about 2 requests in flight
//! per endpoint). Acquire and release batches alternate behind a barrier so each is measured
//! on its own, at a constant load. A trivial script (`return 1`) measured the same way in the
//! same run gives the floor; the ratio to it is what holds on a noisy machine.
//!
//! Run: `cargo run --release --example bench_redis` (needs redis-server on PATH).

// A benchmark driver, not plugin code: failing loudly on a broken setup is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ailb_core::config::{Ejection, TokenGate};
use ailb_core::redis::resp::Value;
use ailb_core::redis::scripts::{
    self, AcquireArgs, Keys, PrefixArgs, PrefixChain, Scripts, SessionArgs,
};
use ailb_core::upstream::fingerprint;
use ailb_testkit::{command_stats, Conn, RedisServer};
use std::collections::VecDeque;
use std::sync::{Arc, Barrier};

mod floor;
use floor::measure_floor;

const CONNECTIONS: usize = 8;
const BATCH: usize = 32;
const ROUNDS: usize = 60;

struct Measured {
    pick_us: f64,
    release_us: f64,
    /// Usec per acquire in each measured round, in order.
    rounds: Vec<f64>,
}

fn endpoints(n: usize) -> Vec<String> {
    let mut v: Vec<String> = (0..n)
        .map(|i| format!("10.{}.{}.{}:8000", i / 65536, i / 256 % 256, i % 256))
        .collect();
    v.sort();
    v
}

/// Alternating measured phases; returns usec per acquire and per release.
fn measure_glr(redis: &RedisServer, hosts: usize) -> Measured {
    measure(redis, hosts, 0, false)
}

/// Distinct sessions the sticky measurement draws from: most picks find their session bound
/// (kept), a few bind it (docs/redis-data-model.md §10).
const STICKY_SESSIONS: u64 = 2048;

/// One configuration of a route under measurement. `blocks > 0`: each pick is a prefix_cache
/// pick of a prompt of `blocks` blocks whose first `blocks - 2` are known (the previous turn of
/// its conversation) and whose last two are new (the answer and the next question): the steady
/// state of a multi-turn chat; else a global_least_request pick. `sticky`: every pick also
/// carries a session (`sessionHeader`), drawn from [`STICKY_SESSIONS`].
#[derive(Clone, Copy)]
struct Variant {
    blocks: usize,
    sticky: bool,
}

fn measure(redis: &RedisServer, hosts: usize, blocks: usize, sticky: bool) -> Measured {
    let mut m = measure_side_by_side(redis, hosts, &[Variant { blocks, sticky }]);
    m.remove(0)
}

/// A route of its own per variant; each round measures every variant's acquire batch in turn,
/// then every variant's release batch, so variants are compared within the same few
/// milliseconds (the machine's noise moves them alike).
fn measure_side_by_side(redis: &RedisServer, hosts: usize, variants: &[Variant]) -> Vec<Measured> {
    let scripts = Arc::new(Scripts::new());
    let eps = Arc::new(endpoints(hosts));
    let fp: Arc<str> = fingerprint(&eps).into();
    let mut c = redis.conn();
    for s in scripts.all() {
        c.cmd(&[b"SCRIPT".as_slice(), b"LOAD", s.text.as_bytes()]);
    }
    // Conversations and their known prefixes (previous turns), pointing at some endpoint.
    const SESSIONS: usize = 64;
    let mut routes = Vec::new();
    for (v, variant) in variants.iter().enumerate() {
        let tag = if variant.sticky { "s" } else { "" };
        let keys = Keys::new(
            "ailb",
            "bench",
            &format!(
                "outbound|8000||llm{hosts}{tag}v{v}b{}.static",
                variant.blocks
            ),
        );
        // Sync the membership once, as the first pick of a gateway does.
        let args = AcquireArgs {
            now_ms: 1,
            lease_ttl_ms: 600_000,
            request_id: "sync",
            cost: 1,
            cap: 0,
            random: 0,
            fingerprint: &fp,
            reclaim: 0,
            endpoints: Some(&eps),
            session: None,
            wait_rank: None,
            pool_cap: 0,
            tenant: None,
            trials: 0,
        };
        c.cmd_raw(&scripts::acquire_call(&scripts, true, &keys, &args));
        let known = variant.blocks.saturating_sub(2);
        let chains: Vec<Vec<String>> = (0..SESSIONS)
            .map(|s| {
                (0..known)
                    .map(|b| format!("{}:px:{s:08x}{b:08x}", keys.namespace))
                    .collect()
            })
            .collect();
        for (s, chain) in chains.iter().enumerate() {
            let owner = &eps[s % eps.len()];
            let sets: Vec<Vec<u8>> = chain
                .iter()
                .map(|k| {
                    ailb_core::redis::resp::encode_command(&[
                        "SET",
                        k.as_str(),
                        owner.as_str(),
                        "EX",
                        "3600",
                    ])
                })
                .collect();
            c.pipeline(&sets);
        }
        routes.push((*variant, keys, chains));
    }
    let routes = Arc::new(routes);
    let in_flight_per_conn = (2 * hosts).div_ceil(CONNECTIONS).max(BATCH);
    let barrier = Arc::new(Barrier::new(CONNECTIONS + 1));
    let workers: Vec<_> = (0..CONNECTIONS)
        .map(|t| {
            let (routes, scripts, fp, barrier) =
                (routes.clone(), scripts.clone(), fp.clone(), barrier.clone());
            let port = redis.port;
            std::thread::spawn(move || {
                let mut conn = Conn::try_connect(port).unwrap();
                let mut held: Vec<VecDeque<String>> = vec![VecDeque::new(); routes.len()];
                let mut seq: u64 = 0;
                let mut rng: u64 = 0x2545_f491_4f6c_dd1d ^ t as u64;
                let mut acquire_batch = |conn: &mut Conn, v: usize, held: &mut VecDeque<String>| {
                    let (variant, keys, chains) = &routes[v];
                    let mut rids = Vec::with_capacity(BATCH);
                    let queries: Vec<Vec<u8>> = (0..BATCH)
                        .map(|_| {
                            seq += 1;
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            let rid = format!("b{t:02}{seq:x}");
                            let session = variant.sticky.then(|| {
                                let id = format!("user-{}", (rng >> 16) % STICKY_SESSIONS);
                                scripts::session_key(&keys.namespace, id.as_bytes())
                            });
                            let args = AcquireArgs {
                                now_ms: 1_000_000 + seq,
                                lease_ttl_ms: 600_000,
                                request_id: &rid,
                                cost: 1,
                                cap: 0,
                                random: (rng >> 32) as u32,
                                fingerprint: &fp,
                                reclaim: scripts::RECLAIM_LIMIT, // as the plugin sends on every acquire
                                endpoints: None,
                                session: session.as_deref().map(|key| SessionArgs {
                                    key,
                                    ttl_s: 1800,
                                    max_imbalance: 8,
                                    max_imbalance_ratio: 1.5,
                                }),
                                wait_rank: None,
                                pool_cap: 0,
                                tenant: None,
                                trials: Ejection::DEFAULT.trials(),
                            };
                            // The conversation's known prefix plus this turn's two new blocks.
                            let mut chain = chains[(rng as usize) % chains.len()].clone();
                            if variant.blocks > 0 {
                                chain.push(format!("{}:px:a{t:02}{seq:013x}", keys.namespace));
                                chain.push(format!("{}:px:b{t:02}{seq:013x}", keys.namespace));
                            }
                            // 256 tokens per block: every pick books its uncached share.
                            let n = chain.len() as u64;
                            let chain = PrefixChain {
                                cached_tokens: (1..=n).map(|i| i * 256).collect(),
                                prompt_tokens: n * 256,
                                stream: true,
                                keys: chain,
                            };
                            let prefix = PrefixArgs {
                                chain: &chain,
                                ttl_s: 1800,
                                max_imbalance: 8,
                                max_imbalance_ratio: 1.5,
                                gate: TokenGate::default(),
                                latency: None,
                            };
                            let q = scripts::pick_call(
                                &scripts,
                                true,
                                keys,
                                &args,
                                (variant.blocks > 0).then_some(&prefix),
                            );
                            rids.push(rid);
                            q
                        })
                        .collect();
                    for (rid, reply) in rids.iter().zip(conn.pipeline(&queries)) {
                        let Value::Array(Some(items)) = reply else {
                            panic!("acquire failed: {reply:?}")
                        };
                        let ep = items[1].as_str().unwrap().to_string();
                        held.push_back(scripts::lease_member(rid, &ep, 1, None));
                    }
                };
                // Warm up to the steady-state number of leases (not measured).
                for (v, h) in held.iter_mut().enumerate() {
                    while h.len() < in_flight_per_conn {
                        acquire_batch(&mut conn, v, h);
                    }
                }
                for _ in 0..ROUNDS {
                    for (v, h) in held.iter_mut().enumerate() {
                        barrier.wait(); // measured: acquires of variant v
                        acquire_batch(&mut conn, v, h);
                        barrier.wait();
                    }
                    for (v, h) in held.iter_mut().enumerate() {
                        barrier.wait(); // measured: releases of variant v's oldest leases
                        let keys = &routes[v].1;
                        let booked = routes[v].0.blocks > 0;
                        let queries: Vec<Vec<u8>> = h
                            .drain(..BATCH)
                            .map(|m| release(&scripts, keys, m, booked))
                            .collect();
                        for r in conn.pipeline(&queries) {
                            assert_eq!(r, Value::Integer(1), "release must find its lease");
                        }
                        barrier.wait();
                    }
                }
                // Give back what is still held (not measured), so a later measurement of the
                // same route starts from idle endpoints, not from this one's leftover load.
                for (v, h) in held.iter_mut().enumerate() {
                    let keys = &routes[v].1;
                    let booked = routes[v].0.blocks > 0;
                    let queries: Vec<Vec<u8>> = h
                        .drain(..)
                        .map(|m| release(&scripts, keys, m, booked))
                        .collect();
                    conn.pipeline(&queries);
                }
            })
        })
        .collect();
    let phase = |c: &mut ailb_testkit::Conn| {
        c.cmd(&["CONFIG", "RESETSTAT"]);
        barrier.wait();
        barrier.wait();
        command_stats(c, "evalsha")
    };
    let n = variants.len();
    let (mut pick, mut release) = (vec![(0u64, 0u64); n], vec![(0u64, 0u64); n]);
    let mut rounds = vec![Vec::with_capacity(ROUNDS); n];
    for _ in 0..ROUNDS {
        for v in 0..n {
            let (calls, usec) = phase(&mut c);
            pick[v] = (pick[v].0 + calls, pick[v].1 + usec);
            rounds[v].push(usec as f64 / calls.max(1) as f64);
        }
        for r in release.iter_mut() {
            let (calls, usec) = phase(&mut c);
            *r = (r.0 + calls, r.1 + usec);
        }
    }
    for w in workers {
        w.join().unwrap();
    }
    (0..n)
        .map(|v| Measured {
            pick_us: pick[v].1 as f64 / pick[v].0 as f64,
            release_us: release[v].1 as f64 / release[v].0 as f64,
            rounds: std::mem::take(&mut rounds[v]),
        })
        .collect()
}

fn main() {
    let redis = RedisServer::start();
    let floor_before = measure_floor(&redis);
    let mut picks = Vec::new();
    let mut release = 0.0;
    for hosts in [4, 64, 256, 4096] {
        let m = measure_glr(&redis, hosts);
        picks.push((hosts, m.pick_us));
        if hosts == 256 {
            release = m.release_us;
        }
    }
    // prefix_cache: a chat of T turns has 2T blocks (system, then user/assistant pairs).
    let mut prefix = Vec::new();
    for (name, blocks) in [
        ("turns1", 2),
        ("turns5", 10),
        ("turns20", 40),
        ("blocks100", 100),
    ] {
        prefix.push((name, measure(&redis, 64, blocks, false).pick_us));
    }
    // Session stickiness on top of least-request, side by side with plain least-request at the
    // same endpoint count: in every round each is measured within the same milliseconds, and
    // the median of the rounds' differences is the session's cost (a round the machine's noise
    // hit moves it little).
    let side = measure_side_by_side(
        &redis,
        256,
        &[
            Variant {
                blocks: 0,
                sticky: false,
            },
            Variant {
                blocks: 0,
                sticky: true,
            },
        ],
    );
    let sticky256 = side[1].pick_us;
    let mut diffs: Vec<f64> = side[1]
        .rounds
        .iter()
        .zip(&side[0].rounds)
        .map(|(s, p)| s - p)
        .collect();
    diffs.sort_by(f64::total_cmp);
    let session_cost = diffs[diffs.len() / 2];
    // Floor measured before and after; the mean is the reference for the ratio.
    let floor = (floor_before + measure_floor(&redis)) / 2.0;
    for (hosts, us) in &picks {
        println!("BENCH redis_us_per_pick_glr_hosts{hosts} {us:.2} us");
    }
    println!("BENCH redis_us_per_release_glr {release:.2} us");
    for (name, us) in &prefix {
        println!("BENCH redis_us_per_pick_prefix_{name} {us:.2} us");
    }
    println!("BENCH redis_us_trivial_script_floor {floor:.2} us");
    let at256 = picks.iter().find(|(h, _)| *h == 256).map_or(0.0, |p| p.1);
    println!(
        "BENCH redis_pick_over_floor_glr_hosts256 {:.1} ratio",
        at256 / floor
    );
    println!(
        "BENCH redis_pick_over_floor_glr_session {:.1} ratio",
        sticky256 / floor
    );
    println!(
        "BENCH redis_pick_over_floor_glr_session_vs_plain_hosts256 {:.1} ratio",
        session_cost / floor
    );
    let turns20 = prefix
        .iter()
        .find(|(n, _)| *n == "turns20")
        .map_or(0.0, |p| p.1);
    println!(
        "BENCH redis_pick_over_floor_prefix_turns20 {:.1} ratio",
        turns20 / floor
    );
    match std::fs::metadata(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../dist/ai-load-balancer.wasm"
    )) {
        Ok(m) => println!("BENCH wasm_module_bytes {} bytes", m.len()),
        Err(_) => {
            eprintln!("dist/ai-load-balancer.wasm not built (make build): module size not reported")
        }
    }
}

/// A release as the plugin sends one after an answer, failure memory on (its defaults).
fn release(scripts: &Scripts, keys: &Keys, member: String, booked: bool) -> Vec<u8> {
    let learned = (
        scripts::release::Learned::Answered,
        1_000_000,
        &Ejection::DEFAULT,
    );
    scripts::release::release_call((scripts, true), keys, &[member], booked, learned)
}
