//! The VM's live contexts, as the host numbers them: root contexts (one per plugin
//! configuration; `proxy_on_context_create(id, 0)`) each own a balancer once configured, and
//! http contexts (one per request; `proxy_on_context_create(id, root)`) belong to the root that
//! created them. Generic over the balancer so the bookkeeping is tested natively.

use ailb_core::id_map::IdMap;

pub struct Contexts<B> {
    /// Root id → its balancer; `None` until `proxy_on_configure` accepts a configuration.
    roots: IdMap<Option<B>>,
    /// Http context id → its root and what the glue still calls the balancer for.
    streams: IdMap<Stream>,
}

/// An http context, as the glue tracks it.
#[derive(Debug, Clone, Copy)]
struct Stream {
    root: u32,
    /// Stream end was given to the balancer (on_done; on_log and on_delete repeat it).
    ended: bool,
}

impl<B> Default for Contexts<B> {
    fn default() -> Self {
        Contexts {
            roots: IdMap::default(),
            streams: IdMap::default(),
        }
    }
}

impl<B> Contexts<B> {
    /// `proxy_on_context_create`: parent 0 makes a root context, anything else an http context
    /// of that root. Creating an id twice keeps what the first creation made.
    pub fn create(&mut self, id: u32, parent: u32) {
        if self.roots.contains_key(&id) || self.streams.contains_key(&id) {
            return;
        }
        if parent == 0 {
            self.roots.insert(id, None);
        } else {
            let stream = Stream {
                root: parent,
                ended: false,
            };
            self.streams.insert(id, stream);
        }
    }

    /// A configuration accepted for `root`: its balancer from now on (replacing any earlier
    /// one). A root the host never announced is made a root here.
    pub fn configure(&mut self, root: u32, balancer: B) {
        self.streams.remove(&root);
        self.roots.insert(root, Some(balancer));
    }

    /// The root an http context belongs to; `None` for roots and unknown ids.
    pub fn root_of(&self, stream: u32) -> Option<u32> {
        self.streams.get(&stream).map(|s| s.root)
    }

    /// Marks http context `id`'s stream ended: true the first time, when its balancer is
    /// to be told; false for roots, unknown ids and a stream already ended.
    pub fn end(&mut self, id: u32) -> bool {
        match self.streams.get_mut(&id) {
            Some(s) if !s.ended => {
                s.ended = true;
                true
            }
            _ => false,
        }
    }

    /// The balancer serving `id`: a root's own, or the root's of an http context. `None` for
    /// unknown ids and roots without an accepted configuration.
    pub fn balancer(&mut self, id: u32) -> Option<&mut B> {
        let root = self.root_of(id).unwrap_or(id);
        self.roots.get_mut(&root)?.as_mut()
    }

    /// `proxy_on_delete`: forgets `id` (a root's balancer is dropped with it).
    pub fn delete(&mut self, id: u32) {
        if self.streams.remove(&id).is_none() {
            self.roots.remove(&id);
        }
    }

    /// Live (roots, http contexts).
    #[cfg(test)]
    fn live(&self) -> (usize, usize) {
        (self.roots.len(), self.streams.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_contexts_reach_their_roots_balancer() {
        let mut c = Contexts::default();
        c.create(1, 0);
        c.create(7, 0);
        assert_eq!(c.balancer(1), None, "no balancer before configure");
        c.configure(1, "one");
        c.configure(7, "seven");
        c.create(2, 1);
        c.create(3, 7);
        assert_eq!(c.balancer(2), Some(&mut "one"));
        assert_eq!(c.balancer(3), Some(&mut "seven"));
        assert_eq!(c.balancer(7), Some(&mut "seven"));
        assert_eq!((c.root_of(2), c.root_of(1)), (Some(1), None));
        c.configure(1, "one again");
        assert_eq!(c.balancer(2), Some(&mut "one again"));
    }

    #[test]
    fn unknown_ids_and_deleted_contexts_have_no_balancer() {
        let mut c = Contexts::default();
        c.create(1, 0);
        c.configure(1, 10u32);
        assert_eq!(c.balancer(99), None);
        c.create(2, 1);
        c.create(3, 42); // a root the host never created
        assert_eq!(c.balancer(3), None);
        c.delete(2);
        assert_eq!(c.root_of(2), None);
        assert_eq!(c.balancer(2), None);
        assert_eq!(c.live(), (1, 1));
        c.delete(3);
        c.delete(1);
        assert_eq!(c.live(), (0, 0));
        assert_eq!(c.balancer(1), None);
        c.delete(1); // twice: nothing left to forget
        c.delete(5);
        assert_eq!(c.live(), (0, 0));
    }

    #[test]
    fn a_stream_ends_once() {
        let mut c: Contexts<u8> = Contexts::default();
        c.create(1, 0);
        c.create(2, 1);
        assert!(c.end(2), "the first end is told");
        assert!(!c.end(2), "on_log and on_delete repeat it: not told again");
        assert_eq!(
            c.root_of(2),
            Some(1),
            "an ended stream still finds its root"
        );
        assert!(
            !c.end(1) && !c.end(9),
            "roots and unknown ids have no stream to end"
        );
        c.delete(2);
        assert!(!c.end(2));
    }

    #[test]
    fn creating_an_id_twice_keeps_the_first() {
        let mut c = Contexts::default();
        c.create(1, 0);
        c.configure(1, 'a');
        c.create(1, 4); // not turned into an http context of 4
        assert_eq!(c.balancer(1), Some(&mut 'a'));
        c.create(2, 1);
        c.create(2, 0); // not turned into a root
        assert_eq!(c.root_of(2), Some(1));
        assert_eq!(c.live(), (1, 1));
    }
}
