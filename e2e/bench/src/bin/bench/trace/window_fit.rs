//! Least squares over a sliding window of the latest samples, the way llm-d's latency
//! predictor retrains on its most recent samples (llmd_predictor.rs): the normal equations'
//! sums are kept as samples enter and leave the window, and the fit is solved again after each
//! sample (K is 2 or 3, a few dozen flops). A weak pull toward a prior (worth `PRIOR_WEIGHT`
//! samples) keeps the fit defined before the samples span every feature.

use std::collections::VecDeque;

/// Samples the fit remembers: a few hundred requests, the last minute or so of the ladder's
/// busy stages.
pub const WINDOW: usize = 500;
/// The prior's weight, in samples.
const PRIOR_WEIGHT: f64 = 1.0;

pub struct WindowFit<const K: usize> {
    window: VecDeque<([f64; K], f64)>,
    xtx: [[f64; K]; K],
    xty: [f64; K],
    prior: [f64; K],
    theta: [f64; K],
}

impl<const K: usize> WindowFit<K> {
    pub fn new(prior: [f64; K]) -> Self {
        WindowFit {
            window: VecDeque::with_capacity(WINDOW + 1),
            xtx: [[0.0; K]; K],
            xty: [0.0; K],
            prior,
            theta: prior,
        }
    }

    /// The prediction for features `x`, never below zero.
    pub fn predict(&self, x: &[f64; K]) -> f64 {
        dot(&self.theta, x).max(0.0)
    }

    pub fn coefficients(&self) -> [f64; K] {
        self.theta
    }

    /// Learns `y` at `x`; forgets the oldest sample past the window.
    pub fn add(&mut self, x: [f64; K], y: f64) {
        if !y.is_finite() || x.iter().any(|v| !v.is_finite()) {
            return;
        }
        self.accumulate(&x, y, 1.0);
        self.window.push_back((x, y));
        if self.window.len() > WINDOW {
            if let Some((old, oy)) = self.window.pop_front() {
                self.accumulate(&old, oy, -1.0);
            }
        }
        if let Some(t) = self.solve() {
            self.theta = t;
        }
    }

    fn accumulate(&mut self, x: &[f64; K], y: f64, sign: f64) {
        for i in 0..K {
            for j in 0..K {
                self.xtx[i][j] += sign * x[i] * x[j];
            }
            self.xty[i] += sign * x[i] * y;
        }
    }

    /// (XᵀX + λI) θ = Xᵀy + λ θ₀ by Gaussian elimination with partial pivoting.
    fn solve(&self) -> Option<[f64; K]> {
        let mut a = self.xtx;
        let mut b = self.xty;
        for i in 0..K {
            a[i][i] += PRIOR_WEIGHT;
            b[i] += PRIOR_WEIGHT * self.prior[i];
        }
        for col in 0..K {
            let pivot = (col..K).max_by(|&p, &q| a[p][col].abs().total_cmp(&a[q][col].abs()))?;
            if a[pivot][col].abs() < 1e-12 {
                return None;
            }
            a.swap(col, pivot);
            b.swap(col, pivot);
            let top = a[col];
            for row in col + 1..K {
                let f = a[row][col] / top[col];
                for (v, t) in a[row].iter_mut().zip(top).skip(col) {
                    *v -= f * t;
                }
                b[row] -= f * b[col];
            }
        }
        let mut t = [0.0; K];
        for i in (0..K).rev() {
            let rest: f64 = (i + 1..K).map(|k| a[i][k] * t[k]).sum();
            t[i] = (b[i] - rest) / a[i][i];
        }
        t.iter().all(|v| v.is_finite()).then_some(t)
    }
}

fn dot<const K: usize>(a: &[f64; K], b: &[f64; K]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_a_linear_law_and_follows_a_change() {
        let mut f = WindowFit::<3>::new([0.0, 0.0, 0.0]);
        let law = |x: &[f64; 3], k: f64| 5.0 + k * x[1] + 0.5 * x[2];
        for i in 0..WINDOW {
            let x = [1.0, (i % 17) as f64, (i % 5) as f64];
            f.add(x, law(&x, 2.0));
        }
        let c = f.coefficients();
        assert!(
            (c[1] - 2.0).abs() < 0.01 && (c[0] - 5.0).abs() < 0.1,
            "{c:?}"
        );
        // The pod got slower: once the window holds only new samples, the fit is the new law.
        for i in 0..WINDOW {
            let x = [1.0, (i % 13) as f64, (i % 7) as f64];
            f.add(x, law(&x, 4.0));
        }
        assert!((f.coefficients()[1] - 4.0).abs() < 0.01);
        assert!(f.predict(&[1.0, -100.0, 0.0]) == 0.0);
    }
}
