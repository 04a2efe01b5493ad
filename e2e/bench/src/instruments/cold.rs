//! Bench instrument: every VM entry starts with cold caches, as an idle worker's does, so how
//! much a callback costs cold can be measured one request at a time, and split. Off unless
//! `AILB_COLD_ENTRIES` is:
//!
//! - `all`: before each entry the worker writes a buffer far larger than its core's caches
//!   (evicting the plugin's compiled code, its linear memory and the host's own state);
//! - `code-warm`: the same, then it reads the plugin's compiled code back in;
//! - `memory-warm`: the same, then it reads the plugin's linear memory back in.
//!
//! The eviction happens before the entry's clock starts. `all` minus `code-warm` is what the
//! plugin's code being cold costs, `all` minus `memory-warm` what its data being cold costs;
//! what `all` keeps beyond both is the host's own cold state (docs/plugin-cpu.md).

use ailb_gateway::host_state::HostState;
use std::cell::RefCell;
use std::ops::Range;
use wasmtime::{Memory, StoreContext};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cold {
    Off,
    All,
    CodeWarm,
    MemoryWarm,
}

/// Far beyond this machine's per-core caches (4 MiB L2) and enough of its shared L3 to lose
/// what the last entry touched.
const EVICT_BYTES: usize = 96 << 20;

const LINE: usize = 64;

impl Cold {
    /// The mode `AILB_COLD_ENTRIES` names (`Off` for anything else).
    pub fn from_env() -> Cold {
        match std::env::var("AILB_COLD_ENTRIES").as_deref() {
            Ok("all") => Cold::All,
            Ok("code-warm") => Cold::CodeWarm,
            Ok("memory-warm") => Cold::MemoryWarm,
            _ => Cold::Off,
        }
    }
}

/// Called right before a VM entry: evicts, then warms what the mode keeps warm.
/// `code`: the module's compiled code (`Module::image_range`).
pub fn before_entry(
    mode: Cold,
    store: StoreContext<'_, HostState>,
    memory: Option<Memory>,
    code: &Range<usize>,
) {
    if mode == Cold::Off {
        return;
    }
    thread_local! {
        static EVICT: RefCell<Vec<u8>> = RefCell::new(vec![1; EVICT_BYTES]);
    }
    EVICT.with(|b| {
        let mut b = b.borrow_mut();
        for i in (0..b.len()).step_by(LINE) {
            b[i] = b[i].wrapping_add(1);
        }
        std::hint::black_box(&*b);
    });
    let mut sum = 0u64;
    match mode {
        Cold::CodeWarm => {
            for p in code.clone().step_by(LINE) {
                // SAFETY: `code` is the module's compiled image, mapped readable (and
                // executable) for as long as the module lives, which outlives its VMs.
                sum = sum.wrapping_add(unsafe { std::ptr::read_volatile(p as *const u8) } as u64);
            }
        }
        Cold::MemoryWarm => {
            if let Some(m) = memory {
                for b in m.data(store).iter().step_by(LINE) {
                    sum = sum.wrapping_add(*b as u64);
                }
            }
        }
        Cold::All | Cold::Off => {}
    }
    std::hint::black_box(sum);
}
