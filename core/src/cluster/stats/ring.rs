//! A service's latency ring: the last samples, kept as the shared-data record stores them, and
//! their oldest-first sum, so the mean is Go's bit for bit without re-adding the samples.

/// The last `capacity` latency samples in ms, oldest first (Go's `FixedQueue`), and their sum.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ring {
    /// The samples, each a little-endian f64 as the shared-data record stores them.
    pub(super) samples: Vec<[u8; 8]>,
    /// The samples summed oldest first, as Go sums them for the mean: recomputed whenever the
    /// samples change (never adjusted by the sample in and the sample out, which would round
    /// differently), so [`Ring::mean`] is O(1) and bit for bit Go's.
    pub(super) sum: f64,
}

impl Ring {
    /// Appends `sample`, dropping the oldest ones beyond `capacity`.
    pub fn push(&mut self, sample: f64, capacity: usize) {
        let keep = capacity.saturating_sub(1);
        if self.samples.len() > keep {
            self.samples.drain(..self.samples.len() - keep);
        }
        if capacity > 0 {
            self.samples.push(sample.to_le_bytes());
        }
        self.sum = oldest_first_sum(&self.samples);
    }

    /// Mean of the samples, summed oldest first as Go does; 0 when empty, so a service with no
    /// samples looks fastest.
    pub fn mean(&self) -> f64 {
        mean(self.sum, self.samples.len())
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The samples, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = f64> + '_ {
        self.samples.iter().map(|b| f64::from_le_bytes(*b))
    }
}

/// Go's `for _, v := range q { sum += v }` over little-endian f64 samples, oldest first.
pub(super) fn oldest_first_sum(samples: &[[u8; 8]]) -> f64 {
    samples
        .iter()
        .fold(0.0, |acc, b| acc + f64::from_le_bytes(*b))
}

/// Go's ring mean: `sum / len`, 0 for an empty ring.
pub(super) fn mean(sum: f64, len: usize) -> f64 {
    if len == 0 {
        return 0.0;
    }
    sum / len as f64
}
