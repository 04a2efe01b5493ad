//! What a latency-aware route's requests share with its merges: the models of one (route,
//! cluster) key namespace (Higress) or route config (plain Envoy), whether a merge of them is
//! out, and what both builds do with a merge's outcome.

use crate::balancer::telemetry::Telemetry;
use crate::config::latency::LatencySettings;
use crate::host::{Host, LogLevel};
use crate::latency::{Book, Prior};
use crate::stats::Counter;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// How many samples' weight the prior carries (docs/latency-model.md §3): a pod's own fit takes
/// over within its first few dozen answers.
const PRIOR_STRENGTH: f64 = 8.0;

/// The prior of a route's models: the prefill rate the token gate starts from and the
/// configured TPOT.
pub fn prior(settings: &LatencySettings, start_rate: u64) -> Prior {
    Prior::from_rates(start_rate as f64, settings.prior_tpot_ms, PRIOR_STRENGTH)
}

#[derive(Debug, Clone)]
pub struct Shared {
    pub book: Rc<RefCell<Book>>,
    merging: Rc<Cell<bool>>,
}

impl Shared {
    pub fn new(book: Book) -> Shared {
        Shared {
            book: Rc::new(RefCell::new(book)),
            merging: Rc::default(),
        }
    }

    /// Whether a merge is out (a second waits for its reply).
    pub fn merging(&self) -> bool {
        self.merging.get()
    }

    pub fn set_merging(&self, out: bool) {
        self.merging.set(out);
    }

    /// A merge's outcome: the fleet's records become the models (counted, and each pod's
    /// prediction errors published), or, when it failed, the records it took (`sent`) are kept
    /// for the next one (counted): a failed merge delays sharing and loses nothing.
    pub fn settle(
        &self,
        host: &mut dyn Host,
        tel: &mut Telemetry,
        fleet: Result<Vec<(String, Vec<f64>)>, String>,
        sent: &[(String, Vec<f64>)],
    ) {
        let Ok(mut book) = self.book.try_borrow_mut() else {
            return;
        };
        match fleet {
            Ok(fleet) => {
                book.merged(&fleet);
                tel.inc(host, Counter::LatencyMerges);
                let pct = |e: Option<f64>| e.map(|e| (e * 100.0).round() as i64);
                let errors: Vec<(String, [Option<i64>; 2])> = book
                    .errors()
                    .into_iter()
                    .map(|(pod, t, p)| (pod.to_string(), [pct(t), pct(p)]))
                    .collect();
                drop(book);
                for (pod, values) in errors {
                    tel.latency_pods.set(host, &pod, values);
                }
            }
            Err(e) => {
                book.restore(sent);
                tel.inc(host, Counter::LatencyMergeFailures);
                tel.log(
                    host,
                    LogLevel::Debug,
                    0,
                    format_args!("latency merge failed ({e}): its samples go with the next one"),
                );
            }
        }
    }
}
