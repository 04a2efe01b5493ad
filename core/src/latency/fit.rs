//! Solving the normal equations with a prior. The prior `θ₀` is what the model says with no
//! samples (a pod's first requests: the fleet's pooled fit, or the configured rates). It enters
//! as `strength` samples' worth of its own prediction at the samples' mean features, plus a
//! weak ridge toward `θ₀` for directions the samples do not span (a pod never seen busy keeps
//! the prior's slope for load). A plain ridge on every coefficient would pull the slopes too,
//! since the features are far from centred: 200 exact samples and a one-sample ridge still
//! missed by 4 % (docs/latency-model.md §3).

/// The weak ridge, as a share of `strength`.
const RIDGE: f64 = 1e-3;

/// `θ`, or None when the system is singular (no samples and no prior weight).
pub fn solve<const K: usize>(
    xtx: &[[f64; K]; K],
    xty: &[f64; K],
    weight: f64,
    prior: &[f64; K],
    strength: f64,
) -> Option<[f64; K]> {
    // The samples' mean features: the first row of XᵀX over the weight (feature 0 is 1).
    let mut mean = [0.0; K];
    mean[0] = 1.0;
    if weight > 0.0 {
        for (m, v) in mean.iter_mut().zip(&xtx[0]).skip(1) {
            *m = v / weight;
        }
    }
    let at_mean: f64 = prior.iter().zip(&mean).map(|(p, m)| p * m).sum();
    let mut a = *xtx;
    let mut b = *xty;
    for i in 0..K {
        for j in 0..K {
            a[i][j] += strength * mean[i] * mean[j];
        }
        a[i][i] += strength * RIDGE;
        b[i] += strength * (mean[i] * at_mean + RIDGE * prior[i]);
    }
    gauss(a, b)
}

/// Gaussian elimination with partial pivoting on a `K`×`K` system (K ≤ 4 here: a few dozen
/// multiplications).
fn gauss<const K: usize>(mut a: [[f64; K]; K], mut b: [f64; K]) -> Option<[f64; K]> {
    for col in 0..K {
        let pivot = (col..K).max_by(|&r, &s| a[r][col].abs().total_cmp(&a[s][col].abs()))?;
        if a[pivot][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        let (done, rest) = a.split_at_mut(col + 1);
        let top = &done[col];
        for (offset, row) in rest.iter_mut().enumerate() {
            let f = row[col] / top[col];
            for (v, t) in row.iter_mut().zip(top).skip(col) {
                *v -= f * t;
            }
            b[col + 1 + offset] -= f * b[col];
        }
    }
    let mut x = [0.0; K];
    for row in (0..K).rev() {
        let tail: f64 = (row + 1..K).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - tail) / a[row][row];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}
