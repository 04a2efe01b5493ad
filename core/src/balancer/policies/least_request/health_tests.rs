//! Failure memory's rules per proxy (health.rs), one by one, over a counts record's lines.

use super::health::{expire, Learnt, Lesson, Memory, Out};
use crate::config::Ejection;
use std::collections::HashMap;

const A: &str = "10.0.0.1:80";
const B: &str = "10.0.0.2:80";
const C: &str = "10.0.0.3:80";
const D: &str = "10.0.0.4:80";

fn pool() -> Vec<String> {
    [A, B, C, D].iter().map(|e| e.to_string()).collect()
}

fn rules(eject_after: u64) -> Ejection {
    Ejection {
        eject_after,
        ejection_ms: 1_000,
        max_ejection_ms: 5_000,
        max_ejected_percent: 50,
        half_open_trials: 1,
        failure_penalty_ms: 1_000,
    }
}

fn at(rules: &Ejection, now: u64) -> Memory<'_> {
    Memory { rules, now }
}

/// `lesson` learned of `endpoint` (not a trial request) in the four-endpoint pool.
fn learn(m: Memory<'_>, counts: &mut HashMap<String, u64>, endpoint: &str, l: Lesson) -> Learnt {
    m.learn(counts, (endpoint, 4), false, l)
}

fn passed(out: &Out) -> Vec<bool> {
    out.passed.clone()
}

#[test]
fn the_nth_failure_in_a_row_ejects_and_an_answer_in_between_starts_over() {
    let r = rules(3);
    let mut counts = HashMap::new();
    let m = at(&r, 10_000);
    assert_eq!(learn(m, &mut counts, A, Lesson::Failed), Learnt::Kept);
    assert_eq!(learn(m, &mut counts, A, Lesson::Failed), Learnt::Kept);
    // A 4xx or 2xx answer ends the run.
    assert_eq!(learn(m, &mut counts, A, Lesson::Answered), Learnt::Kept);
    assert_eq!(learn(m, &mut counts, A, Lesson::Failed), Learnt::Kept);
    assert_eq!(learn(m, &mut counts, A, Lesson::Failed), Learnt::Kept);
    // Nothing learned (the client left) does not break it.
    assert_eq!(learn(m, &mut counts, A, Lesson::Nothing), Learnt::Kept);
    assert_eq!(learn(m, &mut counts, A, Lesson::Failed), Learnt::Ejected);
    assert_eq!(counts.get(&format!("~e{A}")), Some(&11_000));
    assert!(!counts.contains_key(&format!("~f{A}")));
    // Out already: a request sent before the ejection neither extends nor repeats it.
    assert_eq!(learn(m, &mut counts, A, Lesson::Failed), Learnt::Kept);
    assert_eq!(counts.get(&format!("~e{A}")), Some(&11_000));
    let out = m.out(&mut counts, &pool());
    assert_eq!(passed(&out), vec![true, false, false, false]);
    assert!(!out.fail_open);
}

#[test]
fn a_pod_envoy_retried_away_from_is_ejected_at_once() {
    let r = rules(5);
    let mut counts = HashMap::new();
    let m = at(&r, 0);
    assert_eq!(learn(m, &mut counts, B, Lesson::Unreached), Learnt::Ejected);
    assert!(Lesson::Unreached.failed() && Lesson::Failed.failed());
    assert!(!Lesson::Answered.failed() && !Lesson::Nothing.failed());
}

#[test]
fn at_most_max_ejected_percent_of_the_pool_is_out_and_the_refusal_keeps_the_failures() {
    let r = rules(1);
    let mut counts = HashMap::new();
    let m = at(&r, 0);
    // 50% of 4: two.
    assert_eq!(learn(m, &mut counts, A, Lesson::Failed), Learnt::Ejected);
    assert_eq!(learn(m, &mut counts, B, Lesson::Unreached), Learnt::Ejected);
    assert_eq!(learn(m, &mut counts, C, Lesson::Failed), Learnt::Refused);
    assert_eq!(counts.get(&format!("~f{C}")), Some(&1));
    assert!(!counts.contains_key(&format!("~e{C}")));
    // Once one's ejection is over, the next failure of the refused one ejects it.
    let later = at(&r, 1_000);
    assert_eq!(
        learn(later, &mut counts, C, Lesson::Failed),
        Learnt::Ejected
    );
    // At least one, however small the pool and the share.
    let small = Ejection {
        max_ejected_percent: 1,
        ..r
    };
    let mut counts = HashMap::new();
    let m = at(&small, 0);
    assert_eq!(
        m.learn(&mut counts, (A, 2), false, Lesson::Failed),
        Learnt::Ejected
    );
    assert_eq!(
        m.learn(&mut counts, (B, 2), false, Lesson::Failed),
        Learnt::Refused
    );
}

