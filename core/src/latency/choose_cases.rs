//! The placement rule's cases (choose.rs), as a table both builds are held to: choose.rs's unit
//! test runs it through [`super::choose`], core/tests/redis_latency.rs through
//! prefix_acquire.lua (each pod's prediction set as constant coefficients, its load as its
//! count, an ineligible pod at the cap).

/// What the rule must answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    Place(usize),
    Shed,
    /// No pod may take the request (the caller decides as without the model).
    Nothing,
}

pub struct Case {
    pub says: &'static str,
    /// Per pod, by position: predicted TTFT (ms), predicted TPOT (ms), load, eligible.
    pub pods: &'static [(f64, f64, u64, bool)],
    pub warm: Option<usize>,
    /// The request's objectives (TTFT, TPOT; ms, 0 = none).
    pub slo: (u64, u64),
    pub penalty_ms: u64,
    pub shed_draw: Option<f64>,
    pub want: Want,
}

const NONE: (u64, u64) = (0, 0);

pub const CASES: &[Case] = &[
    Case {
        says: "without objectives the lowest predicted TTFT wins",
        pods: &[
            (300.0, 20.0, 0, true),
            (100.0, 90.0, 3, true),
            (200.0, 20.0, 0, true),
        ],
        warm: None,
        slo: NONE,
        penalty_ms: 0,
        shed_draw: None,
        want: Want::Place(1),
    },
    Case {
        says: "equal predictions: the lower load, then the first listed",
        pods: &[
            (100.0, 20.0, 2, true),
            (100.0, 20.0, 1, true),
            (100.0, 20.0, 1, true),
        ],
        warm: None,
        slo: NONE,
        penalty_ms: 0,
        shed_draw: None,
        want: Want::Place(1),
    },
    Case {
        says: "an ineligible pod is never chosen, however fast",
        pods: &[
            (10.0, 20.0, 0, false),
            (300.0, 20.0, 0, true),
            (200.0, 20.0, 0, true),
        ],
        warm: None,
        slo: NONE,
        penalty_ms: 0,
        shed_draw: None,
        want: Want::Place(2),
    },
    Case {
        says: "no pod eligible: nothing",
        pods: &[(10.0, 20.0, 0, false), (20.0, 20.0, 0, false)],
        warm: Some(0),
        slo: (1_000, 0),
        penalty_ms: 0,
        shed_draw: Some(0.0),
        want: Want::Nothing,
    },
    Case {
        says: "without objectives the warm pod is kept within the penalty of the best",
        pods: &[(100.0, 20.0, 0, true), (600.0, 20.0, 0, true)],
        warm: Some(1),
        slo: NONE,
        penalty_ms: 500,
        shed_draw: None,
        want: Want::Place(1),
    },
    Case {
        says: "without objectives the warm pod past the penalty is left for the best",
        pods: &[(100.0, 20.0, 0, true), (601.0, 20.0, 0, true)],
        warm: Some(1),
        slo: NONE,
        penalty_ms: 500,
        shed_draw: None,
        want: Want::Place(0),
    },
    Case {
        says: "an ineligible warm pod is not kept",
        pods: &[(300.0, 20.0, 0, true), (100.0, 20.0, 0, false)],
        warm: Some(1),
        slo: NONE,
        penalty_ms: 500,
        shed_draw: None,
        want: Want::Place(0),
    },
    Case {
        says: "with objectives the warm pod is kept while it meets them, not only when best",
        pods: &[(100.0, 20.0, 0, true), (900.0, 20.0, 0, true)],
        warm: Some(1),
        slo: (1_000, 0),
        penalty_ms: 0,
        shed_draw: None,
        want: Want::Place(1),
    },
    Case {
        says: "with objectives a warm pod missing one is left for the most room",
        pods: &[
            (400.0, 20.0, 0, true),
            (1_100.0, 20.0, 0, true),
            (300.0, 45.0, 0, true),
        ],
        warm: Some(1),
        slo: (1_000, 50),
        penalty_ms: 10_000,
        shed_draw: None,
        want: Want::Place(0),
    },
    Case {
        says: "the key is the larger share: a pod fast to first token but over the TPOT \
               objective loses to one within both",
        pods: &[(100.0, 80.0, 0, true), (700.0, 30.0, 0, true)],
        warm: None,
        slo: (1_000, 50),
        penalty_ms: 0,
        shed_draw: None,
        want: Want::Place(1),
    },
    Case {
        says: "a TPOT objective alone ranks by TPOT",
        pods: &[(100.0, 40.0, 0, true), (5_000.0, 10.0, 0, true)],
        warm: None,
        slo: (0, 50),
        penalty_ms: 0,
        shed_draw: None,
        want: Want::Place(1),
    },
    Case {
        says: "every pod misses: a sheddable request is shed when the draw is under 1 - 1/miss",
        pods: &[(2_000.0, 20.0, 0, true), (3_000.0, 20.0, 0, true)],
        warm: None,
        slo: (1_000, 0),
        penalty_ms: 0,
        shed_draw: Some(0.4),
        want: Want::Shed,
    },
    Case {
        says: "every pod misses: a draw over 1 - 1/miss places it where it misses least",
        pods: &[(2_000.0, 20.0, 0, true), (3_000.0, 20.0, 0, true)],
        warm: None,
        slo: (1_000, 0),
        penalty_ms: 0,
        shed_draw: Some(0.6),
        want: Want::Place(0),
    },
    Case {
        says: "a request that is not sheddable is placed whatever the miss",
        pods: &[(50_000.0, 20.0, 0, true), (90_000.0, 20.0, 0, true)],
        warm: Some(1),
        slo: (1_000, 0),
        penalty_ms: 0,
        shed_draw: None,
        want: Want::Place(0),
    },
    Case {
        says: "a pod meeting the objectives: never shed",
        pods: &[(2_000.0, 20.0, 0, true), (900.0, 20.0, 0, true)],
        warm: None,
        slo: (1_000, 0),
        penalty_ms: 0,
        shed_draw: Some(0.0),
        want: Want::Place(1),
    },
    Case {
        says: "without objectives nothing is shed",
        pods: &[(90_000.0, 20.0, 0, true)],
        warm: None,
        slo: NONE,
        penalty_ms: 0,
        shed_draw: Some(0.0),
        want: Want::Place(0),
    },
];
