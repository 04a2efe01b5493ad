//! The Responses API's stored responses (`store`, on by default): response id → the
//! conversation's text after that answer (the prompt, then the answer, as the next turn renders
//! it), so a request naming it in `previous_response_id` is answered over that whole history.
//!
//! vLLM keeps its stored responses in each server's memory: a continuation sent to another pod
//! is answered 404 ("Response with id … not found"). A pod's default store is its own, to match;
//! pods given one shared store (`PodConfig::responses`) model a backend whose servers share one
//! store (a database): a continuation answered elsewhere then re-prefills its whole history,
//! uncached on that pod, which is what routing it back to its pod saves.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Responses kept at most (the oldest go first).
pub const MAX_RESPONSES: usize = 100_000;

#[derive(Clone, Default)]
pub struct ResponseStore(Arc<Mutex<Inner>>);

#[derive(Default)]
struct Inner {
    texts: HashMap<String, String>,
    order: VecDeque<String>,
}

impl ResponseStore {
    /// A store of its own (not shared with any pod already running).
    pub fn new() -> ResponseStore {
        ResponseStore::default()
    }

    /// The conversation's text after response `id`, if stored.
    pub fn get(&self, id: &str) -> Option<String> {
        let inner = self.0.lock().ok()?;
        inner.texts.get(id).cloned()
    }

    /// Stores response `id`'s conversation text.
    pub fn put(&self, id: &str, text: String) {
        let Ok(mut inner) = self.0.lock() else {
            return;
        };
        if inner.texts.insert(id.to_string(), text).is_none() {
            inner.order.push_back(id.to_string());
        }
        while inner.order.len() > MAX_RESPONSES {
            if let Some(old) = inner.order.pop_front() {
                inner.texts.remove(&old);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.0.lock().map(|i| i.texts.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl std::fmt::Debug for ResponseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ResponseStore({} responses)", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_responses_and_forgets_the_oldest() {
        let s = ResponseStore::new();
        assert_eq!(s.get("a"), None);
        s.put("a", "history".into());
        assert_eq!(s.get("a").as_deref(), Some("history"));
        let shared = s.clone();
        shared.put("b", "x".into());
        assert_eq!(s.len(), 2, "a clone is the same store");
        assert!(ResponseStore::new().is_empty(), "a new one is another");
    }
}
