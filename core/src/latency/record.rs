//! The fleet's latency records as one text, for the plain-Envoy build's per-proxy merge
//! (docs/latency-model.md §5 "Sharing"): where the Higress build's workers add their samples to
//! a Redis hash (latency_merge.lua), a proxy's workers add theirs to one shared-data record per
//! route config, with the same rules: records add elementwise, and fade once per record by
//! 0.5^(elapsed / half-life) from its stamp, whoever merges. Pure: the compare-and-swap update
//! around it is the caller's.
//!
//! The text: a line `@t <ms>` (when the records last faded), then one line per pod,
//! `<pod> <numbers, comma-separated>` (`Book::take_unsent`'s records). A line that does not
//! read is dropped.

use super::book::REPLACE;
use super::model::TTFT_K;
use super::stats::field_count;

/// The most pods one record keeps: past it, the ones with the least weight left are dropped
/// (a route lists tens of pods; this bounds a record whose pods keep changing).
pub const MAX_PODS: usize = 256;
/// A record whose samples weigh less than this is dropped when it fades: its pod has not
/// answered for ten half-lives (as latency_merge.lua).
const FADED: f64 = 0.001;
/// Where a record's weight is: the TTFT statistics' weight (stats.rs `to_fields`).
const WEIGHT: usize = field_count(TTFT_K) - 2;

/// One route config's records, read from their text.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fleet {
    /// When the records last faded (ms); None: never merged.
    pub stamp_ms: Option<u64>,
    pub pods: Vec<(String, Vec<f64>)>,
}

impl Fleet {
    pub fn parse(text: &[u8]) -> Fleet {
        let mut fleet = Fleet::default();
        for line in String::from_utf8_lossy(text).lines() {
            let Some((name, value)) = line.split_once(' ') else {
                continue;
            };
            if name == "@t" {
                fleet.stamp_ms = value.parse().ok();
                continue;
            }
            let numbers: Result<Vec<f64>, _> = value.split(',').map(str::parse::<f64>).collect();
            match numbers {
                Ok(v) if v.iter().all(|x| x.is_finite()) => fleet.pods.push((name.into(), v)),
                _ => {}
            }
        }
        fleet
    }

    /// Fades the records (at most every hundredth of a half-life: the first merge after that
    /// applies the whole time since the stamp), then adds `sent` (a pod's numbers to its
    /// record's, or as its record when it has none of that length or its name carries
    /// `REPLACE`), then keeps the [`MAX_PODS`] that weigh most.
    pub fn merge(&mut self, sent: &[(String, Vec<f64>)], now_ms: u64, half_life_ms: u64) {
        match self.stamp_ms {
            Some(t) if t <= now_ms => {
                let elapsed = (now_ms - t) as f64;
                if elapsed >= half_life_ms as f64 / 100.0 {
                    let f = 0.5f64.powf(elapsed / half_life_ms.max(1) as f64);
                    for (_, v) in self.pods.iter_mut() {
                        v.iter_mut().for_each(|x| *x *= f);
                    }
                    self.pods
                        .retain(|(_, v)| v.get(WEIGHT).is_some_and(|&w| w >= FADED));
                    self.stamp_ms = Some(now_ms);
                }
            }
            _ => self.stamp_ms = Some(now_ms),
        }
        for (name, add) in sent {
            if add.iter().any(|x| !x.is_finite()) {
                continue;
            }
            // A pod whose model started again (book.rs `REPLACE`): its record is replaced.
            let (pod, replace) = match name.strip_prefix(REPLACE) {
                Some(p) => (p, true),
                None => (name.as_str(), false),
            };
            match self.pods.iter_mut().find(|(p, _)| p == pod) {
                Some((_, cur)) if cur.len() == add.len() && !replace => {
                    cur.iter_mut().zip(add).for_each(|(c, a)| *c += a);
                }
                Some((_, cur)) => *cur = add.clone(),
                None => self.pods.push((pod.to_string(), add.clone())),
            }
        }
        while self.pods.len() > MAX_PODS {
            let weight = |v: &Vec<f64>| v.get(WEIGHT).copied().unwrap_or(0.0);
            let lightest = (0..self.pods.len())
                .min_by(|&a, &b| weight(&self.pods[a].1).total_cmp(&weight(&self.pods[b].1)));
            match lightest {
                Some(i) => self.pods.swap_remove(i),
                None => break,
            };
        }
    }

