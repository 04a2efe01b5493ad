//! What a latency-aware route's requests share with its merges: the models of one (route,
//! cluster) key namespace, whether a merge of them is out, and the batches of samples not yet
//! known to be merged.

use crate::latency::Book;
use std::cell::{Cell, RefCell};
use std::fmt;
use std::rc::Rc;

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
}
