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
//! out references, so a decision copies no block (a copy per read was code in every reader:
//! docs/architecture.md "Plugin CPU").

use super::Table;
use super::{mean, oldest_first_sum, Counters, Latency, Ring, ServiceStats, ServiceTable, Shape};
use std::rc::Rc;

const MAGIC: [u8; 3] = *b"acm";
/// Bump on any layout change: a record of another version reads as foreign and starts fresh.
const VERSION: u8 = 1;
const HEADER_LEN: usize = 24;
const SAMPLE_LEN: usize = 8;
const HAS_EWMA_TTFT: u32 = 1;
const HAS_EWMA_TOTAL: u32 = 2;

/// Byte offsets inside the header.
mod header_at {
    /// `MAGIC` then `VERSION`.
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 3;
    /// u32 distinct services.
    pub const SERVICES: usize = 4;
    /// u64 `Shape::fingerprint` of the names.
    pub const FINGERPRINT: usize = 8;
    /// u64 ring capacity.
    pub const CAPACITY: usize = 16;
}

/// Byte offsets inside a block.
mod at {
    pub const ONGOING: usize = 0;
    pub const COUNT: usize = 8;
    pub const SUCCESS: usize = 16;
    pub const ERRORS: usize = 24;
    pub const CONSECUTIVE_ERRORS: usize = 32;
    pub const COOLDOWN_UNTIL_MS: usize = 40;
    /// f64, 0 when absent (see the flags).
    pub const EWMA_TTFT: usize = 48;
    pub const EWMA_TOTAL: usize = 56;
    /// f64 oldest-first sums of the TTFT and total rings.
    pub const SUMS: [usize; 2] = [64, 72];
    /// u32: `HAS_EWMA_TTFT | HAS_EWMA_TOTAL`.
    pub const FLAGS: usize = 80;
    /// u32 lengths of the TTFT and total rings.
    pub const LENS: [usize; 2] = [84, 88];
    pub const BLOCK_LEN: usize = 92;
}
use at::BLOCK_LEN;

/// One service's block, decoded.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Block {
    counters: Counters,
    /// Indexed by [`ring_slot`].
    sums: [f64; 2],
    lens: [usize; 2],
}

