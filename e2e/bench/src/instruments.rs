//! The emulator's profiling switches, all bench-only, installed into `ailb-bench-gateway`
//! through the emulator's one seam (`ailb_gateway::instrument`); the `ailb-gateway` the tests
//! and `make run` start has none. Each is read once, from the environment the bench passes
//! its gateways (docs/test-bed.md "Profiling the emulator", docs/plugin-cpu.md):
//!
//! - `AILB_PROF`: call counts and wall ns per export and host call on `/stats` ([`prof`]);
//! - `AILB_COLD_ENTRIES=all|code-warm|memory-warm`: every VM entry finds cold caches ([`cold`]);
//! - `AILB_VM_CPU_TIME`: the workers' CPU time in VM calls, `gateway.vm_call_cpu_ns`
//!   ([`cpu_clock`]);
//! - `AILB_PERFMAP`: /tmp/perf-<pid>.map, so `perf report` names the plugin's compiled
//!   functions.

pub mod cold;
pub mod cpu_clock;
pub mod prof;

use ailb_gateway::host_state::HostState;
use ailb_gateway::instrument::Instruments;
use cold::Cold;
use std::ops::Range;
use wasmtime::{Memory, StoreContext};

/// The switches as the environment sets them.
pub struct FromEnv {
    prof: bool,
    cold: Cold,
    cpu_time: bool,
    perf_map: bool,
}

impl FromEnv {
    pub fn read() -> FromEnv {
        let on = |name: &str| std::env::var_os(name).is_some();
        FromEnv {
            prof: on("AILB_PROF"),
            cold: Cold::from_env(),
            cpu_time: on("AILB_VM_CPU_TIME"),
            perf_map: on("AILB_PERFMAP"),
        }
    }
}

impl Instruments for FromEnv {
    fn engine_config(&self, config: &mut wasmtime::Config) {
        if self.perf_map {
            // A map left by an earlier process of this pid would mix in stale addresses.
            let _ = std::fs::remove_file(format!("/tmp/perf-{}.map", std::process::id()));
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
    }

    fn before_entry(
        &self,
        store: StoreContext<'_, HostState>,
        memory: Option<Memory>,
        code: &Range<usize>,
    ) {
        cold::before_entry(self.cold, store, memory, code);
    }

    fn thread_cpu_ns(&self) -> Option<u64> {
        if self.cpu_time {
            cpu_clock::thread_ns()
        } else {
            None
        }
    }

    fn spans(&self) -> bool {
        self.prof
    }

    fn record(&self, name: &'static str, ns: u64) {
        prof::record(name, ns);
    }

    fn stats_lines(&self) -> String {
        prof::lines()
    }
}