#[test]
fn the_backoff_doubles_with_each_ejection_up_to_the_cap_and_halves_on_recovery() {
    let r = rules(1);
    let mut counts = HashMap::new();
    let mut now = 0;
    let mut lengths = Vec::new();
    for _ in 0..5 {
        let m = at(&r, now);
        assert_eq!(learn(m, &mut counts, A, Lesson::Failed), Learnt::Ejected);
        let until = counts[&format!("~e{A}")];
        lengths.push(until - now);
        // Its time up, the next pick puts it on trial; the trial fails.
        now = until;
        at(&r, now).out(&mut counts, &pool());
        assert_eq!(counts.get(&format!("~o{A}")), Some(&0));
    }
    assert_eq!(lengths, vec![1_000, 2_000, 4_000, 5_000, 5_000]);
    assert_eq!(counts[&format!("~n{A}")], 5);
    // An answer on trial brings it back; the exponent halves (5 -> 2): the next ejection
    // lasts 1 s x 2^2.
    assert_eq!(
        learn(at(&r, now), &mut counts, A, Lesson::Answered),
        Learnt::Kept
    );
    assert!(!counts.contains_key(&format!("~o{A}")));
    assert_eq!(counts[&format!("~n{A}")], 2);
    assert_eq!(
        learn(at(&r, now), &mut counts, A, Lesson::Failed),
        Learnt::Ejected
    );
    assert_eq!(counts[&format!("~e{A}")] - now, 4_000);
    // Recovered twice over, nothing of it is left.
    let mut counts = HashMap::from([(format!("~n{B}"), 1), (format!("~o{B}"), 0)]);
    learn(at(&r, 0), &mut counts, B, Lesson::Answered);
    assert!(counts.is_empty(), "{counts:?}");
}

#[test]
fn half_open_trials_are_taken_one_by_one_and_a_failure_on_trial_ejects_again() {
    let r = Ejection {
        half_open_trials: 2,
        ..rules(5)
    };
    let mut counts = HashMap::from([(format!("~e{A}"), 1_000), (format!("~n{A}"), 1)]);
    // Still ejected before its time.
    let out = at(&r, 999).out(&mut counts, &pool());
    assert_eq!(passed(&out), vec![true, false, false, false]);
    // Its time up: on trial, open for two requests.
    let m = at(&r, 1_000);
    assert_eq!(m.out(&mut counts, &pool()), Out::default());
    assert!(m.tried(&mut counts, A));
    assert!(!m.tried(&mut counts, B), "B is not on trial");
    assert_eq!(m.out(&mut counts, &pool()), Out::default());
    assert!(m.tried(&mut counts, A));
    // Both trials in flight: passed over until one answers.
    assert!(passed(&m.out(&mut counts, &pool()))[0]);
    // A trial that taught nothing (the client left) gives its trial back.
    assert_eq!(
        m.learn(&mut counts, (A, 4), true, Lesson::Nothing),
        Learnt::Kept
    );
    assert_eq!(m.out(&mut counts, &pool()), Out::default());
    // The other fails: ejected again at once, for twice as long.
    assert_eq!(
        m.learn(&mut counts, (A, 4), true, Lesson::Failed),
        Learnt::Ejected
    );
    assert_eq!(counts[&format!("~e{A}")], 1_000 + 2_000);
    assert!(!counts.contains_key(&format!("~o{A}")));
}

#[test]
fn with_every_endpoint_out_the_pick_fails_open() {
    let r = Ejection {
        max_ejected_percent: 100,
        ..rules(1)
    };
    let mut counts = HashMap::new();
    let m = at(&r, 0);
    for e in pool() {
        assert_eq!(learn(m, &mut counts, &e, Lesson::Failed), Learnt::Ejected);
    }
    let out = m.out(&mut counts, &pool());
    assert_eq!(
        out,
        Out {
            passed: Vec::new(),
            fail_open: true
        }
    );
    // On trial with its trials taken counts as out too.
    let mut counts = HashMap::from([(format!("~o{A}"), 1)]);
    let out = m.out(&mut counts, &[A.to_string()]);
    assert!(out.fail_open && out.passed.is_empty());
    // Nothing learned: nothing passed over, no fail-open.
    assert_eq!(m.out(&mut HashMap::new(), &pool()), Out::default());
}

#[test]
fn a_failed_requests_count_is_held_for_the_penalty_then_given_back() {
    let r = rules(5);
    let mut counts = HashMap::from([(A.to_string(), 3)]);
    let m = at(&r, 10_030);
    // Two failures close together share a line (rounded up to a 100 ms slice).
    assert!(m.hold(&mut counts, A, 1));
    assert!(at(&r, 10_050).hold(&mut counts, A, 2));
    assert_eq!(counts.get(&format!("~h{A}@11100")), Some(&3));
    expire(&mut counts, 11_099);
    assert_eq!(counts[A], 3, "held until its time");
    expire(&mut counts, 11_100);
    assert_eq!(counts, HashMap::from([(A.to_string(), 0)]));
    // No penalty: nothing held, the caller gives the count back.
    let none = Ejection {
        failure_penalty_ms: 0,
        ..r
    };
    assert!(!at(&none, 0).hold(&mut counts, A, 1));
    // A line that does not read is dropped, and never takes a count below zero.
    let mut counts = HashMap::from([(format!("~h{A}@x"), 5), (A.to_string(), 2)]);
    expire(&mut counts, 0);
    assert_eq!(counts, HashMap::from([(A.to_string(), 0)]));
}
