//! Failure memory in the plain-Envoy build, per proxy (docs/plain-envoy.md "Failure memory"):
//! the rules of the Higress build's scripts (health.lua, release.lua; docs/redis-data-model.md
//! §14) over lines of the counts record (counts.rs), so that the compare-and-swap update that
//! counts a pick or a release also checks and changes what the proxy learned:
//! - `~f<e> <n>`: the endpoint's failures in a row;
//! - `~n<e> <n>`: how often it was ejected (the backoff's exponent);
//! - `~e<e> <ms>`: ejected until then;
//! - `~o<e> <n>`: on trial (half-open), with this many trial requests in flight;
//! - `~h<e>@<ms> <cost>`: a failed request's count, held on the endpoint until then.
//!
//! Every line names an endpoint of the record's set, so the record stays bounded; held counts
//! go at the first update after their time.

use crate::config::Ejection;
use crate::redis::scripts::release::Learned;
use std::collections::HashMap;

const FAILURES: &str = "~f";
const EJECTIONS: &str = "~n";
const EJECTED: &str = "~e";
const TRIAL: &str = "~o";
const HELD: &str = "~h";

/// Held counts of one endpoint expiring within this share of `failurePenaltyMs` (at least
/// 100 ms) share a line: a pod failing fast adds at most 17 lines while its penalty lasts.
const HELD_SLICES: u64 = 16;
const HELD_SLICE_MIN_MS: u64 = 100;
/// The backoff doubles at most this many times (release.lua's cap on the exponent).
const MAX_DOUBLINGS: u64 = 20;

/// What a released request teaches about the endpoint it was counted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lesson {
    /// Not a 5xx (a 4xx is the client's): its failures in a row end, a trial succeeds.
    Answered,
    /// A 5xx, Envoy's own 503 / 504 for a connect failure, a reset or a timeout included.
    Failed,
    /// Envoy's retry answered from another endpoint: this one refused the connection or reset
    /// it, so it took no request at all; it is ejected at once (as the plain-Envoy build's
    /// down mark passed over it at once before failure memory).
    Unreached,
    /// No answer came through the count (the client left first, a failed publish).
    Nothing,
}

impl From<Learned> for Lesson {
    fn from(l: Learned) -> Lesson {
        match l {
            Learned::Answered => Lesson::Answered,
            Learned::Failed => Lesson::Failed,
            Learned::Nothing => Lesson::Nothing,
        }
    }
}

impl Lesson {
    /// Whether it counts as a failure of the endpoint (`ai_lb.eject.failures`, the penalty).
    pub fn failed(self) -> bool {
        matches!(self, Lesson::Failed | Lesson::Unreached)
    }
}

/// What learning did to the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Learnt {
    Kept,
    Ejected,
    /// It would have been ejected, but `maxEjectedPercent` of the pool was out already.
    Refused,
}

/// What a pick passes over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Out {
    /// By position: ejected, or on trial with its trials taken. Empty when none is, or when
    /// every endpoint is (then `fail_open`).
    pub passed: Vec<bool>,
    /// Every endpoint was out: the pick chooses as if none were (`ai_lb.eject.fail_open`).
    pub fail_open: bool,
}

/// A route's failure memory (`rules`, on) at `now` (ms).
#[derive(Debug, Clone, Copy)]
pub struct Memory<'a> {
    pub rules: &'a Ejection,
    pub now: u64,
}

