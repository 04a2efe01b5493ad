//! What a latency-aware route's requests share with its merges: the models of one (route,
//! cluster) key namespace, and whether a merge of them is out.

use crate::latency::Book;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

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
}