/// A ring's length as the record holds it. Fits: usize is 32 bits on wasm32, and elsewhere a
/// ring of 2^32 samples (32 GiB) is out of reach; were it not, the record would fail its
/// length check and start fresh rather than misread.
fn ring_len(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

fn ring_slot(which: Latency) -> usize {
    match which {
        Latency::Ttft => 0,
        Latency::Total => 1,
    }
}

impl Block {
    fn of(s: &ServiceStats) -> Block {
        Block {
            counters: s.counters,
            sums: [s.ttft.sum, s.total.sum],
            lens: [s.ttft.len(), s.total.len()],
        }
    }

    /// `None` when the flags or an absent EWMA are not as [`Block::write`] leaves them.
    fn parse(b: &[u8; BLOCK_LEN]) -> Option<Block> {
        let flags = u32::from_le_bytes(get(b, at::FLAGS)?);
        if flags & !(HAS_EWMA_TTFT | HAS_EWMA_TOTAL) != 0 {
            return None;
        }
        let u64_at = |at| get(b, at).map(u64::from_le_bytes);
        let i64_at = |at| get(b, at).map(i64::from_le_bytes);
        let f64_at = |at| get(b, at).map(f64::from_le_bytes);
        let ewma = |at, flag| -> Option<Option<f64>> {
            let v = f64_at(at)?;
            match flags & flag != 0 {
                true => Some(Some(v)),
                false => (v.to_bits() == 0).then_some(None),
            }
        };
        let len_at =
            |at| -> Option<usize> { usize::try_from(u32::from_le_bytes(get(b, at)?)).ok() };
        Some(Block {
            counters: Counters {
                ongoing: i64_at(at::ONGOING)?,
                count: u64_at(at::COUNT)?,
                ewma_ttft: ewma(at::EWMA_TTFT, HAS_EWMA_TTFT)?,
                ewma_total: ewma(at::EWMA_TOTAL, HAS_EWMA_TOTAL)?,
                success: u64_at(at::SUCCESS)?,
                errors: u64_at(at::ERRORS)?,
                consecutive_errors: u64_at(at::CONSECUTIVE_ERRORS)?,
                cooldown_until_ms: i64_at(at::COOLDOWN_UNTIL_MS)?,
            },
            sums: [f64_at(at::SUMS[0])?, f64_at(at::SUMS[1])?],
            lens: [len_at(at::LENS[0])?, len_at(at::LENS[1])?],
        })
    }

    fn write(&self, b: &mut [u8; BLOCK_LEN]) {
        let c = &self.counters;
        put(b, at::ONGOING, c.ongoing.to_le_bytes());
        put(b, at::COUNT, c.count.to_le_bytes());
        put(b, at::SUCCESS, c.success.to_le_bytes());
        put(b, at::ERRORS, c.errors.to_le_bytes());
        put(
            b,
            at::CONSECUTIVE_ERRORS,
            c.consecutive_errors.to_le_bytes(),
        );
        put(b, at::COOLDOWN_UNTIL_MS, c.cooldown_until_ms.to_le_bytes());
        let mut flags = 0;
        for (ewma, flag, at) in [
            (c.ewma_ttft, HAS_EWMA_TTFT, at::EWMA_TTFT),
            (c.ewma_total, HAS_EWMA_TOTAL, at::EWMA_TOTAL),
        ] {
            if ewma.is_some() {
                flags |= flag;
            }
            put(b, at, ewma.unwrap_or(0.0).to_le_bytes());
        }
        put(b, at::FLAGS, flags.to_le_bytes());
        // Both slots written out, not looped: a loop indexes `at::SUMS` and `at::LENS` at run
        // time, and those two tables were the only data a request read on their page of
        // read-only data (`ailb-footprint --trace`; docs/plugin-cpu.md "Data pages").
        put(b, at::SUMS[0], self.sums[0].to_le_bytes());
        put(b, at::SUMS[1], self.sums[1].to_le_bytes());
        put(b, at::LENS[0], ring_len(self.lens[0]).to_le_bytes());
        put(b, at::LENS[1], ring_len(self.lens[1]).to_le_bytes());
    }

    /// The checks [`Block::parse`] leaves to the caller: finite EWMAs and sums, ring lengths
    /// within `capacity`, and an empty ring summing to exactly +0.
    fn is_ours(&self, capacity: usize) -> bool {
        let c = &self.counters;
        c.ewma_ttft.is_none_or(f64::is_finite)
            && c.ewma_total.is_none_or(f64::is_finite)
            && (0..2).all(|slot| {
                self.sums[slot].is_finite()
                    && self.lens[slot] <= capacity
                    && (self.lens[slot] != 0 || self.sums[slot].to_bits() == 0)
            })
    }
}

/// The `N` bytes at `at` of a header or block (always there for the offsets used).
fn get<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..)?.first_chunk::<N>().copied()
}

fn put<const N: usize>(b: &mut [u8], at: usize, v: [u8; N]) {
    if let Some(dst) = b.get_mut(at..).and_then(|b| b.first_chunk_mut::<N>()) {
        *dst = v;
    }
}

/// The block of service `index` in `bytes`.
fn block_bytes(bytes: &[u8], index: usize) -> Option<&[u8; BLOCK_LEN]> {
    let at = HEADER_LEN.checked_add(index.checked_mul(BLOCK_LEN)?)?;
    bytes.get(at..)?.first_chunk::<BLOCK_LEN>()
}

fn block_bytes_mut(bytes: &mut [u8], index: usize) -> Option<&mut [u8; BLOCK_LEN]> {
    let at = HEADER_LEN.checked_add(index.checked_mul(BLOCK_LEN)?)?;
    bytes.get_mut(at..)?.first_chunk_mut::<BLOCK_LEN>()
}

