//! The binary shared-data record of a config's statistics (docs/higress-cluster-policies.md
//! §6.1): fixed-width little-endian fields, so nothing is formatted or parsed as text.
//!
//! ```text
//! header   "acm", version u8, distinct services u32, names fingerprint u64, ring capacity u64
//! blocks   one per distinct service, in first-seen order, 92 bytes each (offsets in `at`)
//! samples  per service its TTFT then its total-latency samples, oldest first, f64 each
//! ```
//!
//! A record is accepted whole or not at all: right magic and version, the same services (by
//! fingerprint) and ring capacity, every ring length within the capacity and the byte count
//! exactly what the lengths make, flags and absent EWMAs as this codec writes them, EWMAs and
//! ring sums finite. Anything else is not ours, and the caller starts fresh. Each ring's
//! oldest-first sum is stored in its block, so no read ever re-adds samples; a non-finite
//! sample makes its ring's sum non-finite, so the finite-sum check also refuses those.
//!
//! [`Record`] is the request path's store: it checks a record once (header and blocks only),
//! keeping the blocks it decoded while checking, answers [`Table`] reads and changes from
//! those, and writes them back once; an update moves at most one ring's samples. Reads hand
//! out references, so a decision copies no block.

pub(super) mod layout;

use super::Table;
use super::{mean, oldest_first_sum, Counters, Latency};
use layout::{block_bytes_mut, ring_slot, Block, Shape, BLOCK_LEN, HEADER_LEN, SAMPLE_LEN};
use std::rc::Rc;

/// A record known to be ours (`ServiceTable::open`, table.rs), read and changed through [`Table`]:
/// its blocks decoded once, when opened, and written back once, by [`Record::into_bytes`];
/// its samples stay bytes, and a change moves at most one ring.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    shape: Rc<Shape>,
    ring_capacity: usize,
    /// One per service, as `bytes` will hold them.
    blocks: Vec<Block>,
    /// The record: header, blocks (stale until `into_bytes`), samples.
    bytes: Vec<u8>,
}

impl Record {
    /// A record of `shape`'s services whose `blocks` were decoded from `bytes` (or are what
    /// `bytes` holds).
    pub(super) fn of_parts(
        shape: Rc<Shape>,
        ring_capacity: usize,
        blocks: Vec<Block>,
        bytes: Vec<u8>,
    ) -> Record {
        Record {
            shape,
            ring_capacity,
            blocks,
            bytes,
        }
    }

    pub fn into_bytes(mut self) -> Vec<u8> {
        for (i, block) in self.blocks.iter().enumerate() {
            if let Some(b) = block_bytes_mut(&mut self.bytes, i) {
                block.write(b);
            }
        }
        self.bytes
    }

    /// Byte offset of the first sample of ring `slot` of service `index`.
    fn ring_start(&self, index: usize, slot: usize) -> Option<usize> {
        let mut samples = 0usize;
        for b in self.blocks.get(..index)? {
            samples = samples.checked_add(b.lens[0])?.checked_add(b.lens[1])?;
        }
        if slot == 1 {
            samples = samples.checked_add(self.blocks.get(index)?.lens[0])?;
        }
        let blocks = self.blocks.len().checked_mul(BLOCK_LEN)?;
        HEADER_LEN
            .checked_add(blocks)?
            .checked_add(samples.checked_mul(SAMPLE_LEN)?)
    }
}

impl Table for Record {
    fn names(&self) -> &[String] {
        &self.shape.names
    }

    fn list(&self) -> &[usize] {
        &self.shape.list
    }

    fn counters(&self, index: usize) -> Option<&Counters> {
        self.blocks.get(index).map(|b| &b.counters)
    }

    fn counters_mut(&mut self, index: usize) -> Option<&mut Counters> {
        self.blocks.get_mut(index).map(|b| &mut b.counters)
    }

    fn mean(&self, index: usize, which: Latency) -> f64 {
        let slot = ring_slot(which);
        self.blocks
            .get(index)
            .map_or(0.0, |b| mean(b.sums[slot], b.lens[slot]))
    }

    /// [`Ring::push`] on the bytes: a ring below capacity grows by one slot (the samples after
    /// it move up 8 bytes); a full one moves its samples down one slot over the oldest.
    fn push(&mut self, index: usize, which: Latency, sample: f64) {
        // A capacity of 0 keeps every ring empty (the modes that read no ring means): checked
        // first, so those modes never locate a ring.
        let capacity = self.ring_capacity;
        if capacity == 0 {
            return;
        }
        let slot = ring_slot(which);
        let Some(start) = self.ring_start(index, slot) else {
            return;
        };
        let Some(len) = self.blocks.get(index).map(|b| b.lens[slot]) else {
            return;
        };
        let end = start + len * SAMPLE_LEN;
        // A record from `open` always holds the whole ring.
        if end > self.bytes.len() {
            return;
        }
        let new_len = if len < capacity {
            let old = self.bytes.len();
            self.bytes.resize(old + SAMPLE_LEN, 0);
            self.bytes.copy_within(end..old, end + SAMPLE_LEN);
            len + 1
        } else {
            self.bytes.copy_within(start + SAMPLE_LEN..end, start);
            len
        };
        let last = start + (new_len - 1) * SAMPLE_LEN;
        if let Some(dst) = self
            .bytes
            .get_mut(last..)
            .and_then(|b| b.first_chunk_mut::<SAMPLE_LEN>())
        {
            *dst = sample.to_le_bytes();
        }
        let ring = self
            .bytes
            .get(start..start + new_len * SAMPLE_LEN)
            .unwrap_or_default();
        let sum = oldest_first_sum(ring.as_chunks::<SAMPLE_LEN>().0);
        if let Some(block) = self.blocks.get_mut(index) {
            block.sums[slot] = sum;
            block.lens[slot] = new_len;
        }
    }
}

#[cfg(test)]
mod tests;
