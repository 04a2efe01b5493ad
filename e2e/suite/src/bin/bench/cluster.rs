//! Cluster-level balancing (`lb_type: cluster`): 3 services as 3 clusters behind one route that
//! follows `x-higress-target-cluster`, 2 gateways × 2 workers, fake pods. llm-b is 3× slower
//! to the first token, llm-c answers 20% of its requests 500 (seeded). The same arrival
//! sequence runs three ways side by side: cluster_metrics AdaptiveScore; round robin (plugin
//! off, the load generator names the services in rotation); the oracle (plugin off, the load
//! generator names the fastest healthy service, llm-a). AdaptiveScore runs twice: as a user of
//! this plugin configures it for 3 LLM services (`p2c_choices: 3`, `inflight_capacity: 8` =
//! 2 pods × 4 running; README "Cluster policies"), and with Higress's defaults and formula.
//! For the plugin-CPU figures the same arrivals also run through cluster_hash, the empty
//! module (the host's floor), two modules making only a policy's host calls (cluster_hash's,
//! AdaptiveScore's), and the least Rust AdaptiveScore (e2e/compact-adaptive): the figure a
//! compact AdaptiveScore reaches in this run.

use crate::common::{chat10, vm_us_per_request, vm_us_per_request_by, vm_us_per_request_loaded};
use ailb_core::cluster::hash::SlotTable;
use ailb_e2e::bed::{chat_body, Bed};
use ailb_e2e::cluster::{
    cluster_config, hash_plugin, metrics_plugin, service_of, services, Service, TARGET_HEADER,
};
use ailb_e2e::compact_adaptive_wasm;
use ailb_e2e::empty_plugin::{adaptive_host_calls_wasm, empty_wasm, host_calls_wasm};
use ailb_e2e::gateway::{http, Gateway};
use ailb_fakepod::load::{self, Arrivals, LoadConfig, SkewedSpec, Summary, Workload};
use ailb_fakepod::rng::Dist;
use serde_json::{json, Value};
use std::time::Duration;

pub const NAMES: [&str; 3] = ["llm-a", "llm-b", "llm-c"];

/// cluster_hash weights splitting the three services evenly (Higress's 100 slots).
pub const THIRDS: [(&str, i64); 3] = [(NAMES[0], 34), (NAMES[1], 33), (NAMES[2], 33)];

/// What the gateways' wasm filter runs.
enum Filter {
    /// No filter.
    None,
    /// The plugin with this config.
    Plugin(Value),
    /// A module whose callbacks do nothing (`empty_plugin`): the host's share of any plugin.
    Empty,
    /// A module making cluster_hash's request-header host calls and nothing else.
    HostCalls,
    /// A module making AdaptiveScore's host calls over the request and nothing else.
    AdaptiveHostCalls,
    /// The least Rust AdaptiveScore (e2e/compact-adaptive): those calls and the arithmetic.
    Compact,
}

/// 2 gateways (2 workers each) over `svcs`, running `filter`.
fn gateways(
    bed: &Bed,
    svcs: &[Service],
    tag: &str,
    filter: &Filter,
) -> anyhow::Result<Vec<Gateway>> {
    (0..2)
        .map(|i| gateway(bed, svcs, &format!("{tag}-{i}"), filter, &[]))
        .collect()
}

/// One gateway over `svcs` running `filter`, its emulator given `env`.
fn gateway(
    bed: &Bed,
    svcs: &[Service],
    tag: &str,
    filter: &Filter,
    env: &[(&str, &str)],
) -> anyhow::Result<Gateway> {
    let config = match filter {
        Filter::Plugin(v) => Some(v.clone()),
        Filter::None
        | Filter::Empty
        | Filter::HostCalls
        | Filter::AdaptiveHostCalls
        | Filter::Compact => None,
    };
    let mut spec = bed.spec(tag, config);
    match filter {
        Filter::Empty => spec.plugin = Some((empty_wasm()?, json!({}))),
        Filter::HostCalls => spec.plugin = Some((host_calls_wasm()?, json!({}))),
        Filter::AdaptiveHostCalls => spec.plugin = Some((adaptive_host_calls_wasm()?, json!({}))),
        Filter::Compact => spec.plugin = Some((compact_adaptive_wasm()?, json!({}))),
        Filter::None | Filter::Plugin(_) => {}
    }
    Gateway::start_config_env(&cluster_config(bed, &spec, svcs), &spec.id, env)
}