fn header(shape: &Shape, services: usize, capacity: usize) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    put(&mut h, header_at::MAGIC, MAGIC);
    put(&mut h, header_at::VERSION, [VERSION]);
    put(&mut h, header_at::SERVICES, services_field(services));
    put(
        &mut h,
        header_at::FINGERPRINT,
        shape.fingerprint.to_le_bytes(),
    );
    put(&mut h, header_at::CAPACITY, capacity_field(capacity));
    h
}

/// `head == header(...)`, field by field without building one.
fn header_matches(
    head: &[u8; HEADER_LEN],
    shape: &Shape,
    services: usize,
    capacity: usize,
) -> bool {
    get(head, header_at::MAGIC) == Some(MAGIC)
        && get(head, header_at::VERSION) == Some([VERSION])
        && get(head, header_at::SERVICES) == Some(services_field(services))
        && get(head, header_at::FINGERPRINT) == Some(shape.fingerprint.to_le_bytes())
        && get(head, header_at::CAPACITY) == Some(capacity_field(capacity))
}

fn services_field(services: usize) -> [u8; 4] {
    u32::try_from(services).unwrap_or(u32::MAX).to_le_bytes()
}

/// A capacity beyond u64 (none on any real target) is written as the largest.
fn capacity_field(capacity: usize) -> [u8; 8] {
    u64::try_from(capacity).unwrap_or(u64::MAX).to_le_bytes()
}

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
mod tests {
    use super::*;
    use crate::cluster::MetricsParams;
    use crate::hash::SplitMix64;

    const LIST: [&str; 5] = [
        "outbound|80||a.dns",
        "weird name%\t",
        "ünï",
        "",
        "outbound|80||a.dns",
    ];

    fn busy_table() -> ServiceTable {
        let p = MetricsParams {
            queue_size: 4,
            ..MetricsParams::default()
        };
        let mut t = ServiceTable::new(&LIST, p.ring_capacity());
        for i in 0..6 {
            t.on_request_start(i % 4);
            t.on_first_byte(i % 4, 10 + i as i64 * 7, i % 3 != 0, p.ewma_beta);
            t.on_stream_end(
                i % 4,
                Some(100 + i as i64 * 33),
                i % 3 != 0,
                1_700_000_000_000,
                &p,
            );
        }
        t.on_request_start(1);
        t.get_mut(2).unwrap().ttft.push(0.1 + 0.2, 4);
        t.get_mut(2).unwrap().total.push(1e300, 4);
        t.get_mut(2).unwrap().total.push(-3.5e-9, 4);
        t.get_mut(3).unwrap().ongoing = -7;
        t.get_mut(3).unwrap().cooldown_until_ms = i64::MIN;
        t.get_mut(3).unwrap().errors = u64::MAX;
        t
    }

    #[test]
    fn codec_round_trips_exactly() {
        let t = busy_table();
        let bytes = t.encode();
        let back = t.fresh().read(&bytes).expect("ours");
        assert_eq!(back, t);
        assert_eq!(back.encode(), bytes);
        let samples: usize = t.stats().iter().map(|s| s.ttft.len() + s.total.len()).sum();
        assert_eq!(
            bytes.len(),
            HEADER_LEN + 4 * BLOCK_LEN + samples * SAMPLE_LEN
        );
        // A fresh table encodes and reads back too; `decode` is the same read.
        let fresh = ServiceTable::new(&["x", "y"], 100);
        assert_eq!(fresh.read(&fresh.encode()), Some(fresh.clone()));
        assert_eq!(ServiceTable::decode(&bytes, &LIST, 4), t);
        // An opened record hands back the very bytes.
        assert_eq!(t.open(bytes.clone()).map(Record::into_bytes), Some(bytes));
    }

