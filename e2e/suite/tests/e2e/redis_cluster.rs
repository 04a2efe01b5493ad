//! The plugin on a real Redis Cluster (3 masters + 3 replicas, ACL user and password on every
//! node) behind Envoy's `redis_proxy`, 2 emulator gateways × 2 workers, fake pods
//! (e2e/suite/src/redis_cluster.rs, cluster3.rs): 200 routes of each of three policies spread
//! over every shard; a master SIGKILLed and the proxy restarted under load; a wrong password.
//! The tests share the machine's two cores and time failovers, so they run one at a time.

use ailb_e2e::cluster3::{counts_via, decisions, drill, send, Fleet, Route, SERVICES};
use ailb_e2e::gateway::Gateway;
use ailb_e2e::redis_cluster::{failover_budget, time_until, PASSWORD};
use ailb_testkit::wait_until;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// 2 ms per output token: a 2-token request takes a few ms, a 300-token one ~0.6 s.
fn fleet(per_policy: usize) -> Fleet {
    Fleet::new(per_policy, |c| {
        c.max_running = 256;
        c.decode_us_per_token = 2_000;
        c.decode_batch_penalty = 0.0;
        c.prefill_us_per_token = 1;
    })
}

/// Sends every request of `jobs` (gateway index, route, prompt, tokens) from 8 threads;
/// returns the statuses.
fn send_all(gws: &[Gateway], jobs: Vec<(usize, Route, String, u64)>) -> Vec<u16> {
    let jobs = std::sync::Arc::new(Mutex::new(jobs));
    let urls: Vec<String> = gws.iter().map(|g| g.url.clone()).collect();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (jobs, urls) = (jobs.clone(), urls.clone());
            std::thread::spawn(move || {
                let mut out = Vec::new();
                while let Some((g, r, text, tokens)) = jobs.lock().unwrap().pop() {
                    out.push(send(&urls[g % urls.len()], &r, &text, tokens).0);
                }
                out
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect()
}

fn total_stat(gws: &[Gateway], name: &str) -> i64 {
    gws.iter().map(|g| g.stat(name)).sum()
}

#[test]
fn it_balances_200_routes_per_policy_on_every_shard() {
    let _serial = serial();
    let fleet = fleet(200);
    let gws = fleet.gateways(2, PASSWORD, 30);
    let routes = fleet.routes();
    // Where each route lives: every policy's routes are on all three masters.
    let masters = fleet.redis.masters();
    let owner: BTreeMap<String, u16> = routes
        .iter()
        .map(|r| {
            (
                r.name.clone(),
                fleet.redis.master_of(&r.anchor_key()).unwrap(),
            )
        })
        .collect();
    for p in ["glr", "px", "cm"] {
        let on: BTreeSet<u16> = routes
            .iter()
            .filter(|r| r.policy == p)
            .map(|r| owner[&r.name])
            .collect();
        assert_eq!(
            on.len(),
            3,
            "{p} routes on every master: {on:?} of {masters:?}"
        );
    }

    // Two turns of one conversation per route, over both gateways (new connection each, so
    // over both workers): every first turn, then every second turn; 1,200 requests.
    let mut statuses = Vec::new();
    for turn in 0..2 {
        let jobs: Vec<_> = routes
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let text = format!("{} {}", r.name, "a long shared system prompt. ".repeat(40));
                (i + turn, r.clone(), text, 2)
            })
            .collect();
        statuses.extend(send_all(&gws, jobs));
    }
    assert_eq!(statuses.len(), 1200);
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    let logs = || gws.iter().map(|g| g.logs()).collect::<Vec<_>>().join("\n");
    assert_eq!(total_stat(&gws, "ai_lb.glr.routed"), 400, "{}", logs());
    assert_eq!(total_stat(&gws, "ai_lb.prefix.routed"), 400, "{}", logs());
    assert_eq!(
        total_stat(&gws, "ai_lb.cluster_metrics.inflight_global"),
        400,
        "{}",
        logs()
    );
    assert_eq!(decisions(&gws).1, 0, "no fallback: {}", logs());
    assert!(
        total_stat(&gws, "ai_lb.prefix.hit") >= 200,
        "every second turn finds its prefix: {}",
        total_stat(&gws, "ai_lb.prefix.hit")
    );

    // Every route's keys are on the master owning its hash tag, and right: all in flight
    // given back, each endpoint route synced to the 3 pods, a prefix key for each
    // prefix route.
    let settled = wait_until(Duration::from_secs(5), || {
        routes
            .iter()
            .all(|r| fleet.counts_on_master(r).is_some_and(|c| c.is_zero()))
    });
    let bad: Vec<_> = routes
        .iter()
        .map(|r| (r.name.clone(), fleet.counts_on_master(r)))
        .filter(|(_, c)| !c.as_ref().is_some_and(|c| c.is_zero()))
        .take(5)
        .collect();
    assert!(settled, "counts left: {bad:?}");
    let by_master = fleet.redis.keys_by_master();
    for r in &routes {
        let keys = &by_master
            .iter()
            .find(|(p, _)| *p == owner[&r.name])
            .unwrap()
            .1;
        let mine = |suffix: &str| {
            keys.iter()
                .filter(|k| k.contains(&format!("{}|", r.name)) && k.contains(suffix))
                .count()
        };
        match r.policy {
            "cm" => {} // counts at 0 are deleted (docs/redis-data-model.md §8)
            _ => {
                let c = fleet.counts_on_master(r).unwrap();
                assert_eq!(c.counts.len(), 3, "{}: {c:?}", r.name);
                assert_eq!(mine(":members"), 1, "{}", r.name);
                if r.policy == "px" {
                    assert!(mine(":px:") >= 1, "{}: no prefix key on its master", r.name);
                }
            }
        }
    }
    for (port, keys) in &by_master {
        let px = keys.iter().filter(|k| k.contains(":px:")).count();
        eprintln!("master {port}: {} keys, {px} prefix keys", keys.len());
        assert!(px > 0, "master {port} holds prefix keys");
    }

    // Held requests: 3 routes per policy per master, one long request each; while they run
    // each route counts exactly one in flight and one lease, on its own master.
    let mut held = Vec::new();
    for p in ["glr", "px", "cm"] {
        for m in &masters {
            held.extend(
                routes
                    .iter()
                    .filter(|r| r.policy == p && owner[&r.name] == m.port)
                    .take(3)
                    .cloned(),
            );
        }
    }
    assert_eq!(held.len(), 27);
    let urls: Vec<String> = gws.iter().map(|g| g.url.clone()).collect();
    let running: Vec<_> = held
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let (url, r) = (urls[i % 2].clone(), r.clone());
            // 1000 tokens, 2 s: one pass over the 27 routes' counts opens ~160 connections.
            std::thread::spawn(move || send(&url, &r, "hold", 1000))
        })
        .collect();
    // The counts of the pass that saw every route counted, not a later read, which a request
    // that ended meanwhile would find at zero.
    let mut seen = Vec::new();
    let counted = wait_until(Duration::from_secs(3), || {
        seen = held
            .iter()
            .map(|r| (r.name.clone(), fleet.counts_on_master(r)))
            .collect();
        seen.iter().all(|(_, c)| {
            c.as_ref()
                .is_some_and(|c| c.total() == 1.0 && c.leases == 1)
        })
    });
    for t in running {
        assert_eq!(t.join().unwrap().0, 200);
    }
    assert!(counted, "one in flight per held route: {seen:?}");
    for (name, c) in &seen {
        if name.starts_with("cm-") {
            let c = c.as_ref().unwrap();
            assert!(SERVICES.contains(&c.counts.keys().next().unwrap().as_str()));
        }
    }
    assert!(
        wait_until(Duration::from_secs(5), || held
            .iter()
            .all(|r| fleet.counts_on_master(r).is_some_and(|c| c.is_zero()))),
        "held requests given back"
    );
}