/// The header the client adds to request `i`, if any: the service it names (round robin, the
/// oracle) or a key for the plugin to hash.
type Chooser = fn(usize) -> Option<(&'static str, String)>;

/// Names service `s` in the route's cluster header.
fn naming(s: &str) -> Option<(&'static str, String)> {
    Some((TARGET_HEADER, s.to_string()))
}

pub fn cluster_adaptive_vs_round_robin_and_oracle() -> anyhow::Result<()> {
    // The last run's module must be built: say so before the first run, not after eight.
    compact_adaptive_wasm()?;
    // 2 pods per service, 4 running each. Prompts ~200 tokens (40 ms of prefill), 8 output
    // tokens of 5 ms: llm-a answers its first token in ~45 ms, llm-b in ~135 ms.
    let bed = Bed::new(6, |c| {
        c.max_running = 4;
        c.prefill_us_per_token = 200;
        c.decode_us_per_token = 5_000;
        c.decode_batch_penalty = 0.0;
        match c.name.as_str() {
            "pod-2" | "pod-3" => c.ttft_multiplier = 3.0,
            "pod-4" | "pod-5" => {
                c.error_rate = 0.2;
                c.fault_seed = 9;
            }
            _ => {}
        }
    });
    let svcs = services(&NAMES, 2);
    // 440 streamed requests in 20 s (Poisson): 22 rps, well within llm-a's capacity alone
    // (8 running, ~85 ms each). The whole section stays under 2 minutes.
    let workload = || {
        let mut s = SkewedSpec {
            arrivals: Arrivals::Count {
                count: 440,
                duration: Duration::from_secs(20),
            },
            stream: true,
            ..SkewedSpec::default()
        };
        s.prompt_tokens.dist = Dist::LogNormal {
            median: 200.0,
            sigma: 0.3,
        };
        s.prompt_tokens.max = 600;
        s.max_tokens.dist = Dist::Fixed(8);
        s
    };
    let run = |tag: &str, filter: Filter, choose: Chooser| -> anyhow::Result<Run> {
        let gws = gateways(&bed, &svcs, tag, &filter)?;
        let mut lc = LoadConfig::new(
            gws.iter().map(|g| g.url.clone()).collect(),
            Workload::Skewed(workload()),
        );
        lc.seed = 17;
        lc.timeout = Duration::from_secs(60);
        lc.admin_urls = bed.pods.iter().map(|p| p.url()).collect();
        lc.reset_pods = true;
        let mut plan = load::plan(&lc);
        // The arrivals themselves, before any routing header: equal in every run.
        let arrivals = plan.fingerprint();
        for r in &mut plan.requests {
            if let Some((name, value)) = choose(r.index) {
                r.headers.push((name.into(), value));
            }
        }
        let before = vm_totals(&gws);
        let s = bed.rt.block_on(load::run_plan(&lc, &plan))?;
        eprintln!("cluster {tag}: {}", s.line());
        let vm = vm_totals(&gws).since(before);
        if std::env::var_os("AILB_PROF").is_some() {
            prof_breakdown(&gws[0], tag);
        }
        Ok(Run { s, arrivals, vm })
    };
    let mut tuned = metrics_plugin(&svcs, "AdaptiveScore");
    tuned["lb_config"]["p2c_choices"] = 3.into();
    tuned["lb_config"]["inflight_capacity"] = 8.into();
    let adaptive = run("adaptive", Filter::Plugin(tuned.clone()), |_| None)?;
    let higress = run(
        "adaptive-higress",
        Filter::Plugin(metrics_plugin(&svcs, "AdaptiveScore")),
        |_| None,
    )?;
    let rr = run("round-robin", Filter::None, |i| naming(NAMES[i % 3]))?;
    let oracle = run("oracle", Filter::None, |_| naming(NAMES[0]))?;
    // Beside adaptive, a policy that keeps no statistics and reads no answer: cluster_hash
    // over a per-request user header.
    let hash = run(
        "hash",
        Filter::Plugin(hash_plugin("x-user", &THIRDS)),
        |i| Some(("x-user", format!("user-{i}"))),
    )?;
    // And the host's floor: a module whose callbacks do nothing; the client names the service.
    let empty = run("empty", Filter::Empty, |i| naming(NAMES[i % 3]))?;
    // And cluster_hash's host calls alone (the module names llm-a itself): what they cost a
    // cold host, apart from the plugin's own code.
    let calls = run("host-calls", Filter::HostCalls, |i| {
        Some(("x-user", format!("user-{i}")))
    })?;
    // And AdaptiveScore's host calls alone (the module names llm-a itself and leaves the
    // statistics record as it found it): the least any AdaptiveScore sharing its statistics
    // through shared data costs the host here.
    let adaptive_calls = run("adaptive-host-calls", Filter::AdaptiveHostCalls, |_| None)?;
    // And those calls with a decision made from the record and the answer folded back in: the
    // least Rust AdaptiveScore (e2e/compact-adaptive, which says what it leaves out).
    let compact = run("compact-adaptive", Filter::Compact, |_| None)?;
    // Two more rounds of the three runs the plugin-CPU figure is read from, each in another
    // order (a Latin square with the round above: adaptive, empty, compact). One round's
    // figure moves as much as the phase of this 2-core machine between its runs, minutes
    // apart (docs/plugin-cpu.md "Where it stands"); the median of three interleaved rounds
    // is the figure, and the worst round is printed beside it.
    let mut cpu_rounds = vec![CpuRound {
        adaptive: adaptive.vm,
        empty: empty.vm,
        compact: compact.vm,
    }];
    for (round, order) in [(1, [1, 2, 0]), (2, [2, 0, 1])] {
        let mut vm = [None; 3];
        for which in order {
            let tag = format!(
                "{}-r{round}",
                ["adaptive", "empty", "compact-adaptive"][which]
            );
            let r = match which {
                0 => run(&tag, Filter::Plugin(tuned.clone()), |_| None)?,
                // As in the round above: the client names the service.
                1 => run(&tag, Filter::Empty, |i| naming(NAMES[i % 3]))?,
                _ => run(&tag, Filter::Compact, |_| None)?,
            };
            anyhow::ensure!(r.arrivals == adaptive.arrivals, "{tag}: other arrivals");
            vm[which] = Some(r.vm);
        }
        let [Some(adaptive), Some(empty), Some(compact)] = vm else {
            anyhow::bail!("round {round} missed a run");
        };
        cpu_rounds.push(CpuRound {
            adaptive,
            empty,
            compact,
        });
    }
    anyhow::ensure!(
        [
            &higress,
            &rr,
            &oracle,
            &hash,
            &empty,
            &calls,
            &adaptive_calls,
            &compact
        ]
        .iter()
        .all(|r| r.arrivals == adaptive.arrivals),
        "the nine runs must replay the same arrivals"
    );
    for (name, r) in [
        ("adaptive", &adaptive),
        ("adaptive_higress", &higress),
        ("adaptive_compact_reference", &compact),
    ] {
        let s = &r.s;
        println!(
            "BENCH cluster_ttft_p99_ratio_{name}_vs_round_robin {:.2} ratio",
            s.ttft_ms.p99 / rr.s.ttft_ms.p99
        );
        println!(
            "BENCH cluster_ttft_p99_ratio_{name}_vs_oracle {:.2} ratio",
            s.ttft_ms.p99 / oracle.s.ttft_ms.p99
        );
        let on_failing: usize = s
            .per_pod
            .iter()
            .filter(|(pod, _)| service_of(&svcs, pod) == Some(NAMES[2]))
            .map(|(_, n)| n)
            .sum();
        println!(
            "BENCH cluster_error_share_{name} {:.3} ratio",
            on_failing as f64 / s.count.max(1) as f64
        );
    }
    // The plugin's VM time in these very runs (streamed answers, 22 rps over 4 workers): each
    // answer chunk is one more VM entry, and at this rate every entry finds a cold cache
    // (docs/plugin-cpu.md). Side by side: cluster_hash, a policy that keeps no statistics, and
    // the empty module, whose time is the host's alone (how each is read: `print_vm_figures`).
    for (i, r) in cpu_rounds.iter().enumerate() {
        eprintln!(
            "cluster cpu round {i}: floor {:.1} us, adaptive {:.1} over it, compact {:.1}",
            r.empty.us(),
            r.adaptive.us() - r.empty.us(),
            r.compact.us() - r.empty.us()
        );
    }
    let once = RunOnce {
        hash_calls: calls.vm,
        adaptive_calls: adaptive_calls.vm,
        hash: hash.vm,
    };
    print_vm_figures(Clock::Wall, &cpu_rounds, &once);
    for (name, vm) in [("adaptive", &adaptive.vm), ("hash", &hash.vm)] {
        println!(
            "BENCH vm_entries_per_request_cluster_{name}_streamed {:.1} count",
            vm.per_request(vm.calls)
        );
    }
    if empty.vm.cpu_ns > 0 {
        print_vm_figures(Clock::Cpu, &cpu_rounds, &once);
    }
    Ok(())
}

/// One run of the section: what the load generator saw, its arrivals' fingerprint, and the
/// gateways' VM totals over it.
struct Run {
    s: Summary,
    arrivals: String,
    vm: VmTotals,
}

/// The three runs the plugin-CPU figure is read from, in one round.
struct CpuRound {
    adaptive: VmTotals,
    empty: VmTotals,
    compact: VmTotals,
}

/// The modules of the streamed section that run once, read over the first round's floor.
struct RunOnce {
    hash_calls: VmTotals,
    adaptive_calls: VmTotals,
    hash: VmTotals,
}

/// The clock a VM-time figure reads: the wall clock, or the workers' CPU clock
/// (`AILB_VM_CPU_TIME`), whose lines are the wall lines' `_cpu` twins.
#[derive(Clone, Copy)]
enum Clock {
    Wall,
    Cpu,
}

impl Clock {
    fn us(self, vm: &VmTotals) -> f64 {
        match self {
            Clock::Wall => vm.us(),
            Clock::Cpu => vm.cpu_us(),
        }
    }
}

/// The streamed section's VM-time figures by `clock`: the floor, AdaptiveScore and the
/// compact module as the median of `rounds` (AdaptiveScore's worst round beside them), the
/// modules that ran once over the first round's floor.
fn print_vm_figures(clock: Clock, rounds: &[CpuRound], once: &RunOnce) {
    let (vm, plugin) = match clock {
        Clock::Wall => ("vm", "plugin"),
        Clock::Cpu => ("vm_cpu", "plugin_cpu"),
    };
    let us = |v: &VmTotals| clock.us(v);
    let over = |v: &VmTotals, floor: &VmTotals| us(v) - us(floor);
    let of_rounds = |f: &dyn Fn(&CpuRound) -> f64| rounds.iter().map(f).collect::<Vec<f64>>();
    let floor0 = rounds.first().map_or(0.0, |r| us(&r.empty));
    let line = |name: String, v: f64| println!("BENCH {name} {v:.1} us");
    line(
        format!("{vm}_floor_us_per_request_empty_module_streamed"),
        median(of_rounds(&|r| us(&r.empty))),
    );
    for (name, v) in [
        ("cluster_hash_host_calls", &once.hash_calls),
        ("cluster_adaptive_host_calls", &once.adaptive_calls),
    ] {
        line(
            format!("{vm}_us_per_request_{name}_streamed_over_floor"),
            us(v) - floor0,
        );
    }
    line(
        format!("{vm}_us_per_request_cluster_adaptive_compact_reference_streamed_over_floor"),
        median(of_rounds(&|r| over(&r.compact, &r.empty))),
    );
    let adaptive = format!("{plugin}_us_per_request_cluster_adaptive_streamed");
    line(adaptive.clone(), median(of_rounds(&|r| us(&r.adaptive))));
    let over_floor = of_rounds(&|r| over(&r.adaptive, &r.empty));
    let worst = over_floor.iter().copied().fold(f64::MIN, f64::max);
    line(format!("{adaptive}_over_floor"), median(over_floor));
    line(format!("{adaptive}_over_floor_worst_round"), worst);
    let hash = format!("{plugin}_us_per_request_cluster_hash_streamed");
    line(hash.clone(), us(&once.hash));
    line(format!("{hash}_over_floor"), us(&once.hash) - floor0);
}

/// The middle value (the mean of the middle two for an even count); 0 for none.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// VM time, VM entries and destroyed streams, summed over gateways.
#[derive(Clone, Copy)]
struct VmTotals {
    ns: i64,
    /// The workers' CPU time in those calls; 0 unless the emulator measures it
    /// (`AILB_VM_CPU_TIME`).
    cpu_ns: i64,
    calls: i64,
    streams: i64,
}

impl VmTotals {
    /// `total` per destroyed stream.
    fn per_request(&self, total: i64) -> f64 {
        total as f64 / self.streams.max(1) as f64
    }

    /// VM time per request, µs.
    fn us(&self) -> f64 {
        self.per_request(self.ns) / 1e3
    }

    /// The workers' CPU time in the VM per request, µs.
    fn cpu_us(&self) -> f64 {
        self.per_request(self.cpu_ns) / 1e3
    }

    fn since(self, before: VmTotals) -> VmTotals {
        VmTotals {
            ns: self.ns - before.ns,
            cpu_ns: self.cpu_ns - before.cpu_ns,
            calls: self.calls - before.calls,
            streams: self.streams - before.streams,
        }
    }
}

fn vm_totals(gws: &[Gateway]) -> VmTotals {
    let sum = |name: &str| gws.iter().map(|g| g.stat(name)).sum();
    VmTotals {
        ns: sum("gateway.vm_call_ns"),
        cpu_ns: sum("gateway.vm_call_cpu_ns"),
        calls: sum("gateway.vm_calls"),
        streams: sum("gateway.streams_destroyed"),
    }
}

/// Higress's cluster_hash, written here from its description (docs/higress-cluster-policies.md
/// §2) and independent of the plugin's code: FNV-1a 32 over the header value, `mod 100`, into
/// 100 slots filled entry by entry, each `weight` times.
fn higress_cluster<'a>(entries: &[(&'a str, i64)], value: &[u8]) -> &'a str {
    let mut h: u32 = 0x811c_9dc5;
    for b in value {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    let slots: Vec<&str> = entries
        .iter()
        .flat_map(|(c, w)| std::iter::repeat_n(*c, *w as usize))
        .collect();
    slots[(h % 100) as usize]
}

