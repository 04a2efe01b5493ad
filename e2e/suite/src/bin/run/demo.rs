//! One bed per policy: the pods, the plugin config and the workload that show the policy at
//! work (least request under long concurrent requests, multi-turn chats for prefix_cache, a
//! busy pod for endpoint_metrics, a slow and a failing service for cluster_metrics, users
//! hashed over weighted services for cluster_hash).

use ailb_core::config::Policy;
use ailb_e2e::bed::Bed;
use ailb_e2e::cluster::{
    cluster_config, hash_plugin, metrics_plugin, services, slow_and_failing, Service,
};
use ailb_e2e::gateway::{http, Gateway};
use ailb_e2e::metrics::{busy_bed, preload};
use ailb_e2e::redis::Counts;
use ailb_fakepod::load::{self, HoldSpec, LoadConfig, SessionsSpec, SkewedSpec, Workload};
use ailb_testkit::wait_until;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The policy named on the command line (`metrics_based` is `endpoint_metrics`).
pub fn policy(name: &str) -> anyhow::Result<Policy> {
    let name = if name == "metrics_based" {
        "endpoint_metrics"
    } else {
        name
    };
    Policy::ALL
        .into_iter()
        .find(|p| p.name() == name)
        .ok_or_else(|| anyhow::anyhow!("unknown policy {name:?}: one of {}", names()))
}

/// Every policy's name, for usage lines.
pub fn names() -> String {
    Policy::ALL.map(Policy::name).join(", ")
}

/// A running bed: pods, Redis and one gateway with the policy's config.
pub struct Demo {
    pub policy: Policy,
    pub bed: Bed,
    pub gateway: Gateway,
    /// The services of a cluster policy (empty for the endpoint policies).
    pub services: Vec<Service>,
    pub config: Value,
    /// `--engine llama`: the real engines serving in place of the pods (real.rs).
    pub engines: Vec<ailb_e2e::llama::Engine>,
}

/// What the workload did.
#[derive(Default)]
pub struct Outcome {
    /// One summary line per workload phase.
    pub lines: Vec<String>,
    /// Requests per answering pod (`x-pod`) and per status.
    pub landed: BTreeMap<String, usize>,
    pub statuses: BTreeMap<u16, usize>,
    /// Redis counts sampled while long requests were in flight (global_least_request).
    pub in_flight: Option<Counts>,
    /// cluster_hash: the pods each `x-user` value landed on.
    pub users: BTreeMap<String, BTreeSet<String>>,
    /// Real engines: every turn with its usage (real.rs).
    pub replay: Option<ailb_e2e::conversations::Replay>,
}

const HASH_HEADER: &str = "x-user";
const SERVICE_NAMES: [&str; 3] = ["llm-fast", "llm-slow", "llm-flaky"];

fn redis_config(policy: &str, port: u16) -> Value {
    json!({"lb_policy": policy, "lb_config": {
        "serviceFQDN": "redis.static", "servicePort": port, "debugHeader": "x-ai-lb-debug"}})
}

impl Demo {
    pub fn start(policy: Policy) -> anyhow::Result<Demo> {
        let mut svcs = Vec::new();
        let (bed, config) = match policy {
            Policy::GlobalLeastRequest => {
                let bed = Bed::new(3, |c| {
                    c.max_running = 8;
                    c.decode_us_per_token = 5_000;
                    c.prefill_us_per_token = 20;
                });
                // The shipped example, pointed at this Redis.
                let example = ailb_e2e::repo_root().join("plugin-config/minimal.json");
                let mut config: Value = serde_json::from_slice(&std::fs::read(example)?)?;
                config["lb_config"]["servicePort"] = bed.redis.port.into();
                config["lb_config"]["debugHeader"] = "x-ai-lb-debug".into();
                (bed, config)
            }
            Policy::PrefixCache => {
                let bed = Bed::new(4, |c| {
                    c.max_running = 16;
                    c.decode_us_per_token = 2_000;
                    c.prefill_us_per_token = 100;
                });
                let config = redis_config("prefix_cache", bed.redis.port);
                (bed, config)
            }
            Policy::EndpointMetrics => {
                let config = json!({"lb_policy": "endpoint_metrics", "lb_config": {}});
                (busy_bed(), config)
            }
            Policy::ClusterMetrics => {
                let bed = Bed::new(6, |c| {
                    c.decode_us_per_token = 5_000;
                    c.prefill_us_per_token = 200;
                    slow_and_failing(c, 0.5, 11);
                });
                svcs = services(&SERVICE_NAMES, 2);
                let config = metrics_plugin(&svcs, "AdaptiveScore");
                (bed, config)
            }
            Policy::ClusterHash => {
                let bed = Bed::new(4, |c| c.decode_us_per_token = 2_000);
                svcs = services(&["llm-blue", "llm-green"], 2);
                let config = hash_plugin(HASH_HEADER, &[("llm-blue", 70), ("llm-green", 30)]);
                (bed, config)
            }
        };
        let mut spec = bed.spec("gw-1", Some(config.clone()));
        spec.log_level = "info".into();
        let gateway = match policy {
            Policy::ClusterMetrics | Policy::ClusterHash => {
                Gateway::start_config(&cluster_config(&bed, &spec, &svcs), &spec.id)?
            }
            Policy::EndpointMetrics => {
                // The emulator's active health check stores each pod's /metrics page in the
                // upstream host list, as Higress does (`metricsSource: host`).
                spec.health_check = Some(json!({"path": "/metrics", "interval_ms": 100,
                    "timeout_ms": 500, "unhealthy_threshold": 3, "healthy_threshold": 1,
                    "store_metrics": true}));
                Gateway::start(&spec)?
            }
            _ => Gateway::start(&spec)?,
        };
        Ok(Demo {
            policy,
            bed,
            gateway,
            services: svcs,
            config,
            engines: Vec::new(),
        })
    }

