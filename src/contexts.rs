//! The VM's live contexts, as the host numbers them: root contexts (one per plugin
//! configuration; `proxy_on_context_create(id, 0)`) each own a balancer once configured, and
//! http contexts (one per request; `proxy_on_context_create(id, root)`) belong to the root that
//! created them. Generic over the balancer so the bookkeeping is tested natively.

use ailb_core::id_map::{IdMap, Index};

pub struct Contexts<B> {
    /// Root id → its balancer; `None` until `proxy_on_configure` accepts a configuration.
    roots: IdMap<Option<B>>,
    /// Root id → the accepted configuration's bytes, as the host gave them. Apart from
    /// `roots`, which every callback reads: only a configure reads these.
    configs: IdMap<Vec<u8>>,
    /// Http context id → its root, from its creation to its stream's end.
    streams: Index,
    /// Http contexts whose next response body chunk the balancer wants (its answer at the
    /// response headers and at each chunk): the other chunks of a streamed answer, most of
    /// them, return at this look-up instead of reaching the balancer.
    bodies: Index,
}

impl<B> Default for Contexts<B> {
    fn default() -> Self {
        Contexts::new()
    }
}

impl<B> Contexts<B> {
    /// No contexts; const, so a `static` may hold the registry.
    pub const fn new() -> Self {
        Contexts {
            roots: IdMap::new(),
            configs: IdMap::new(),
            streams: Index::new(),
            bodies: Index::new(),
        }
    }

    /// `proxy_on_context_create`: parent 0 makes a root context, anything else an http context
    /// of that root. Creating an id twice keeps what the first creation made. A root id of
    /// `u32::MAX`, which the host never hands out, is more than the index holds: its streams
    /// are not recorded and find no balancer.
    pub fn create(&mut self, id: u32, parent: u32) {
        if self.roots.contains_key(&id) || self.streams.get(id).is_some() {
            return;
        }
        if parent == 0 {
            self.roots.insert(id, None);
        } else {
            let _ = self.streams.insert(id, parent as usize);
        }
    }

    /// Whether `root` already serves with a balancer built from exactly `config`: the host
    /// configures a live root again only with the configuration it has (docs/higress-abi.md
    /// §11 "Root contexts"), and that balancer holds its requests' counts.
    pub fn configured_with(&self, root: u32, config: &[u8]) -> bool {
        matches!(self.roots.get(&root), Some(Some(_)))
            && self.configs.get(&root).is_some_and(|c| c == config)
    }

    /// Configuration `config` accepted for `root`: `balancer`, built from it, serves the root
    /// from now on (replacing any earlier one). A root the host never announced is made a
    /// root here.
    pub fn configure(&mut self, root: u32, balancer: B, config: Vec<u8>) {
        self.streams.remove(root);
        self.roots.insert(root, Some(balancer));
        self.configs.insert(root, config);
    }

    /// The root an http context belongs to; `None` for roots, unknown ids and streams that
    /// ended.
    pub fn root_of(&self, stream: u32) -> Option<u32> {
        self.streams.get(stream).and_then(|r| u32::try_from(r).ok())
    }

    /// Ends http context `id`'s stream: the root whose balancer is to be told, the first time;
    /// `None` for roots, unknown ids and a stream already ended (on_log and on_delete repeat
    /// on_done's end). The stream is forgotten here: nothing after its end needs its root.
    pub fn end(&mut self, id: u32) -> Option<u32> {
        self.bodies.remove(id);
        self.streams.remove(id).and_then(|r| u32::try_from(r).ok())
    }

    /// Records whether stream `id`'s next response body chunk goes to its balancer.
    pub fn watch_body(&mut self, id: u32, wanted: bool) {
        if wanted {
            self.bodies.insert(id, 0);
        } else {
            self.bodies.remove(id);
        }
    }

    /// Whether stream `id`'s next response body chunk goes to its balancer.
    pub fn watches_body(&self, id: u32) -> bool {
        self.bodies.get(id).is_some()
    }

    /// The balancer serving `id`: a root's own, or the root's of an http context. `None` for
    /// unknown ids and roots without an accepted configuration.
    pub fn balancer(&mut self, id: u32) -> Option<&mut B> {
        self.root_balancer(self.root_of(id).unwrap_or(id))
    }

    /// The balancer of root `root`.
    pub fn root_balancer(&mut self, root: u32) -> Option<&mut B> {
        self.roots.get_mut(&root)?.as_mut()
    }

