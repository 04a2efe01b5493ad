//! What a latency-aware route's requests share with its merges: the models of one (route,
//! cluster) key namespace (Higress) or route config (plain Envoy), whether a merge of them is
//! out, the batches of samples not yet known to be merged (Higress), and what both builds do
//! with a merge's outcome.

use crate::balancer::telemetry::Telemetry;
use crate::config::latency::LatencySettings;
use crate::host::{Host, LogLevel};
use crate::latency::{Book, Prior};
use crate::stats::Counter;
use std::cell::{Cell, RefCell};
use std::fmt;
use std::rc::Rc;

/// How many samples' weight the prior carries (docs/latency-model.md §3): a pod's own fit takes
/// over within its first few dozen answers.
const PRIOR_STRENGTH: f64 = 8.0;

/// The prior of a route's models: the prefill rate the token gate starts from and the
/// configured TPOT.
pub fn prior(settings: &LatencySettings, start_rate: u64) -> Prior {
    Prior::from_rates(start_rate as f64, settings.prior_tpot_ms, PRIOR_STRENGTH)
}

#[derive(Clone)]
pub struct Shared {
    pub book: Rc<RefCell<Book>>,
    merging: Rc<Cell<bool>>,
    pub outbox: Rc<RefCell<Outbox>>,
}

use crate::redis::scripts::latency::{Batch, Record};

/// Batches of samples sent and not yet known merged, each under its sequence number. A merge
/// whose reply was lost may still have run: its batch is sent again under the same number,
/// and the script applies each sender's numbers once (latency_merge.lua), so a Redis stall
/// neither loses samples nor counts them twice.
#[derive(Debug, Default)]
pub struct Outbox {
    /// This worker's name in the fleet's records (unique across VMs and gateways).
    pub sender: String,
    next_seq: u64,
    pub pending: Vec<Batch>,
}

/// Batches kept while merges fail: past it the oldest is dropped (a long outage forgets the
/// oldest samples, not the newest).
pub const MAX_PENDING: usize = 8;

impl Outbox {
    /// Files `records` (if any) as the next batch; how many old batches were dropped for it.
    pub fn file(&mut self, records: Vec<Record>) -> usize {
        if records.is_empty() {
            return 0;
        }
        self.next_seq += 1;
        self.pending.push((self.next_seq, records));
        let over = self.pending.len().saturating_sub(MAX_PENDING);
        self.pending.drain(..over);
        over
    }

    /// The merge that carried every pending batch succeeded.
    pub fn delivered(&mut self) {
        self.pending.clear();
    }
}

/// Short: holdings print in logs and panics' messages, and a derived print of the models would
/// cost the module kilobytes (docs/plugin-cpu.md, the 1 MiB guard).
impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Shared")
    }
}

impl Shared {
    pub fn new(book: Book, sender: String) -> Shared {
        Shared {
            book: Rc::new(RefCell::new(book)),
            merging: Rc::default(),
            outbox: Rc::new(RefCell::new(Outbox {
                sender,
                ..Outbox::default()
            })),
        }
    }

    /// Whether a merge is out (a second waits for its reply).
    pub fn merging(&self) -> bool {
        self.merging.get()
    }

    pub fn set_merging(&self, out: bool) {
        self.merging.set(out);
    }

    /// A merge's outcome, alike in both builds: the fleet's records become the models
    /// (counted, and each pod's prediction errors published), or the failure is counted. What
    /// a failed merge's samples become is the build's: the Higress outbox sends them again,
    /// the plain-Envoy merge puts them back in the book.
    pub fn settle(
        &self,
        host: &mut dyn Host,
        tel: &mut Telemetry,
        fleet: Result<Vec<Record>, String>,
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