/// Under steady load over routes on every shard: SIGKILL a master (its replica is promoted),
/// then restart it as a replica; then restart the proxy. Every request is served (fail-open
/// while a shard or the proxy is gone), nothing is ever negative, the counts heal within the
/// lease TTL, and the promoted shard, which never saw `SCRIPT LOAD`, is served through
/// `NOSCRIPT` → `EVAL`.
#[test]
fn it_serves_every_request_through_a_master_failover_and_a_proxy_restart() {
    let _serial = serial();
    let mut fleet = fleet(8);
    let lease_ttl = 3;
    let gws = fleet.gateways(2, PASSWORD, lease_ttl);
    let routes = fleet.routes();
    // Every acquire reclaims expired leases, so one probe round after the last lease expired
    // heals every route (rounds take ~0.15 s; the margin is for a loaded machine).
    let heal = Duration::from_secs(lease_ttl + 4);
    let noscript_before = total_stat(&gws, "ai_lb.redis.noscript");

    let mut killed = 0;
    let d = drill(
        &mut fleet,
        &gws,
        &routes,
        6,
        Duration::from_millis(1500),
        heal,
        |f| {
            let victim = f.redis.masters()[0].clone();
            killed = victim.port;
            f.redis.node_mut(victim.port).kill();
            let took = time_until(failover_budget(), || {
                f.redis.serving()
                    && f.redis
                        .masters()
                        .iter()
                        .any(|m| victim.replicas.contains(&m.port))
            })
            .unwrap_or_else(|| {
                panic!(
                    "no replica of {} promoted:\n{}",
                    victim.port,
                    f.redis.logs()
                )
            });
            f.redis.wait_proxy(failover_budget());
            took
        },
    );
    eprintln!(
        "master failover: {d:?}, fallback share {:.3}",
        d.fallback_share()
    );
    assert!(d.requests > 100, "{d:?}");
    assert_eq!(d.lost, 0, "every request served: {d:?}");
    assert!(d.negative.is_empty(), "negative counts: {:?}", d.negative);
    assert_eq!(
        d.leaked, 0.0,
        "counts back to the truth within the lease TTL: {d:?}"
    );
    assert!(d.fallbacks > 0, "the gap was felt and failed open: {d:?}");
    assert!(
        total_stat(&gws, "ai_lb.redis.noscript") > noscript_before,
        "the promoted replica had no script: NOSCRIPT → EVAL"
    );
    // Prefix routing resumes on every shard, the promoted one included.
    let hits = total_stat(&gws, "ai_lb.prefix.hit");
    for r in routes.iter().filter(|r| r.policy == "px") {
        for g in &gws {
            assert_eq!(send(&g.url, r, "after the failover, again", 2).0, 200);
        }
    }
    assert!(
        total_stat(&gws, "ai_lb.prefix.hit") >= hits + 8,
        "second of each pair hits"
    );

    // The old master comes back as a replica of its promoted one.
    fleet.redis.node_mut(killed).restart();
    fleet.redis.wait_healthy(Duration::from_secs(20));
    assert!(
        fleet
            .redis
            .masters()
            .iter()
            .any(|m| m.replicas.contains(&killed)),
        "{killed} rejoined as a replica: {:?}",
        fleet.redis.masters()
    );

    // The proxy itself restarts under load.
    let d = drill(
        &mut fleet,
        &gws,
        &routes,
        6,
        Duration::from_millis(1500),
        heal,
        |f| {
            let t = std::time::Instant::now();
            f.redis.proxy.restart();
            f.redis.wait_proxy(Duration::from_secs(20));
            t.elapsed()
        },
    );
    eprintln!(
        "proxy restart: {d:?}, fallback share {:.3}",
        d.fallback_share()
    );
    assert_eq!(d.lost, 0, "every request served: {d:?}");
    assert!(d.negative.is_empty(), "negative counts: {:?}", d.negative);
    assert_eq!(d.leaked, 0.0, "{d:?}");
    assert!(d.fallbacks > 0, "{d:?}");
    for r in &routes {
        let c = counts_via(fleet.redis.proxy.port, r).unwrap();
        assert!(c.is_zero() && !c.any_negative(), "{}: {c:?}", r.name);
    }
}