    #[test]
    fn layout_is_stable() {
        let mut t = ServiceTable::new(&["outbound|80||a.dns"], 100);
        t.on_request_start(0);
        t.on_first_byte(0, 12, true, 0.5);
        t.on_stream_end(0, Some(40), false, 1000, &MetricsParams::default());
        let b = t.encode();
        let le = |v: u64| v.to_le_bytes();
        let mut want = b"acm\x01".to_vec();
        want.extend_from_slice(&1u32.to_le_bytes());
        let name = b"outbound|80||a.dns";
        let fp = crate::hash::fnv1a(crate::hash::FNV_OFFSET, &le(name.len() as u64));
        want.extend_from_slice(&le(crate::hash::fnv1a(fp, name)));
        want.extend_from_slice(&le(100));
        // ongoing 0, count 1, success 0, errors 1, consecutive 1, cooldown 31000.
        for v in [0, 1, 0, 1, 1, 31_000] {
            want.extend_from_slice(&le(v));
        }
        // EWMAs 12 and 80 (a failure of 40 ms counts double), sums 12 and 80.
        for v in [12.0f64, 80.0, 12.0, 80.0] {
            want.extend_from_slice(&v.to_le_bytes());
        }
        for v in [3u32, 1, 1] {
            want.extend_from_slice(&v.to_le_bytes());
        }
        want.extend_from_slice(&12.0f64.to_le_bytes());
        want.extend_from_slice(&80.0f64.to_le_bytes());
        assert_eq!(b, want);
    }

    /// Every change made through a `Record` leaves exactly the bytes the in-memory table
    /// encodes after the same change: the two stores agree bit for bit.
    #[test]
    fn record_updates_in_place_exactly_as_the_table() {
        for (list, capacity) in [
            (&LIST[..], 4),
            (&["a", "b", "c"][..], 100),
            (&["a"][..], 1),
            (&["a", "b"][..], 0),
            (&[][..], 3),
        ] {
            let p = MetricsParams::default();
            let mut rng = SplitMix64(capacity as u64 + 1);
            let mut table = ServiceTable::new(list, capacity);
            let mut record = table.fresh_record();
            assert_eq!(record.clone().into_bytes(), table.encode());
            for step in 0..600 {
                let r = rng.next_u64();
                // Index 7 is beyond every list: both stores ignore it.
                let i = match list.len() {
                    0 => 7,
                    n => [(r % n as u64) as usize, 7][usize::from(step % 41 == 0)],
                };
                let ms = (r >> 8) as i64 % 2_000 - 20;
                let ok = !(r >> 40).is_multiple_of(4);
                match (r >> 32) % 4 {
                    0 => {
                        table.on_request_start(i);
                        record.on_request_start(i);
                    }
                    1 => {
                        table.on_first_byte(i, ms, ok, p.ewma_beta);
                        record.on_first_byte(i, ms, ok, p.ewma_beta);
                    }
                    2 => {
                        table.on_stream_end(i, Some(ms), ok, step, &p);
                        record.on_stream_end(i, Some(ms), ok, step, &p);
                    }
                    _ => {
                        table.on_stream_end(i, None, ok, step, &p);
                        record.on_stream_end(i, None, ok, step, &p);
                    }
                }
                for j in 0..table.names().len() {
                    assert_eq!(record.counters(j), table.counters(j));
                    for w in [Latency::Ttft, Latency::Total] {
                        assert_eq!(record.mean(j, w).to_bits(), table.mean(j, w).to_bits());
                    }
                }
                assert_eq!(record.clone().into_bytes(), table.encode(), "step {step}");
                // And what was written opens again.
                let bytes = record.clone().into_bytes();
                assert_eq!(table.fresh().read(&bytes).as_ref(), Some(&table));
            }
        }
    }

    fn refused(t: &ServiceTable, bytes: &[u8]) -> bool {
        t.read(bytes).is_none() && t.open(bytes.to_vec()).is_none()
    }