    /// The text [`Fleet::parse`] reads. Numbers in their shortest round-trip form.
    pub fn encode(&self) -> Vec<u8> {
        use std::fmt::Write;
        let mut out = String::new();
        if let Some(t) = self.stamp_ms {
            let _ = writeln!(out, "@t {t}");
        }
        for (pod, v) in &self.pods {
            out.push_str(pod);
            for (i, x) in v.iter().enumerate() {
                out.push(if i == 0 { ' ' } else { ',' });
                let _ = write!(out, "{x}");
            }
            out.push('\n');
        }
        out.into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::latency::book::RECORD_FIELDS;

    fn record(weight: f64) -> Vec<f64> {
        let mut v = vec![0.5; RECORD_FIELDS];
        v[WEIGHT] = weight;
        v
    }

    #[test]
    fn records_add_and_read_back_exactly() {
        let mut f = Fleet::default();
        f.merge(&[("a:1".into(), record(2.0))], 1_000, 60_000);
        f.merge(
            &[("a:1".into(), record(3.0)), ("b:1".into(), record(1.0))],
            1_100,
            60_000,
        );
        assert_eq!(f.stamp_ms, Some(1_000), "a tenth of a hundredth: not faded");
        let back = Fleet::parse(&f.encode());
        assert_eq!(back, f);
        assert_eq!(back.pods[0].1[WEIGHT], 5.0);
        assert_eq!(back.pods[0].1[0], 1.0);
        assert_eq!(back.pods[1].0, "b:1");
    }

    #[test]
    fn records_fade_once_by_the_half_life_and_faded_ones_go() {
        let mut f = Fleet::default();
        f.merge(
            &[("a".into(), record(8.0)), ("b".into(), record(0.01))],
            0,
            1_000,
        );
        f.merge(&[], 2_000, 1_000);
        assert_eq!(f.stamp_ms, Some(2_000));
        assert_eq!(f.pods.len(), 2);
        assert!((f.pods[0].1[WEIGHT] - 2.0).abs() < 1e-12);
        // Five more half-lives: b's weight falls under a thousandth and it goes.
        f.merge(&[], 7_000, 1_000);
        assert_eq!(f.pods.len(), 1);
        assert!((f.pods[0].1[WEIGHT] - 2.0 / 32.0).abs() < 1e-12);
        // A stamp from the future (another clock) is reset, nothing faded.
        f.stamp_ms = Some(99_000);
        f.merge(&[], 8_000, 1_000);
        assert_eq!(f.stamp_ms, Some(8_000));
        assert!((f.pods[0].1[WEIGHT] - 2.0 / 32.0).abs() < 1e-12);
    }

    #[test]
    fn garbage_is_dropped_and_the_record_stays_bounded() {
        let text = b"@t 5\nbad line\np1 1,2,x\np2 1,NaN\np3 1,2\n\n@t nope\n";
        let f = Fleet::parse(text);
        assert_eq!(f.pods, vec![("p3".to_string(), vec![1.0, 2.0])]);
        assert_eq!(f.stamp_ms, None, "the last stamp line did not read");
        let mut f = Fleet::default();
        let many: Vec<(String, Vec<f64>)> = (0..MAX_PODS + 10)
            .map(|i| (format!("p{i}"), record(1.0 + i as f64)))
            .collect();
        f.merge(&many, 0, 1_000);
        assert_eq!(f.pods.len(), MAX_PODS);
        assert!(
            f.pods.iter().all(|(_, v)| v[WEIGHT] > 10.5),
            "the lightest went"
        );
        // A record of another length is replaced, a non-finite one not sent.
        f.merge(&[("p20".into(), vec![1.0; 3])], 1, 1_000);
        assert_eq!(f.pods.iter().find(|(p, _)| p == "p20").unwrap().1.len(), 3);
        f.merge(&[("p21".into(), vec![f64::INFINITY; 3])], 2, 1_000);
        assert_ne!(f.pods.iter().find(|(p, _)| p == "p21").unwrap().1.len(), 3);
        // A pod whose model started again replaces its record.
        f.merge(&[("!p22".into(), record(0.5))], 3, 1_000);
        let p22 = &f.pods.iter().find(|(p, _)| p == "p22").unwrap().1;
        assert_eq!(p22[WEIGHT], 0.5);
        assert!(f.pods.iter().all(|(p, _)| !p.starts_with('!')));
    }
}
