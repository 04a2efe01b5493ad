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

mod layout;

use super::Table;
use super::{mean, oldest_first_sum, Counters, Latency, Ring, ServiceStats, ServiceTable, Shape};
use layout::{
    block_bytes, block_bytes_mut, header, header_matches, ring_slot, Block, BLOCK_LEN, HEADER_LEN,
    SAMPLE_LEN,
};
use std::rc::Rc;

impl ServiceTable {
    /// The table as a shared-data record (layout in the module doc).
    pub fn encode(&self) -> Vec<u8> {
        let samples: usize = self
            .stats
            .iter()
            .map(|s| s.ttft.len() + s.total.len())
            .sum();
        let mut out =
            Vec::with_capacity(HEADER_LEN + self.stats.len() * BLOCK_LEN + samples * SAMPLE_LEN);
        out.extend_from_slice(&header(&self.shape, self.stats.len(), self.ring_capacity));
        for s in &self.stats {
            let mut b = [0u8; BLOCK_LEN];
            Block::of(s).write(&mut b);
            out.extend_from_slice(&b);
        }
        for s in &self.stats {
            out.extend_from_slice(s.ttft.samples.as_flattened());
            out.extend_from_slice(s.total.samples.as_flattened());
        }
        out
    }

    /// The blocks of `record`, decoded, when it is exactly what [`ServiceTable::encode`]
    /// writes for this table's services and capacity (see the module doc); `None` when it is
    /// not ours. Reads the header and blocks only.
    fn blocks_of(&self, record: &[u8]) -> Option<Vec<Block>> {
        let services = self.stats.len();
        let (head, rest) = record.split_first_chunk::<HEADER_LEN>()?;
        if !header_matches(head, &self.shape, services, self.ring_capacity) {
            return None;
        }
        let mut blocks = Vec::with_capacity(services);
        let mut samples = 0usize;
        for i in 0..services {
            let block = block_bytes(record, i).and_then(Block::parse)?;
            if !block.is_ours(self.ring_capacity) {
                return None;
            }
            samples = samples
                .saturating_add(block.lens[0])
                .saturating_add(block.lens[1]);
            blocks.push(block);
        }
        let len = services
            .checked_mul(BLOCK_LEN)
            .zip(samples.checked_mul(SAMPLE_LEN))
            .and_then(|(blocks, samples)| blocks.checked_add(samples));
        (len == Some(rest.len())).then_some(blocks)
    }

    /// This table's services and capacity with the statistics of `record`, or `None` when
    /// it is not ours (module doc). Never panics.
    pub fn read(&self, record: &[u8]) -> Option<ServiceTable> {
        let blocks = self.blocks_of(record)?;
        let mut samples = record.get(HEADER_LEN + self.stats.len() * BLOCK_LEN..)?;
        let mut stats = Vec::with_capacity(self.stats.len());
        for block in blocks {
            let mut s = ServiceStats {
                counters: block.counters,
                ..ServiceStats::default()
            };
            for (slot, ring) in [&mut s.ttft, &mut s.total].into_iter().enumerate() {
                let (bytes, rest) =
                    samples.split_at_checked(block.lens[slot].checked_mul(SAMPLE_LEN)?)?;
                samples = rest;
                *ring = Ring {
                    samples: bytes.as_chunks::<SAMPLE_LEN>().0.to_vec(),
                    sum: block.sums[slot],
                };
            }
            stats.push(s);
        }
        Some(ServiceTable {
            shape: self.shape.clone(),
            stats,
            ring_capacity: self.ring_capacity,
        })
    }

    /// [`ServiceTable::read`] of `record` for `service_list`, fresh statistics when it is not
    /// ours.
    pub fn decode<S: AsRef<str>>(
        record: &[u8],
        service_list: &[S],
        ring_capacity: usize,
    ) -> ServiceTable {
        let table = ServiceTable::new(service_list, ring_capacity);
        table.read(record).unwrap_or(table)
    }

    /// `record` as a [`Record`] of this table's services and capacity to update in place, or
    /// `None` when it is not ours. Checks the header and blocks, never the samples.
    pub fn open(&self, record: Vec<u8>) -> Option<Record> {
        let blocks = self.blocks_of(&record)?;
        Some(self.record_of(blocks, record))
    }

    /// A [`Record`] of fresh statistics for this table's services.
    pub fn fresh_record(&self) -> Record {
        let fresh = self.fresh();
        let blocks = fresh.stats.iter().map(Block::of).collect();
        self.record_of(blocks, fresh.encode())
    }

    fn record_of(&self, blocks: Vec<Block>, bytes: Vec<u8>) -> Record {
        Record {
            shape: self.shape.clone(),
            ring_capacity: self.ring_capacity,
            blocks,
            bytes,
        }
    }
}

/// A record known to be ours ([`ServiceTable::open`]), read and changed through [`Table`]:
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
