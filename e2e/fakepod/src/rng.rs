//! Seeded randomness without a `rand` dependency: the project's one SplitMix64
//! (`ailb_core::hash`) plus the few distributions the load generator needs. Streams are derived from (seed, purpose, indices) so each request's
//! draws do not depend on how many draws other requests made — the plan stays reproducible when
//! a workload parameter elsewhere changes.

use ailb_core::hash::SplitMix64;
use anyhow::{bail, Context, Result};
use std::str::FromStr;

/// A SplitMix64 stream with the load generator's distributions on top.
#[derive(Clone, Debug)]
pub struct Rng(SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(SplitMix64(seed))
    }

    /// An independent stream for `(seed, path...)`.
    pub fn derive(seed: u64, path: &[u64]) -> Self {
        let mut r = Self::new(seed ^ 0x5851_f42d_4c95_7f2d);
        for p in path {
            let state = &mut r.0;
            state.0 ^= p.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            r.next_u64();
        }
        r
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [0, 1).
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.f64() < p
    }

    /// Exponential with the given rate (inter-arrival time of a Poisson process).
    pub fn exp(&mut self, rate: f64) -> f64 {
        -(1.0 - self.f64()).ln() / rate
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.f64();
        let u2 = self.f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// A size distribution for request lengths.
#[derive(Clone, Debug, PartialEq)]
pub enum Dist {
    Fixed(u64),
    /// Lognormal with the given median and sigma of the underlying normal.
    LogNormal {
        median: f64,
        sigma: f64,
    },
    /// Pareto with scale (minimum) and shape alpha (smaller alpha = heavier tail).
    Pareto {
        scale: f64,
        alpha: f64,
    },
}

impl Dist {
    /// One draw, clamped to `[min, max]`.
    pub fn sample(&self, rng: &mut Rng, min: u64, max: u64) -> u64 {
        let x = match *self {
            Dist::Fixed(n) => n as f64,
            Dist::LogNormal { median, sigma } => median * (sigma * rng.normal()).exp(),
            Dist::Pareto { scale, alpha } => scale / (1.0 - rng.f64()).powf(1.0 / alpha),
        };
        (x.round().max(0.0) as u64).clamp(min, max.max(min))
    }
}

impl FromStr for Dist {
    type Err = anyhow::Error;

    /// `fixed:N`, `lognormal:MEDIAN,SIGMA`, `pareto:SCALE,ALPHA`, or a bare number.
    fn from_str(s: &str) -> Result<Self> {
        let (kind, args) = s.split_once(':').unwrap_or(("fixed", s));
        let nums: Vec<f64> = args
            .split(',')
            .map(|a| a.trim().parse::<f64>())
            .collect::<Result<_, _>>()
            .with_context(|| format!("bad distribution {s:?}"))?;
        Ok(match (kind, nums.as_slice()) {
            ("fixed", [n]) => Dist::Fixed(*n as u64),
            ("lognormal", [m, sd]) => Dist::LogNormal {
                median: *m,
                sigma: *sd,
            },
            ("pareto", [sc, a]) if *a > 0.0 => Dist::Pareto {
                scale: *sc,
                alpha: *a,
            },
            _ => bail!(
                "bad distribution {s:?} (fixed:N | lognormal:MEDIAN,SIGMA | pareto:SCALE,ALPHA)"
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reproducible_and_heavy_tailed() {
        let a: Vec<u64> = (0..5).map(|_| Rng::derive(7, &[1, 2]).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(
            Rng::derive(7, &[1, 2]).next_u64(),
            Rng::derive(7, &[1, 3]).next_u64()
        );
        let d: Dist = "lognormal:100,1.0".parse().unwrap();
        let mut r = Rng::new(1);
        let mut xs: Vec<u64> = (0..2000).map(|_| d.sample(&mut r, 1, 100_000)).collect();
        xs.sort_unstable();
        let median = xs[1000] as f64;
        assert!((70.0..140.0).contains(&median), "median {median}");
        assert!(xs[1990] as f64 > 5.0 * median, "tail should be heavy");
        assert_eq!("fixed:5".parse::<Dist>().unwrap(), Dist::Fixed(5));
        assert!("pareto:1".parse::<Dist>().is_err());
        assert_eq!(Dist::Fixed(500).sample(&mut r, 1, 100), 100);
    }

    #[test]
    fn streams_are_pinned() {
        // Recorded before fakepod switched to ailb_core's SplitMix64: plans must not change.
        let mut r = Rng::derive(7, &[1, 2]);
        let got: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        assert_eq!(
            got,
            [
                912512325972322393,
                16247059772754057052,
                8086226621156116307
            ]
        );
        let mut r = Rng::new(1);
        assert_eq!(r.next_u64(), 10451216379200822465);
    }
}
