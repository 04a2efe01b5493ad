//! The one seam for bench instruments. The emulator the tests and `make run` start
//! (`ailb-gateway`) installs none: it carries no profiling switch and reads no environment
//! variable for one. `ailb-bench-gateway` (e2e/bench) installs its set before it starts
//! serving (the switches are listed in docs/test-bed.md "Profiling the emulator"). What is
//! left here is the call sites: one check of an unset `OnceLock` per VM entry and host call.

use crate::host_state::HostState;
use std::ops::Range;
use std::sync::OnceLock;
use std::time::Instant;
use wasmtime::{Memory, StoreContext};

/// What a bench binary may hook; every method does nothing by default.
pub trait Instruments: Send + Sync {
    /// Adjusts the engine before the plugin is compiled (e.g. a perf map for `perf`).
    fn engine_config(&self, _config: &mut wasmtime::Config) {}

    /// Right before a VM entry, outside its clocks (e.g. evicting the caches). `code` is the
    /// module's compiled image (`Module::image_range`).
    fn before_entry(
        &self,
        _store: StoreContext<'_, HostState>,
        _memory: Option<Memory>,
        _code: &Range<usize>,
    ) {
    }

    /// The calling thread's CPU clock in ns, read around each VM entry; `None`: not measured
    /// (`gateway.vm_call_cpu_ns` stays 0).
    fn thread_cpu_ns(&self) -> Option<u64> {
        None
    }

    /// Whether spans are timed: every VM entry by export name and every host call by name.
    fn spans(&self) -> bool {
        false
    }

    /// One timed span (only called when [`Instruments::spans`] says so).
    fn record(&self, _name: &'static str, _ns: u64) {}

    /// Lines appended to the admin `/stats` page (`name value`).
    fn stats_lines(&self) -> String {
        String::new()
    }
}

static INSTALLED: OnceLock<Box<dyn Instruments>> = OnceLock::new();

/// Installs the process's instruments, before any gateway starts; false if some already were.
pub fn install(instruments: Box<dyn Instruments>) -> bool {
    INSTALLED.set(instruments).is_ok()
}

/// The installed instruments, if any.
pub fn get() -> Option<&'static dyn Instruments> {
    INSTALLED.get().map(|b| &**b)
}

/// The installed instruments when they time spans.
fn spans() -> Option<&'static dyn Instruments> {
    get().filter(|i| i.spans())
}

/// Whether spans are timed (a caller measuring a span of its own, e.g. a Redis round trip).
pub fn timing() -> bool {
    spans().is_some()
}

/// Times the span from here to its drop under `name` (nothing without span instruments).
pub struct Span(Option<(&'static dyn Instruments, &'static str, Instant)>);

pub fn span(name: &'static str) -> Span {
    Span(spans().map(|i| (i, name, Instant::now())))
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some((i, name, at)) = self.0 {
            i.record(name, at.elapsed().as_nanos() as u64);
        }
    }
}

/// Records a span already measured (a VM entry's wall time).
pub fn record(name: &'static str, ns: u64) {
    if let Some(i) = spans() {
        i.record(name, ns);
    }
}