    #[test]
    fn anything_but_our_own_record_is_refused() {
        let t = busy_table();
        let good = t.encode();
        let block = |i: usize| HEADER_LEN + i * BLOCK_LEN;
        let with = |at: usize, v: &[u8]| {
            let mut b = good.clone();
            b[at..at + v.len()].copy_from_slice(v);
            b
        };
        let mut bad: Vec<(&str, Vec<u8>)> = vec![
            ("empty", Vec::new()),
            ("short header", good[..HEADER_LEN - 1].to_vec()),
            ("header only", good[..HEADER_LEN].to_vec()),
            ("one byte short", good[..good.len() - 1].to_vec()),
            ("one sample short", good[..good.len() - SAMPLE_LEN].to_vec()),
            ("one byte long", [&good[..], &[0]].concat()),
            ("magic", with(0, b"ACM")),
            ("version", with(3, &[2])),
            ("service count", with(4, &5u32.to_le_bytes())),
            ("fingerprint", with(8, &0u64.to_le_bytes())),
            ("capacity", with(16, &5u64.to_le_bytes())),
            (
                "unknown flag",
                with(block(0) + at::FLAGS, &4u32.to_le_bytes()),
            ),
            (
                "NaN EWMA",
                with(block(0) + at::EWMA_TOTAL, &f64::NAN.to_le_bytes()),
            ),
            (
                "infinite sum",
                with(block(1) + at::SUMS[1], &f64::INFINITY.to_le_bytes()),
            ),
            (
                "ring over capacity",
                with(block(0) + at::LENS[0], &5u32.to_le_bytes()),
            ),
            (
                "ring length off",
                with(block(0) + at::LENS[1], &1u32.to_le_bytes()),
            ),
            (
                "the former text record",
                b"outbound|80||a.dns 0 0 0 0 0 0 - - - -\n".to_vec(),
            ),
        ];
        // The same services in another order, and another capacity, are other records.
        let mut other = ServiceTable::new(&["ünï", "outbound|80||a.dns", "weird name%\t", ""], 4);
        other.on_request_start(0);
        bad.push(("other order", other.encode()));
        bad.push(("other capacity", ServiceTable::new(&LIST, 5).encode()));
        bad.push((
            "other names",
            ServiceTable::new(&["a", "b", "c", "d"], 4).encode(),
        ));
        for (what, bytes) in &bad {
            assert!(refused(&t, bytes), "{what}");
        }
        assert!(!refused(&t, &good));
        // Absent EWMAs and empty rings are written as +0.
        let fresh = t.fresh().encode();
        for at in [at::EWMA_TTFT, at::SUMS[1]] {
            let mut b = fresh.clone();
            b[block(2) + at..block(2) + at + 8].copy_from_slice(&(-0.0f64).to_le_bytes());
            assert!(refused(&t, &b), "at {at}");
        }
        assert!(!refused(&t, &fresh));
    }

    /// Random damage never panics a read or an open, and whatever is accepted stays ours
    /// through updates.
    #[test]
    fn damaged_records_never_panic() {
        let p = MetricsParams::default();
        let t = busy_table();
        let good = t.encode();
        let mut rng = SplitMix64(7);
        let mut accepted = 0;
        for round in 0..3000 {
            let mut bytes = good.clone();
            match round % 3 {
                0 => {
                    for _ in 0..1 + rng.next_u64() % 8 {
                        let i = (rng.next_u64() % bytes.len() as u64) as usize;
                        bytes[i] = rng.next_u64() as u8;
                    }
                }
                1 => bytes.truncate((rng.next_u64() % bytes.len() as u64) as usize),
                _ => {
                    bytes = (0..rng.next_u64() % 600)
                        .map(|_| rng.next_u64() as u8)
                        .collect();
                }
            }
            let read = t.read(&bytes);
            let Some(mut record) = t.open(bytes) else {
                assert!(read.is_none());
                continue;
            };
            accepted += 1;
            let read = read.expect("open and read agree");
            for i in 0..5 {
                record.on_request_start(i);
                record.on_first_byte(i, 30, i % 2 == 0, p.ewma_beta);
                record.on_stream_end(i, Some(90), i % 2 == 1, 5, &p);
            }
            let after = record.into_bytes();
            assert!(read.read(&after).is_some(), "round {round}");
        }
        // Damage to samples (not to the header or blocks) is not detectable, and accepted.
        assert!(accepted > 0);
    }
}
