//! The streamed cluster section (`cluster-p99`): 2 gateways × 2 workers in front of 3
//! services (fake pods). llm-b is 3× slower to the first token, llm-c answers 20% of its
//! requests 500 (seeded). The same arrival sequence runs three ways side by side:
//! cluster_metrics AdaptiveScore; round robin (plugin off, the load generator names the
//! services in rotation); the oracle (plugin off, the load generator names the fastest healthy
//! service, llm-a). AdaptiveScore runs twice: as a user of this plugin configures it for 3 LLM
//! services (`p2c_choices: 3`, `inflight_capacity: 8` = 2 pods × 4 running; docs/configuration.md
//! "Cluster policies"), and with Higress's defaults and formula. For the plugin-CPU figures the same
//! arrivals also run through cluster_hash, the empty module (the host's floor) and two modules
//! making only a policy's host calls (cluster_hash's, AdaptiveScore's).

use crate::cluster::{gateways, naming, prof_breakdown, Chooser, Filter, NAMES, THIRDS};
use ailb_e2e::bed::Bed;
use ailb_e2e::cluster::{hash_plugin, metrics_plugin, service_of, services};
use ailb_e2e::gateway::Gateway;
use ailb_fakepod::load::{self, Arrivals, LoadConfig, SkewedSpec, Summary, Workload};
use ailb_fakepod::rng::Dist;
use std::time::Duration;

pub fn cluster_adaptive_vs_round_robin_and_oracle() -> anyhow::Result<()> {
    // 2 pods per service, 4 running each. Prompts ~200 tokens (40 ms of prefill), 8 output
    // tokens of 5 ms: llm-a answers its first token in ~45 ms, llm-b in ~135 ms.
    let bed = Bed::new(6, |c| {
        c.max_running = 4;
        c.prefill_us_per_token = 200;
        c.decode_us_per_token = 5_000;
        c.decode_batch_penalty = 0.0;
        ailb_e2e::cluster::slow_and_failing(c, 0.2, 9);
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
    // Two more rounds of the two runs the plugin-CPU figure is read from, the first with the
    // empty module first. One round's figure moves as much as the phase of this 2-core
    // machine between its runs, minutes apart; the median of three interleaved rounds is the
    // figure, and the worst round is printed beside it.
    let mut cpu_rounds = vec![CpuRound {
        adaptive: adaptive.vm,
        empty: empty.vm,
    }];
    for (round, order) in [(1, [1, 0]), (2, [0, 1])] {
        let mut vm = [None; 2];
        for which in order {
            let tag = format!("{}-r{round}", ["adaptive", "empty"][which]);
            let r = match which {
                0 => run(&tag, Filter::Plugin(tuned.clone()), |_| None)?,
                // As in the round above: the client names the service.
                _ => run(&tag, Filter::Empty, |i| naming(NAMES[i % 3]))?,
            };
            anyhow::ensure!(r.arrivals == adaptive.arrivals, "{tag}: other arrivals");
            vm[which] = Some(r.vm);
        }
        let [Some(adaptive), Some(empty)] = vm else {
            anyhow::bail!("round {round} missed a run");
        };
        cpu_rounds.push(CpuRound { adaptive, empty });
    }
    anyhow::ensure!(
        [
            &higress,
            &rr,
            &oracle,
            &hash,
            &empty,
            &calls,
            &adaptive_calls
        ]
        .iter()
        .all(|r| r.arrivals == adaptive.arrivals),
        "the eight runs must replay the same arrivals"
    );
    for (name, r) in [("adaptive", &adaptive), ("adaptive_higress", &higress)] {
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
    // answer chunk is one more VM entry, and at this rate every entry finds a cold cache.
    // Side by side: cluster_hash, a policy that keeps no statistics, and
    // the empty module, whose time is the host's alone (how each is read: `print_vm_figures`).
    for (i, r) in cpu_rounds.iter().enumerate() {
        eprintln!(
            "cluster cpu round {i}: floor {:.1} us, adaptive {:.1} over it",
            r.empty.us(),
            r.adaptive.us() - r.empty.us()
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

/// The two runs the plugin-CPU figure is read from, in one round.
struct CpuRound {
    adaptive: VmTotals,
    empty: VmTotals,
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

/// The streamed section's VM-time figures by `clock`: the floor and AdaptiveScore as the
/// median of `rounds` (AdaptiveScore's worst round beside them), the modules that ran once
/// over the first round's floor.
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
