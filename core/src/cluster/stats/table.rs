//! The in-memory [`ServiceTable`]: every service of one `cluster_metrics` config, one record
//! per distinct name, and its binary shared-data record written and read whole (layout in
//! record.rs; docs/higress-cluster-policies.md §6.1).

use super::record::layout::{
    block_bytes, header, header_matches, Block, Shape, BLOCK_LEN, HEADER_LEN, SAMPLE_LEN,
};
use super::record::Record;
use super::{Counters, Latency, Ring, ServiceStats, Table};
use crate::hash;
use std::rc::Rc;

/// Every service of one `cluster_metrics` config in memory: one record per distinct name.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceTable {
    /// Fixed for the config; shared by every table and record read for it, so a read copies
    /// no names.
    shape: Rc<Shape>,
    stats: Vec<ServiceStats>,
    ring_capacity: usize,
}

impl ServiceTable {
    /// A fresh table for `service_list` (duplicates allowed; `ring_capacity` from
    /// [`crate::cluster::MetricsParams::ring_capacity`]).
    pub fn new<S: AsRef<str>>(service_list: &[S], ring_capacity: usize) -> ServiceTable {
        let mut names: Vec<String> = Vec::new();
        let mut list = Vec::with_capacity(service_list.len());
        for name in service_list {
            let name = name.as_ref();
            let index = match names.iter().position(|n| n == name) {
                Some(i) => i,
                None => {
                    names.push(name.to_string());
                    names.len() - 1
                }
            };
            list.push(index);
        }
        let stats = vec![ServiceStats::default(); names.len()];
        let fingerprint = names.iter().fold(hash::FNV_OFFSET, |h, name| {
            let h = hash::fnv1a(h, &(name.len() as u64).to_le_bytes());
            hash::fnv1a(h, name.as_bytes())
        });
        ServiceTable {
            shape: Rc::new(Shape {
                names,
                list,
                fingerprint,
            }),
            stats,
            ring_capacity,
        }
    }

    /// The same services and capacity with fresh statistics.
    pub fn fresh(&self) -> ServiceTable {
        ServiceTable {
            shape: self.shape.clone(),
            stats: vec![ServiceStats::default(); self.stats.len()],
            ring_capacity: self.ring_capacity,
        }
    }

    /// Distinct service names; a decision's index points here.
    pub fn names(&self) -> &[String] {
        &self.shape.names
    }

    /// `service_list` as configured, as indices into [`ServiceTable::names`].
    pub fn list(&self) -> &[usize] {
        &self.shape.list
    }

    pub fn stats(&self) -> &[ServiceStats] {
        &self.stats
    }

    pub fn get(&self, index: usize) -> Option<&ServiceStats> {
        self.stats.get(index)
    }

    pub fn get_mut(&mut self, index: usize) -> Option<&mut ServiceStats> {
        self.stats.get_mut(index)
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.shape.names.iter().position(|n| n == name)
    }

    pub fn ring_capacity(&self) -> usize {
        self.ring_capacity
    }

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
        Some(Record::of_parts(
            self.shape.clone(),
            self.ring_capacity,
            blocks,
            record,
        ))
    }

    /// A [`Record`] of fresh statistics for this table's services.
    pub fn fresh_record(&self) -> Record {
        let fresh = self.fresh();
        let blocks = fresh.stats.iter().map(Block::of).collect();
        Record::of_parts(
            self.shape.clone(),
            self.ring_capacity,
            blocks,
            fresh.encode(),
        )
    }
}

impl Table for ServiceTable {
    fn names(&self) -> &[String] {
        &self.shape.names
    }

    fn list(&self) -> &[usize] {
        &self.shape.list
    }

    fn counters(&self, index: usize) -> Option<&Counters> {
        self.stats.get(index).map(|s| &s.counters)
    }

    fn counters_mut(&mut self, index: usize) -> Option<&mut Counters> {
        self.stats.get_mut(index).map(|s| &mut s.counters)
    }

    fn mean(&self, index: usize, which: Latency) -> f64 {
        self.stats.get(index).map_or(0.0, |s| s.ring(which).mean())
    }

    fn push(&mut self, index: usize, which: Latency, sample: f64) {
        let capacity = self.ring_capacity;
        if let Some(s) = self.stats.get_mut(index) {
            s.ring_mut(which).push(sample, capacity);
        }
    }
}
