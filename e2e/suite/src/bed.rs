//! A test bed: one Redis, N fake pods (in-process), gateways started on demand.

use crate::gateway::{http, Gateway, GatewaySpec, CLUSTER, ROUTE};
use crate::redis::{self, Counts};
use ailb_fakepod::load::{self, LoadConfig, Summary, Workload};
use ailb_fakepod::{spawn_pod, PodConfig, PodHandle};
use ailb_testkit::{Options, RedisServer};
use serde_json::{json, Value};
use std::time::Duration;

pub struct Bed {
    pub rt: tokio::runtime::Runtime,
    pub redis: RedisServer,
    pub pods: Vec<PodHandle>,
}

/// A runtime and `n` in-process fake pods named `pod-<i>`, each configured by `tune`.
pub fn spawn_pods(
    n: usize,
    tune: impl Fn(&mut PodConfig),
) -> (tokio::runtime::Runtime, Vec<PodHandle>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let pods = (0..n)
        .map(|i| {
            let mut cfg = PodConfig {
                name: format!("pod-{i}"),
                ..PodConfig::default()
            };
            tune(&mut cfg);
            rt.block_on(spawn_pod(cfg)).expect("fake pod")
        })
        .collect();
    (rt, pods)
}

impl Bed {
    /// `pods` fake pods configured by `tune` (timings in microseconds).
    pub fn new(pods: usize, tune: impl Fn(&mut PodConfig)) -> Bed {
        let (rt, handles) = spawn_pods(pods, tune);
        Bed {
            rt,
            // DEBUG enabled: the fault tests stall Redis with DEBUG SLEEP (storm.rs).
            redis: RedisServer::start_with(Options {
                debug_command: true,
                ..Options::default()
            }),
            pods: handles,
        }
    }

    /// Marks pod `name` unhealthy in `gateways`' upstream cluster (the emulator's admin API,
    /// as Envoy's health checking would); returns its address once the plugin's workers see
    /// it: their Redis picks reuse a host list for up to 100 ms (core balancer/healthy.rs
    /// `HOST_LIST_MS`), far less than a health check's own interval.
    pub fn mark_unhealthy(&self, name: &str, gateways: &[&Gateway]) -> String {
        let addr = self
            .pods
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no pod {name}"))
            .addr
            .to_string();
        let path = format!(
            "/admin/health?cluster={}&address={addr}&status=Unhealthy",
            CLUSTER.replace('|', "%7C")
        );
        for gw in gateways {
            assert_eq!(gw.admin_post(&path).ok(), Some(200), "{path}");
        }
        std::thread::sleep(std::time::Duration::from_millis(150));
        addr
    }

    pub fn pod_addrs(&self) -> Vec<String> {
        self.pods.iter().map(|p| p.addr.to_string()).collect()
    }

    /// A gateway spec for this bed with the plugin config `plugin` (None = no plugin).
    pub fn spec(&self, id: &str, plugin: Option<Value>) -> GatewaySpec {
        GatewaySpec::new(id, self.redis.port, &self.pod_addrs(), plugin)
    }

