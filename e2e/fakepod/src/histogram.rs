//! A Prometheus histogram as the engines' `prometheus_client` keeps one: fixed upper bounds,
//! a count per bucket, the sum of what was observed; exposed as cumulative `_bucket{le=...}`
//! series (the last one `le="+Inf"`), then `_count` and `_sum`.

use std::fmt::Write;

#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    /// Upper bounds, increasing (`+Inf` is implied after the last).
    bounds: &'static [f64],
    /// Observations per bucket, not cumulative; one more than `bounds`, the last for `+Inf`.
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        debug_assert!(
            bounds.windows(2).all(|w| w[0] < w[1]),
            "bounds must increase"
        );
        Self {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
        }
    }

    pub fn observe(&mut self, v: f64) {
        self.observe_n(v, 1);
    }

    /// `n` observations of `v` (a step that made `n` tokens, each taking `v`).
    pub fn observe_n(&mut self, v: f64, n: u64) {
        if n == 0 || v.is_nan() {
            return;
        }
        // prometheus_client counts `v` in the first bucket whose bound is >= v.
        let i = self
            .bounds
            .iter()
            .position(|b| v <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i] += n;
        self.sum += v * n as f64;
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub fn sum(&self) -> f64 {
        self.sum
    }

    pub fn bounds(&self) -> &'static [f64] {
        self.bounds
    }

    /// Adds `other`'s observations (same bounds): one series for what several engines saw.
    pub fn merge(&mut self, other: &Histogram) {
        debug_assert_eq!(self.bounds, other.bounds);
        for (c, o) in self.counts.iter_mut().zip(&other.counts) {
            *c += o;
        }
        self.sum += other.sum;
    }

    /// Forgets every observation.
    pub fn clear(&mut self) {
        self.counts.iter_mut().for_each(|c| *c = 0);
        self.sum = 0.0;
    }

    /// `(upper bound, observations at or below it)`, `+Inf` last.
    pub fn cumulative(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        let bounds = self.bounds.iter().copied().chain([f64::INFINITY]);
        bounds.zip(&self.counts).scan(0, |acc, (b, c)| {
            *acc += c;
            Some((b, *acc))
        })
    }

    /// Writes this series of family `name`: its buckets, `_count` and `_sum`, labelled with
    /// `labels` (values already escaped) and `le`, sorted by name as prometheus_client prints
    /// them (`{engine="0",le="0.5",model_name="m"}`).
    pub fn write_series(&self, out: &mut String, name: &str, labels: &[(&str, &str)]) {
        for (bound, n) in self.cumulative() {
            let le = le_value(bound);
            let mut with_le: Vec<(&str, &str)> = labels.to_vec();
            with_le.push(("le", &le));
            let _ = writeln!(
                out,
                "{name}_bucket{} {}",
                label_set(&with_le),
                float(n as f64)
            );
        }
        let set = label_set(labels);
        let _ = writeln!(out, "{name}_count{set} {}", float(self.count() as f64));
        let _ = writeln!(out, "{name}_sum{set} {}", float(self.sum));
    }
}

/// `# HELP` and `# TYPE` of a histogram family.
pub fn write_header(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
}

/// `{a="x",b="y"}` sorted by label name; nothing without labels.
fn label_set(labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let mut sorted = labels.to_vec();
    sorted.sort_by_key(|(k, _)| *k);
    let inner: Vec<String> = sorted.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    format!("{{{}}}", inner.join(","))
}

/// A bound as prometheus_client writes `le` (Python's float repr for these magnitudes:
/// `0.001`, `1.0`, `2560.0`; `+Inf`).
fn le_value(bound: f64) -> String {
    if bound.is_infinite() {
        "+Inf".into()
    } else {
        format!("{bound:?}")
    }
}

/// A sample value in Python's float style (`3.0`, `0.25`), as the rest of the page.
fn float(v: f64) -> String {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_le_inclusive() {
        let mut h = Histogram::new(&[0.1, 1.0, 2.5]);
        h.observe(0.1); // on the bound: counted in it
        h.observe(0.5);
        h.observe_n(3.0, 2);
        h.observe(f64::NAN);
        let got: Vec<_> = h.cumulative().collect();
        assert_eq!(
            got,
            [(0.1, 1), (1.0, 2), (2.5, 2), (f64::INFINITY, 4)].to_vec()
        );
        assert_eq!(h.count(), 4);
        assert!((h.sum() - 6.6).abs() < 1e-9);
        let mut page = String::new();
        write_header(&mut page, "x_seconds", "Histogram of x.");
        h.write_series(
            &mut page,
            "x_seconds",
            &[("model_name", "m"), ("engine", "0")],
        );
        assert!(page.contains("x_seconds_bucket{engine=\"0\",le=\"0.1\",model_name=\"m\"} 1.0\n"));
        assert!(page.contains("x_seconds_bucket{engine=\"0\",le=\"+Inf\",model_name=\"m\"} 4.0\n"));
        assert!(page.contains("x_seconds_count{engine=\"0\",model_name=\"m\"} 4.0\n"));
        assert!(page.contains("# TYPE x_seconds histogram\n"));
        let mut other = Histogram::new(&[0.1, 1.0, 2.5]);
        other.observe(2.0);
        h.merge(&other);
        assert_eq!(h.cumulative().nth(2), Some((2.5, 3)));
        h.clear();
        assert_eq!((h.count(), h.sum()), (0, 0.0));
    }
}
