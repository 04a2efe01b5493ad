//! The record's byte layout (module doc of [`super`]): the header and block field offsets, and
//! a service's block decoded, checked and written.

use crate::cluster::stats::{Counters, Latency, ServiceStats};

/// The services a record is for, fixed for the config: shared by every table and record
/// read for it, so a read copies no names.
#[derive(Debug, PartialEq)]
pub(in crate::cluster::stats) struct Shape {
    pub(in crate::cluster::stats) names: Vec<String>,
    /// `service_list` as configured, each entry an index into `names`.
    pub(in crate::cluster::stats) list: Vec<usize>,
    /// FNV-1a 64 of `names` (each as its byte length, u64 little-endian, then its bytes), so
    /// a shared-data record kept for other services does not read as ours.
    pub(in crate::cluster::stats) fingerprint: u64,
}

const MAGIC: [u8; 3] = *b"acm";
/// Bump on any layout change: a record of another version reads as foreign and starts fresh.
const VERSION: u8 = 1;
pub(in crate::cluster::stats) const HEADER_LEN: usize = 24;
pub(in crate::cluster::stats) const SAMPLE_LEN: usize = 8;
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
pub(in crate::cluster::stats) mod at {
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
pub(in crate::cluster::stats) use at::BLOCK_LEN;

/// One service's block, decoded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(in crate::cluster::stats) struct Block {
    pub(in crate::cluster::stats) counters: Counters,
    /// Indexed by [`ring_slot`].
    pub(in crate::cluster::stats) sums: [f64; 2],
    pub(in crate::cluster::stats) lens: [usize; 2],
}

/// A ring's length as the record holds it. Fits: usize is 32 bits on wasm32, and elsewhere a
/// ring of 2^32 samples (32 GiB) is out of reach; were it not, the record would fail its
/// length check and start fresh rather than misread.
fn ring_len(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

pub(in crate::cluster::stats) fn ring_slot(which: Latency) -> usize {
    match which {
        Latency::Ttft => 0,
        Latency::Total => 1,
    }
}

impl Block {
    pub(in crate::cluster::stats) fn of(s: &ServiceStats) -> Block {
        Block {
            counters: s.counters,
            sums: [s.ttft.sum, s.total.sum],
            lens: [s.ttft.len(), s.total.len()],
        }
    }

    /// `None` when the flags or an absent EWMA are not as [`Block::write`] leaves them.
    pub(in crate::cluster::stats) fn parse(b: &[u8; BLOCK_LEN]) -> Option<Block> {
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

    pub(in crate::cluster::stats) fn write(&self, b: &mut [u8; BLOCK_LEN]) {
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
        put(b, at::SUMS[0], self.sums[0].to_le_bytes());
        put(b, at::SUMS[1], self.sums[1].to_le_bytes());
        put(b, at::LENS[0], ring_len(self.lens[0]).to_le_bytes());
        put(b, at::LENS[1], ring_len(self.lens[1]).to_le_bytes());
    }

    /// The checks [`Block::parse`] leaves to the caller: finite EWMAs and sums, ring lengths
    /// within `capacity`, and an empty ring summing to exactly +0.
    pub(in crate::cluster::stats) fn is_ours(&self, capacity: usize) -> bool {
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
pub(in crate::cluster::stats) fn block_bytes(
    bytes: &[u8],
    index: usize,
) -> Option<&[u8; BLOCK_LEN]> {
    let at = HEADER_LEN.checked_add(index.checked_mul(BLOCK_LEN)?)?;
    bytes.get(at..)?.first_chunk::<BLOCK_LEN>()
}

pub(in crate::cluster::stats) fn block_bytes_mut(
    bytes: &mut [u8],
    index: usize,
) -> Option<&mut [u8; BLOCK_LEN]> {
    let at = HEADER_LEN.checked_add(index.checked_mul(BLOCK_LEN)?)?;
    bytes.get_mut(at..)?.first_chunk_mut::<BLOCK_LEN>()
}

pub(in crate::cluster::stats) fn header(
    shape: &Shape,
    services: usize,
    capacity: usize,
) -> [u8; HEADER_LEN] {
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
pub(in crate::cluster::stats) fn header_matches(
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
