//! Which streams' response body chunks the balancer still reads (cluster_metrics, until its
//! first byte), kept where a chunk can check it without entering the context registry, and
//! without touching the plugin's memory at all.
//!
//! A streamed LLM answer arrives in one chunk per token or few, and the host calls the plugin
//! for every chunk of every stream. Reaching a stream's balancer touches the registry, the
//! balancer and its request map, cache lines an idle worker has lost; this watch answers
//! "certainly not" for almost every chunk from one 64-bit wasm global (src/wasm_global.rs),
//! bit `id % 64` set while a stream of that residue reads. Reading it touches no page of
//! linear memory, where the array it replaced put a page of memory in every chunk
//! (docs/plugin-cpu.md "Body chunks"). The counts behind the bits are in memory, touched only
//! when a stream starts or stops reading, on callbacks that enter the balancer anyway.
//!
//! Two streams in one slot only make a chunk of the one that no longer reads take the full
//! path, which finds that nothing is wanted. A slot's bit is never clear while a stream in it
//! reads, so no wanted chunk is skipped.

use crate::wasm_global;
use std::cell::{Cell, RefCell};

/// One per bit of the summary.
const SLOTS: usize = 64;

fn slot(id: u32) -> usize {
    id as usize % SLOTS
}

/// False only when stream `id` certainly does not read its response body. Reads the summary
/// global alone.
pub fn may_read(id: u32) -> bool {
    wasm_global::body_watch() & (1 << slot(id)) != 0
}

#[derive(Debug)]
pub struct BodyWatch {
    /// Streams that read their response body, per slot.
    counts: [Cell<u32>; SLOTS],
    /// Those streams, so each is counted once and uncounted once (a handful at a time).
    reading: RefCell<Vec<u32>>,
}

impl BodyWatch {
    pub const fn new() -> BodyWatch {
        BodyWatch {
            counts: [const { Cell::new(0) }; SLOTS],
            reading: RefCell::new(Vec::new()),
        }
    }

    /// Stream `id` reads its response body (`reads`) or no longer does (or ended).
    pub fn set(&self, id: u32, reads: bool) {
        let Ok(mut reading) = self.reading.try_borrow_mut() else {
            return;
        };
        let at = reading.iter().position(|&r| r == id);
        let Some(count) = self.counts.get(slot(id)) else {
            return;
        };
        match (reads, at) {
            (true, None) => {
                reading.push(id);
                count.set(count.get().saturating_add(1));
            }
            (false, Some(i)) => {
                reading.swap_remove(i);
                count.set(count.get().saturating_sub(1));
            }
            _ => return,
        }
        let bit = 1u64 << slot(id);
        let bits = wasm_global::body_watch();
        wasm_global::set_body_watch(match count.get() {
            0 => bits & !bit,
            _ => bits | bit,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_that_reads_is_never_skipped() {
        let w = BodyWatch::new();
        assert!(!may_read(7));
        w.set(7, true);
        w.set(7, true);
        assert!(may_read(7));
        w.set(7, false);
        assert!(!may_read(7));
        w.set(7, false);
        assert!(!may_read(7), "uncounting twice must not wrap");
    }

    #[test]
    fn each_slot_has_its_own_bit() {
        let w = BodyWatch::new();
        for id in [0, 63, 64 + 5] {
            w.set(id, true);
        }
        assert!(may_read(0) && may_read(63) && may_read(5));
        assert!(!may_read(1) && !may_read(62));
        w.set(63, false);
        assert!(!may_read(63) && may_read(0) && may_read(5));
        // The bits outlive a watch in tests run on one thread (`make wasm-unit-test`).
        w.set(0, false);
        w.set(64 + 5, false);
        assert!(!may_read(0) && !may_read(5));
    }

    #[test]
    fn streams_sharing_a_slot_keep_each_other_watched() {
        let w = BodyWatch::new();
        let (a, b) = (3, 3 + SLOTS as u32);
        w.set(a, true);
        w.set(b, true);
        w.set(b, false);
        assert!(may_read(a), "b's first byte must not unwatch a");
        // b's chunks now take the full path (a false positive), which is only slower.
        assert!(may_read(b));
        w.set(a, false);
        assert!(!may_read(a) && !may_read(b));
    }

    #[test]
    fn a_slot_stays_watched_until_its_last_reader_is_gone() {
        let w = BodyWatch::new();
        let ids: Vec<u32> = (0..1000).map(|i| 5 + i * SLOTS as u32).collect();
        for &id in &ids {
            w.set(id, true);
        }
        for &id in &ids[..999] {
            w.set(id, false);
            assert!(may_read(ids[999]));
        }
        w.set(ids[999], false);
        assert!(!may_read(ids[999]));
    }
}
