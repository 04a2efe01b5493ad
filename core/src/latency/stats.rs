//! Weighted least-squares sufficient statistics: `XᵀX`, `Xᵀy`, the weight and `yᵀy` of the
//! samples seen, with exponential forgetting. They add up: the statistics of two gateways'
//! samples are the sum of each one's, so gateways merge by adding deltas (Redis
//! `HINCRBYFLOAT`), which a recursive-least-squares state (its inverse covariance and
//! estimate) cannot do (docs/latency-model.md §2).

/// The statistics of samples with `K` features each (the first is the constant 1).
#[derive(Clone, Debug, PartialEq)]
pub struct Stats<const K: usize> {
    pub xtx: [[f64; K]; K],
    pub xty: [f64; K],
    /// The samples' total weight (after forgetting).
    pub weight: f64,
    pub yy: f64,
}

impl<const K: usize> Default for Stats<K> {
    fn default() -> Self {
        Stats {
            xtx: [[0.0; K]; K],
            xty: [0.0; K],
            weight: 0.0,
            yy: 0.0,
        }
    }
}

/// How many numbers [`Stats::to_fields`] writes for `K` features.
pub const fn field_count(k: usize) -> usize {
    k * (k + 1) / 2 + k + 2
}

impl<const K: usize> Stats<K> {
    /// Adds the sample `(x, y)` with weight `w`. The caller has checked that every value is
    /// finite (model.rs refuses the rest).
    pub fn add(&mut self, x: &[f64; K], y: f64, w: f64) {
        for i in 0..K {
            for j in 0..K {
                self.xtx[i][j] += w * x[i] * x[j];
            }
            self.xty[i] += w * x[i] * y;
        }
        self.weight += w;
        self.yy += w * y * y;
    }

    /// Forgets: every sample's weight times `factor` (0..=1).
    pub fn decay(&mut self, factor: f64) {
        let f = factor.clamp(0.0, 1.0);
        for row in self.xtx.iter_mut() {
            for v in row.iter_mut() {
                *v *= f;
            }
        }
        for v in self.xty.iter_mut() {
            *v *= f;
        }
        self.weight *= f;
        self.yy *= f;
    }

    /// Adds another set of statistics (another gateway's, or a delta).
    pub fn merge(&mut self, other: &Stats<K>) {
        for i in 0..K {
            for j in 0..K {
                self.xtx[i][j] += other.xtx[i][j];
            }
            self.xty[i] += other.xty[i];
        }
        self.weight += other.weight;
        self.yy += other.yy;
    }

    /// The upper triangle of `XᵀX` row by row, then `Xᵀy`, the weight and `yᵀy`:
    /// [`field_count`]`(K)` numbers, the order [`Stats::from_fields`] reads.
    pub fn to_fields(&self) -> Vec<f64> {
        let mut out = Vec::with_capacity(field_count(K));
        for i in 0..K {
            out.extend_from_slice(&self.xtx[i][i..]);
        }
        out.extend_from_slice(&self.xty);
        out.push(self.weight);
        out.push(self.yy);
        out
    }

    /// The statistics [`Stats::to_fields`] wrote; None when the count is wrong or a number is
    /// not finite (a corrupted or foreign record is ignored, not half-read).
    pub fn from_fields(fields: &[f64]) -> Option<Stats<K>> {
        if fields.len() != field_count(K) || fields.iter().any(|v| !v.is_finite()) {
            return None;
        }
        let mut s = Stats::default();
        let mut it = fields.iter().copied();
        for i in 0..K {
            for j in i..K {
                let v = it.next()?;
                s.xtx[i][j] = v;
                s.xtx[j][i] = v;
            }
        }
        for v in s.xty.iter_mut() {
            *v = it.next()?;
        }
        s.weight = it.next()?;
        s.yy = it.next()?;
        (s.weight >= 0.0).then_some(s)
    }
}