    pub fn run_workload(&self) -> anyhow::Result<Outcome> {
        let mut out = Outcome {
            lines: Vec::new(),
            landed: BTreeMap::new(),
            statuses: BTreeMap::new(),
            in_flight: None,
            users: BTreeMap::new(),
            replay: None,
        };
        let url = self.gateway.url.clone();
        match self.policy {
            Policy::GlobalLeastRequest => {
                // Long concurrent requests (sampled in Redis while they run), then skewed
                // open-loop traffic.
                let hold = LoadConfig::new(
                    vec![url.clone()],
                    Workload::Hold(HoldSpec {
                        concurrency: 12,
                        max_tokens: 100,
                        ..HoldSpec::default()
                    }),
                );
                let run = self.bed.rt.spawn(async move { load::run(&hold).await });
                wait_until(Duration::from_secs(5), || self.bed.counts().leases >= 12);
                out.in_flight = Some(self.bed.counts());
                let held = self.bed.rt.block_on(run)??;
                out.add("hold", &held);
                let skewed = LoadConfig::new(
                    vec![url],
                    Workload::Skewed(SkewedSpec {
                        arrivals: load::Arrivals::Count {
                            count: 60,
                            duration: Duration::from_secs(2),
                        },
                        ..SkewedSpec::default()
                    }),
                );
                out.add("skewed", &self.bed.rt.block_on(load::run(&skewed))?);
            }
            Policy::PrefixCache => {
                // Multi-turn chats under four shared system prompts: each conversation's
                // later turns find their prefix on the pod that served the earlier ones.
                let mut chats = LoadConfig::new(
                    vec![url],
                    Workload::Sessions(SessionsSpec {
                        sessions: 24,
                        rounds: 4,
                        new_tokens: 100,
                        concurrency: 8,
                        system_prompts: 4,
                        system_tokens: 600,
                        max_tokens: 16,
                    }),
                );
                chats.admin_urls = self.bed.pods.iter().map(|p| p.url()).collect();
                chats.reset_pods = true;
                out.add("chats", &self.bed.rt.block_on(load::run(&chats))?);
            }
            Policy::EndpointMetrics => {
                // pod-0 admits one request at a time: six long ones sent to it directly
                // queue there, and its /metrics says so.
                preload(&self.bed, 0, 6, 300);
                let gw = &self.gateway;
                wait_until(Duration::from_secs(5), || {
                    gw.stat("ai_lb.metrics.parsed") > 0
                });
                for i in 0..12 {
                    out.send(&url, &format!("short question {i}"), &[]);
                }
                out.lines.push(
                    "12 short requests while pod-0 has 5 queued (sent around the gateway)".into(),
                );
            }
            Policy::ClusterMetrics => {
                for i in 0..60 {
                    out.send(&url, &format!("question {i}"), &[]);
                }
                out.lines.push(
                    "60 requests; llm-slow is 3x slower to its first token, llm-flaky answers \
                     half with 500"
                        .into(),
                );
            }
            Policy::ClusterHash => {
                for user in 0..20 {
                    for turn in 0..3 {
                        let id = format!("user-{user}");
                        out.send(&url, &format!("turn {turn}"), &[(HASH_HEADER, &id)]);
                    }
                }
                out.send(&url, "no user header", &[]);
                out.lines.push(
                    "20 users x 3 requests with x-user (weights blue 70 / green 30), then one \
                     request without it (403)"
                        .into(),
                );
            }
        }
        Ok(out)
    }
}

impl Outcome {
    fn add(&mut self, name: &str, summary: &load::Summary) {
        self.lines.push(format!("{name:<8}: {}", summary.line()));
        for (pod, n) in &summary.per_pod {
            *self.landed.entry(pod.clone()).or_default() += n;
        }
        *self.statuses.entry(200).or_default() += summary.ok;
    }

    /// One chat request with `headers`, counted by answering pod and status.
    fn send(&mut self, url: &str, text: &str, headers: &[(&str, &str)]) {
        let mut h = vec![("content-type", "application/json")];
        h.extend_from_slice(headers);
        let body = ailb_e2e::bed::chat_body(text, 4);
        let (status, pod) = match http(url, "POST", "/v1/chat/completions", &h, &body) {
            Ok((s, hs, _)) => (
                s,
                hs.iter()
                    .find(|(k, _)| k == "x-pod")
                    .map(|(_, v)| v.clone())
                    .unwrap_or_else(|| "-".into()),
            ),
            Err(_) => (0, "-".into()),
        };
        *self.statuses.entry(status).or_default() += 1;
        if let Some((_, user)) = headers.iter().find(|(k, _)| *k == HASH_HEADER) {
            let pods = self.users.entry(user.to_string()).or_default();
            pods.insert(pod.clone());
        }
        *self.landed.entry(pod).or_default() += 1;
    }
}