/// 10k header values through 2 gateways running cluster_hash: the service each landed on vs
/// the independent implementation above (and `ailb_core::cluster::hash` vs it, as a check).
pub fn cluster_hash_slot_agreement() -> anyhow::Result<()> {
    let bed = Bed::new(3, |c| {
        c.decode_us_per_token = 100;
        c.prefill_us_per_token = 1;
    });
    let svcs = services(&NAMES, 1);
    let entries = [(NAMES[0], 17), (NAMES[1], 33), (NAMES[2], 50)];
    let gws = gateways(
        &bed,
        &svcs,
        "hash",
        &Filter::Plugin(hash_plugin("x-user", &entries)),
    )?;
    let urls: Vec<String> = gws.iter().map(|g| g.url.clone()).collect();
    let table = SlotTable::build(&entries).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let values: Vec<String> = (0..10_000u64)
        .map(|i| format!("consumer-{i}-{:x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
        .collect();
    let core_agrees = values
        .iter()
        .filter(|v| table.pick(v.as_bytes()) == Some(higress_cluster(&entries, v.as_bytes())))
        .count();
    let threads = 8;
    let agree: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (values, urls, svcs, entries) = (&values, &urls, &svcs, &entries);
                s.spawn(move || {
                    let mut agree = 0;
                    for (i, v) in values.iter().enumerate().skip(t).step_by(threads) {
                        let landed = http(
                            &urls[i % urls.len()],
                            "POST",
                            "/v1/chat/completions",
                            &[("content-type", "application/json"), ("x-user", v)],
                            &chat_body("hi", 1),
                        )
                        .ok()
                        .and_then(|(status, hs, _)| {
                            let pod = hs.into_iter().find(|(k, _)| k == "x-pod")?.1;
                            (status == 200).then(|| service_of(svcs, &pod).map(str::to_string))?
                        });
                        if landed.as_deref() == Some(higress_cluster(entries, v.as_bytes())) {
                            agree += 1;
                        }
                    }
                    agree
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    });
    eprintln!(
        "cluster_hash: ailb_core slots agree with the bench's Higress algorithm on {core_agrees} of {}",
        values.len()
    );
    println!(
        "BENCH cluster_hash_slot_agreement {:.4} ratio",
        agree as f64 / values.len() as f64
    );
    Ok(())
}

/// Plugin CPU per request for AdaptiveScore: the emulator's VM time over the 10-turn chat on
/// one gateway in front of 3 healthy services; beside it, in the same run, `cluster_hash` over
/// the same services (a decision with no statistics: the floor of a cluster policy). The goal
/// figure sends one request at a time; `_loaded_8_clients` sends the same chat from 8 clients
/// at once. On this 2-core machine the first differs from the second by how cold the caches
/// are when an idle worker wakes up, not by what the plugin does (docs/plugin-cpu.md).
pub fn cluster_plugin_cpu() -> anyhow::Result<()> {
    let bed = Bed::new(3, |c| {
        c.decode_us_per_token = 100;
        c.prefill_us_per_token = 1;
    });
    let svcs = services(&NAMES, 1);
    for (name, plugin) in [
        ("adaptive", metrics_plugin(&svcs, "AdaptiveScore")),
        // post_chat10 always sends content-type, so every request has the hash header.
        ("hash", hash_plugin("content-type", &THIRDS)),
    ] {
        let spec = bed.spec(&format!("cpu-{name}"), Some(plugin));
        let gw = Gateway::start_config(&cluster_config(&bed, &spec, &svcs), &spec.id)?;
        let us = vm_us_per_request(&gw, 50, 500)?;
        println!("BENCH plugin_us_per_request_cluster_{name} {us:.1} us");
        let loaded = vm_us_per_request_loaded(&gw, 8, 800)?;
        println!("BENCH plugin_us_per_request_cluster_{name}_loaded_8_clients {loaded:.1} us");
        if std::env::var_os("AILB_PROF").is_some() {
            prof_breakdown(&gw, name);
        }
    }
    Ok(())
}

/// The plugin's VM time per request when every VM entry finds cold caches, as an idle
/// worker's does (the emulator's `AILB_COLD_ENTRIES`, docs/plugin-cpu.md): the 10-turn chat,
/// one request at a time, to AdaptiveScore and cluster_hash as in [`cluster_plugin_cpu`],
/// beside the empty module (the host's share of a cold entry). Each plugin runs again with its
/// compiled code read back in before every entry, then with its linear memory: what the cold
/// figure owes to the plugin's code, and what to its data.
pub fn cluster_plugin_cpu_cold() -> anyhow::Result<()> {
    let bed = Bed::new(3, |c| {
        c.decode_us_per_token = 100;
        c.prefill_us_per_token = 1;
    });
    let svcs = services(&NAMES, 1);
    // Each entry first writes 96 MiB: a request costs tens of ms, so fewer of them.
    let (warm, n) = (10, 100);
    let start = |tag: &str, filter: &Filter, mode: &str| {
        let env = [("AILB_COLD_ENTRIES", mode)];
        gateway(&bed, &svcs, &format!("cold-{tag}-{mode}"), filter, &env)
    };
    let empty = start("empty", &Filter::Empty, "all")?;
    // The empty module routes nothing: the client names the service.
    let floor = vm_us_per_request_by(&empty, warm, n, || {
        let headers = [
            ("content-type", "application/json"),
            (TARGET_HEADER, NAMES[0]),
        ];
        let (status, _, _) = http(
            &empty.url,
            "POST",
            "/v1/chat/completions",
            &headers,
            &chat10(),
        )?;
        anyhow::ensure!(status == 200, "status {status}");
        Ok(())
    })?;
    drop(empty);
    println!("BENCH vm_floor_us_per_request_empty_module_cold_entries {floor:.1} us");
    for (name, plugin) in [
        ("adaptive", metrics_plugin(&svcs, "AdaptiveScore")),
        ("hash", hash_plugin("content-type", &THIRDS)),
    ] {
        let plugin = Filter::Plugin(plugin);
        let mut us = Vec::new();
        for mode in ["all", "code-warm", "memory-warm"] {
            let gw = start(name, &plugin, mode)?;
            us.push(vm_us_per_request(&gw, warm, n)?);
            if mode == "all" && std::env::var_os("AILB_PROF").is_some() {
                prof_breakdown(&gw, &format!("{name}-cold"));
            }
        }
        let [all, code_warm, memory_warm] = us[..] else {
            anyhow::bail!("three modes ran");
        };
        println!("BENCH plugin_us_per_request_cluster_{name}_cold_entries {all:.1} us");
        println!(
            "BENCH plugin_us_per_request_cluster_{name}_cold_entries_code_warm {code_warm:.1} us"
        );
        println!(
            "BENCH plugin_us_per_request_cluster_{name}_cold_entries_memory_warm {memory_warm:.1} us"
        );
    }
    Ok(())
}

/// Per request over the gateway's whole life (warm-up included): calls and µs of every export
/// and host call (`prof.*` in the emulator's `/stats`), for finding where the VM time goes.
fn prof_breakdown(gw: &Gateway, name: &str) {
    let stats = gw.stats();
    let streams = stats
        .get("gateway.streams_destroyed")
        .copied()
        .unwrap_or(0)
        .max(1) as f64;
    for (k, calls) in &stats {
        let Some(what) = k
            .strip_prefix("prof.")
            .and_then(|k| k.strip_suffix(".calls"))
        else {
            continue;
        };
        let ns = stats.get(&format!("prof.{what}.ns")).copied().unwrap_or(0) as f64;
        eprintln!(
            "PROF {name} {what:<40} {:>6.2} calls/req {:>7.2} us/req {:>6.2} us/call",
            *calls as f64 / streams,
            ns / streams / 1e3,
            ns / (*calls).max(1) as f64 / 1e3
        );
    }
}