/// A wrong password: every request is served by the cluster's own balancing, the log says
/// what is wrong once per worker per interval, and no password appears in any log.
#[test]
fn it_fails_open_with_one_clear_error_on_a_wrong_password() {
    let _serial = serial();
    let fleet = fleet(4);
    let wrong = "wrong-Pw-4711-not-this";
    let gws = fleet.gateways(2, wrong, 30);
    let routes = fleet.routes();
    let jobs: Vec<_> = (0..120)
        .map(|i| {
            let r = routes[i % routes.len()].clone();
            (i, r.clone(), format!("{} {i}", r.name), 2)
        })
        .collect();
    let statuses = send_all(&gws, jobs);
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    let (all, fell) = decisions(&gws);
    assert_eq!((all, fell), (120, 120), "every decision fell back");
    let logs: String = gws.iter().map(|g| g.logs() + "\n").collect();
    let refused: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("Redis refused the credentials"))
        .collect();
    assert!(!refused.is_empty(), "a clear error:\n{logs}");
    assert!(
        refused
            .iter()
            .all(|l| l.contains("NOAUTH") || l.contains("WRONGPASS")),
        "{refused:?}"
    );
    // Rate-limited: at most once per worker VM (2 gateways × 2 workers) in this short run.
    assert!(refused.len() <= 4, "{refused:?}");
    assert!(logs.lines().count() < 60, "the log is not flooded:\n{logs}");
    for secret in [wrong, PASSWORD] {
        assert!(!logs.contains(secret), "a password in the gateway log");
        assert!(
            !fleet.redis.proxy.logs().contains(secret),
            "a password in the proxy log"
        );
    }
}
