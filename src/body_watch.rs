//! Which streams' response body chunks the balancer still reads (cluster_metrics, until its
//! first byte), kept where a chunk can check it without entering the context registry.
//!
//! A streamed LLM answer arrives in one chunk per token or few, and the host calls the plugin
//! for every chunk of every stream. Reaching a stream's balancer touches the registry, the
//! balancer and its request map, cache lines an idle worker has lost; this watch answers
//! "certainly not" for almost every chunk from one small array. Measured in the cluster
//! benchmark's streamed run (`make bench`, `plugin_us_per_request_cluster_hash_streamed`, about
//! 9 chunks per answer): 86 µs per request before, 77 after, about 1 µs per chunk, which a
//! long answer pays hundreds of times.
//!
//! Streams are counted by context id modulo [`SLOTS`]: two streams in one slot only make a
//! chunk of the one that no longer reads take the full path, which finds that nothing is
//! wanted. A slot is never zero while a stream in it reads, so no wanted chunk is skipped.

use std::cell::{Cell, RefCell};

const SLOTS: usize = 256;

#[derive(Debug)]
pub struct BodyWatch {
    /// Streams that read their response body, per slot.
    slots: [Cell<u32>; SLOTS],
    /// Those streams, so each is counted once and uncounted once (a handful at a time).
    reading: RefCell<Vec<u32>>,
}

impl Default for BodyWatch {
    fn default() -> Self {
        BodyWatch {
            slots: std::array::from_fn(|_| Cell::new(0)),
            reading: RefCell::new(Vec::new()),
        }
    }
}

impl BodyWatch {
    fn slot(&self, id: u32) -> &Cell<u32> {
        &self.slots[id as usize % SLOTS]
    }

    /// False only when stream `id` certainly does not read its response body.
    pub fn may_read(&self, id: u32) -> bool {
        self.slot(id).get() > 0
    }

    /// Stream `id` reads its response body (`reads`) or no longer does (or ended).
    pub fn set(&self, id: u32, reads: bool) {
        let Ok(mut reading) = self.reading.try_borrow_mut() else {
            return;
        };
        let at = reading.iter().position(|&r| r == id);
        let slot = self.slot(id);
        match (reads, at) {
            (true, None) => {
                reading.push(id);
                slot.set(slot.get().saturating_add(1));
            }
            (false, Some(i)) => {
                reading.swap_remove(i);
                slot.set(slot.get().saturating_sub(1));
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_that_reads_is_never_skipped() {
        let w = BodyWatch::default();
        assert!(!w.may_read(7));
        w.set(7, true);
        w.set(7, true);
        assert!(w.may_read(7));
        w.set(7, false);
        assert!(!w.may_read(7));
        w.set(7, false);
        assert!(!w.may_read(7), "uncounting twice must not wrap");
    }

    #[test]
    fn streams_sharing_a_slot_keep_each_other_watched() {
        let w = BodyWatch::default();
        let (a, b) = (3, 3 + SLOTS as u32);
        w.set(a, true);
        w.set(b, true);
        w.set(b, false);
        assert!(w.may_read(a), "b's first byte must not unwatch a");
        // b's chunks now take the full path (a false positive), which is only slower.
        assert!(w.may_read(b));
        w.set(a, false);
        assert!(!w.may_read(a) && !w.may_read(b));
    }

    #[test]
    fn a_slot_stays_watched_until_its_last_reader_is_gone() {
        let w = BodyWatch::default();
        let ids: Vec<u32> = (0..1000).map(|i| 5 + i * SLOTS as u32).collect();
        for &id in &ids {
            w.set(id, true);
        }
        for &id in &ids[..999] {
            w.set(id, false);
            assert!(w.may_read(ids[999]));
        }
        w.set(ids[999], false);
        assert!(!w.may_read(ids[999]));
    }
}