impl Memory<'_> {
    /// Before a pick: the ejections whose time is up end, their endpoints on trial; then which
    /// of `endpoints` the pick passes over (health.lua `end_ejections`, and its marks).
    pub fn out(&self, counts: &mut HashMap<String, u64>, endpoints: &[String]) -> Out {
        if !counts
            .keys()
            .any(|k| k.starts_with(EJECTED) || k.starts_with(TRIAL))
        {
            return Out::default();
        }
        let ended: Vec<String> = counts
            .iter()
            .filter(|(k, &until)| k.starts_with(EJECTED) && until <= self.now)
            .filter_map(|(k, _)| k.strip_prefix(EJECTED).map(str::to_string))
            .collect();
        for e in ended {
            counts.remove(&format!("{EJECTED}{e}"));
            counts.insert(format!("{TRIAL}{e}"), 0);
        }
        let passed: Vec<bool> = endpoints
            .iter()
            .map(|e| {
                counts.contains_key(&format!("{EJECTED}{e}"))
                    || counts
                        .get(&format!("{TRIAL}{e}"))
                        .is_some_and(|&n| n >= self.rules.half_open_trials)
            })
            .collect();
        if passed.iter().all(|&p| p) {
            Out {
                passed: Vec::new(),
                fail_open: !passed.is_empty(),
            }
        } else if passed.iter().any(|&p| p) {
            Out {
                passed,
                fail_open: false,
            }
        } else {
            Out::default()
        }
    }

    /// After a pick of `endpoint`: whether the request is one of its trial requests (it is on
    /// trial), counted so.
    pub fn tried(&self, counts: &mut HashMap<String, u64>, endpoint: &str) -> bool {
        match counts.get_mut(&format!("{TRIAL}{endpoint}")) {
            Some(n) => {
                *n = n.saturating_add(1);
                true
            }
            None => false,
        }
    }

    /// What a released request teaches about `endpoint` (release.lua `learn`): an answer ends
    /// its failures in a row and its trial (the backoff's exponent halves); a failure on trial,
    /// the `ejectAfterFailures`th in a row, or one Envoy retried away from ejects it. A failure
    /// while it is ejected already neither extends nor repeats the ejection. A trial request
    /// (`trial`) that taught nothing gives its trial back. `pool`: the endpoints in the set.
    pub fn learn(
        &self,
        counts: &mut HashMap<String, u64>,
        (endpoint, pool): (&str, usize),
        trial: bool,
        lesson: Lesson,
    ) -> Learnt {
        let on_trial = format!("{TRIAL}{endpoint}");
        let failures = format!("{FAILURES}{endpoint}");
        match lesson {
            Lesson::Nothing => {
                if let (true, Some(n)) = (trial, counts.get_mut(&on_trial)) {
                    *n = n.saturating_sub(1);
                }
                Learnt::Kept
            }
            Lesson::Answered => {
                counts.remove(&failures);
                if counts.remove(&on_trial).is_some() {
                    let exponent = format!("{EJECTIONS}{endpoint}");
                    match counts.get(&exponent).map(|n| n / 2) {
                        Some(half) if half > 0 => counts.insert(exponent, half),
                        _ => counts.remove(&exponent),
                    };
                }
                Learnt::Kept
            }
            Lesson::Failed | Lesson::Unreached => {
                let trying = counts.contains_key(&on_trial);
                if !trying && counts.contains_key(&format!("{EJECTED}{endpoint}")) {
                    return Learnt::Kept;
                }
                let n = counts.entry(failures).or_insert(0);
                *n = n.saturating_add(1);
                if trying || lesson == Lesson::Unreached || *n >= self.rules.eject_after {
                    self.eject(counts, endpoint, pool)
                } else {
                    Learnt::Kept
                }
            }
        }
    }

    /// Ejects `endpoint` for a backoff that doubles with each ejection up to `maxEjectionMs`,
    /// unless `maxEjectedPercent` of the `pool` (at least one endpoint) is out already; a
    /// refused one keeps its failures, so its next failure asks again.
    fn eject(&self, counts: &mut HashMap<String, u64>, endpoint: &str, pool: usize) -> Learnt {
        let most = (pool as u64)
            .saturating_mul(self.rules.max_ejected_percent)
            .checked_div(100)
            .unwrap_or(0)
            .max(1);
        let out = counts
            .iter()
            .filter(|(k, &until)| k.starts_with(EJECTED) && until > self.now)
            .count() as u64;
        if out >= most {
            return Learnt::Refused;
        }
        let n = counts.entry(format!("{EJECTIONS}{endpoint}")).or_insert(0);
        *n = n.saturating_add(1);
        let doublings = n.saturating_sub(1).min(MAX_DOUBLINGS);
        let ms = self
            .rules
            .ejection_ms
            .saturating_mul(1 << doublings)
            .min(self.rules.max_ejection_ms);
        counts.insert(format!("{EJECTED}{endpoint}"), self.now.saturating_add(ms));
        counts.remove(&format!("{FAILURES}{endpoint}"));
        counts.remove(&format!("{TRIAL}{endpoint}"));
        Learnt::Ejected
    }

    /// A failed request's `cost` stays counted on `endpoint` for `failurePenaltyMs` (so a pod
    /// that fails fast does not look idle): a held line [`expire`] gives back. False when the
    /// penalty is 0: the caller gives the count back now.
    pub fn hold(&self, counts: &mut HashMap<String, u64>, endpoint: &str, cost: u64) -> bool {
        let penalty = self.rules.failure_penalty_ms;
        if penalty == 0 {
            return false;
        }
        let slice = (penalty / HELD_SLICES).max(HELD_SLICE_MIN_MS);
        let until = self
            .now
            .saturating_add(penalty)
            .div_ceil(slice)
            .saturating_mul(slice);
        let n = counts
            .entry(format!("{HELD}{endpoint}@{until}"))
            .or_insert(0);
        *n = n.saturating_add(cost);
        true
    }
}

/// Gives back the held counts whose time is up at `now`: each off its endpoint's count, its
/// line gone. Run by every update of the record, whatever the route's failure memory.
pub fn expire(counts: &mut HashMap<String, u64>, now: u64) {
    if !counts.keys().any(|k| k.starts_with(HELD)) {
        return;
    }
    let due: Vec<(String, u64)> = counts
        .iter()
        .filter(|(k, _)| k.starts_with(HELD))
        .filter(|(k, _)| {
            // A line that does not read is dropped too: nothing can give it back later.
            k.rsplit_once('@')
                .and_then(|(_, until)| until.parse::<u64>().ok())
                .is_none_or(|until| until <= now)
        })
        .map(|(k, &cost)| (k.clone(), cost))
        .collect();
    for (line, cost) in due {
        counts.remove(&line);
        let endpoint = line
            .strip_prefix(HELD)
            .and_then(|rest| rest.rsplit_once('@'))
            .map(|(e, _)| e);
        if let Some(n) = endpoint.and_then(|e| counts.get_mut(e)) {
            *n = n.saturating_sub(cost);
        }
    }
}