    pub fn gateway(&self, spec: &GatewaySpec) -> Gateway {
        Gateway::start(spec).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn counts(&self) -> Counts {
        redis::counts(self.redis.port, ROUTE, CLUSTER)
    }

    /// Every pod's engines emptied, each data-parallel rank's.
    pub fn reset_pods(&self) {
        for p in &self.pods {
            for r in &p.ranks().list {
                r.engine.reset(true);
            }
        }
    }

    /// Starts `gateways` gateways (`tweak` adjusts each spec), replays `workload` through them
    /// with pods reset first (every setup starts cold) and returns the summary. Two setups
    /// replayed with the same seed see the same arrivals.
    pub fn replay(
        &self,
        tag: &str,
        gateways: usize,
        plugin: Option<Value>,
        tweak: impl Fn(&mut GatewaySpec),
        workload: Workload,
        seed: u64,
    ) -> anyhow::Result<Summary> {
        let gws: Vec<Gateway> = (0..gateways)
            .map(|i| {
                let mut spec = self.spec(&format!("{tag}-{i}"), plugin.clone());
                tweak(&mut spec);
                Gateway::start(&spec)
            })
            .collect::<anyhow::Result<_>>()?;
        let mut lc = LoadConfig::new(gws.iter().map(|g| g.url.clone()).collect(), workload);
        lc.seed = seed;
        lc.timeout = Duration::from_secs(120);
        lc.admin_urls = self.pods.iter().map(|p| p.url()).collect();
        lc.reset_pods = true;
        let s = self.rt.block_on(load::run(&lc))?;
        eprintln!("{tag}: {}", s.line());
        Ok(s)
    }

    /// Peak concurrently running requests per pod since the last reset.
    pub fn peaks(&self) -> Vec<usize> {
        self.pods.iter().map(|p| p.state().peak_running).collect()
    }
}

/// A chat request body producing `max_tokens` output tokens.
pub fn chat_body(text: &str, max_tokens: u64) -> Vec<u8> {
    json!({"model": "fake-model", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens})
        .to_string()
        .into_bytes()
}

/// POSTs a chat request; returns (status, `x-pod` header).
pub fn chat(gateway: &str, text: &str, max_tokens: u64) -> (u16, String) {
    match http(
        gateway,
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        &chat_body(text, max_tokens),
    ) {
        Ok((status, headers, _)) => {
            let pod = headers
                .iter()
                .find(|(k, _)| k == "x-pod")
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            (status, pod)
        }
        Err(_) => (0, String::new()),
    }
}

/// `n` requests from 8 clients, client `t`'s `i`-th sent to `urls[(t + i) % urls.len()]`:
/// (pod, status) of each (the failure-memory tests).
pub fn chats(urls: &[String], n: usize) -> Vec<(String, u16)> {
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let urls = urls.to_vec();
            std::thread::spawn(move || {
                (0..n / 8)
                    .map(|i| {
                        let (status, pod) = chat(&urls[(t + i) % urls.len()], "q", 2);
                        (pod, status)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().expect("client thread"))
        .collect()
}

/// The failure-memory tests' bed: 4 pods, a healthy answer in ~20 ms; the `failing` ones
/// answer every generation with 500 at once.
pub fn failing_bed(failing: &[&str]) -> Bed {
    Bed::new(4, |c| {
        c.max_running = 64;
        c.decode_us_per_token = 10_000;
        if failing.contains(&c.name.as_str()) {
            c.error_rate = 1.0;
        }
    })
}

/// Probes through `url` until every count is back to zero: what a fault left behind (a lost
/// reply, a killed gateway's requests) heals by reclaim, which only a pick runs
/// (docs/redis-data-model.md §6), so a wait without requests could wait forever.
pub fn probe_until_zero(bed: &Bed, url: &str, timeout: Duration) -> Counts {
    let probe = chat_body("probe", 1);
    let mut last = bed.counts();
    ailb_testkit::wait_until(timeout, || {
        for _ in 0..4 {
            let _ = http(
                url,
                "POST",
                "/v1/chat/completions",
                &[("content-type", "application/json")],
                &probe,
            );
        }
        // The last probe's release may still be on its way.
        last = wait_for_zero(bed, Duration::from_millis(300));
        last.is_zero()
    });
    last
}

/// Waits (up to 5 s) until a wave of requests sent when `leases_before` leases were held has
/// settled: each holds a lease or has been answered (refused). Tests that send waves in an
/// order wait for this rather than for a fixed time, which a loaded machine can outrun.
pub fn wait_wave<T>(bed: &Bed, leases_before: i64, wave: &[std::thread::JoinHandle<T>]) {
    ailb_testkit::wait_until(Duration::from_secs(5), || {
        let answered = wave.iter().filter(|t| t.is_finished()).count();
        bed.counts().leases + answered as i64 >= leases_before + wave.len() as i64
    });
}

/// Polls Redis until every count is back to zero.
pub fn wait_for_zero(bed: &Bed, timeout: Duration) -> Counts {
    let mut last = bed.counts();
    ailb_testkit::wait_until(timeout, || {
        last = bed.counts();
        last.is_zero()
    });
    last
}

/// The verified-index flush tests' bed (tests/prefix_verify.rs, tests/envoy_prefix_verify.rs):
/// two fast pods.
pub fn verify_bed() -> Bed {
    Bed::new(2, |c| {
        c.max_running = 32;
        c.decode_us_per_token = 200;
        c.prefill_us_per_token = 5;
    })
}

/// Conversations over [`verify_bed`]'s 2 pods: enough that a flushed pod holds more than the
/// shortfalls it takes to find out (verify/flush.rs `FLUSH_CONVERSATIONS` per worker).
pub const FLUSH_CONVERSATIONS: usize = 40;

/// Flushes the pod whose address or name is `pod` as an engine restart does (its prefix cache
/// empties, its start time moves: `/admin/restart`).
pub fn restart_pod(bed: &Bed, pod: &str) {
    let handle = bed
        .pods
        .iter()
        .find(|p| p.addr.to_string() == pod || p.name == pod)
        .unwrap_or_else(|| panic!("no pod {pod}"));
    let (status, _, _) = http(&handle.url(), "POST", "/admin/restart", &[], b"").unwrap();
    assert_eq!(status, 200, "restart {pod}");
}

/// The pod most conversations were sent to.
pub fn busiest(pod_of: &std::collections::BTreeMap<usize, String>) -> String {
    let mut count: std::collections::BTreeMap<&String, usize> = Default::default();
    for pod in pod_of.values() {
        *count.entry(pod).or_default() += 1;
    }
    count
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(p, _)| p.clone())
        .unwrap_or_default()
}