    /// `proxy_on_delete`: forgets `id` (a root's balancer is dropped with it).
    pub fn delete(&mut self, id: u32) {
        // A stream's delete, after its end, finds nothing in either map: the configs are
        // looked at for a root only, so a request's delete runs no code of theirs.
        if self.streams.remove(id).is_none() && self.roots.remove(&id).is_some() {
            self.configs.remove(&id);
        }
    }

    /// Live (roots, http contexts whose stream has not ended).
    #[cfg(test)]
    fn live(&self) -> (usize, usize) {
        assert!(
            self.configs.len() <= self.roots.len(),
            "a config outlived its root"
        );
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
        c.configure(1, "one", Vec::new());
        c.configure(7, "seven", Vec::new());
        c.create(2, 1);
        c.create(3, 7);
        assert_eq!(c.balancer(2), Some(&mut "one"));
        assert_eq!(c.balancer(3), Some(&mut "seven"));
        assert_eq!(c.balancer(7), Some(&mut "seven"));
        assert_eq!((c.root_of(2), c.root_of(1)), (Some(1), None));
        c.configure(1, "one again", Vec::new());
        assert_eq!(c.balancer(2), Some(&mut "one again"));
    }

    #[test]
    fn unknown_ids_and_deleted_contexts_have_no_balancer() {
        let mut c = Contexts::default();
        c.create(1, 0);
        c.configure(1, 10u32, Vec::new());
        assert_eq!(c.balancer(99), None);
        c.create(2, 1);
        c.create(3, 42); // a root the host never created
        assert_eq!(c.balancer(3), None);
        c.create(4, u32::MAX); // a root id the index cannot hold
        assert_eq!((c.root_of(4), c.balancer(4)), (None, None));
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
        c.configure(1, 5, Vec::new());
        c.create(2, 1);
        assert_eq!(c.end(2), Some(1), "the first end names the root to tell");
        assert_eq!(
            c.end(2),
            None,
            "on_log and on_delete repeat it: not told again"
        );
        assert_eq!(c.balancer(2), None, "an ended stream is forgotten");
        assert_eq!(c.live(), (1, 0));
        assert!(
            c.end(1).is_none() && c.end(9).is_none(),
            "roots and unknown ids have no stream to end"
        );
        c.delete(2); // after its end: nothing left to forget
        assert_eq!(c.live(), (1, 0));
        assert_eq!(c.root_balancer(1), Some(&mut 5));
    }

    #[test]
    fn a_body_watch_lasts_until_unwatched_or_the_stream_ends() {
        let mut c = Contexts::default();
        c.create(1, 0);
        c.configure(1, 'a', Vec::new());
        c.create(2, 1);
        c.create(3, 1);
        assert!(
            !c.watches_body(2),
            "nothing watched before the response headers"
        );
        c.watch_body(2, true);
        c.watch_body(3, true);
        assert!(c.watches_body(2) && c.watches_body(3));
        c.watch_body(2, false);
        assert!(!c.watches_body(2) && c.watches_body(3));
        assert_eq!(c.end(3), Some(1));
        assert!(!c.watches_body(3), "an ended stream's watch goes with it");
        c.watch_body(2, false); // unwatching twice is harmless
        assert!(!c.watches_body(2));
    }

    #[test]
    fn creating_an_id_twice_keeps_the_first() {
        let mut c = Contexts::default();
        c.create(1, 0);
        c.configure(1, 'a', Vec::new());
        c.create(1, 4); // not turned into an http context of 4
        assert_eq!(c.balancer(1), Some(&mut 'a'));
        c.create(2, 1);
        c.create(2, 0); // not turned into a root
        assert_eq!(c.root_of(2), Some(1));
        assert_eq!(c.live(), (1, 1));
    }

    #[test]
    fn a_root_configured_again_with_its_own_bytes_is_known() {
        let mut c = Contexts::default();
        c.create(1, 0);
        assert!(!c.configured_with(1, b""), "created, not configured");
        c.configure(1, "first", b"{\"a\":1}".to_vec());
        c.create(2, 1);
        assert!(c.configured_with(1, b"{\"a\":1}"));
        assert!(!c.configured_with(1, b"{\"a\":2}"));
        assert!(!c.configured_with(9, b"{\"a\":1}"), "not a root");
        assert!(!c.configured_with(2, b"{\"a\":1}"), "a stream, not a root");
        c.configure(1, "second", b"{\"a\":2}".to_vec());
        assert!(c.configured_with(1, b"{\"a\":2}") && !c.configured_with(1, b"{\"a\":1}"));
        assert_eq!(c.balancer(2), Some(&mut "second"));
    }
}
