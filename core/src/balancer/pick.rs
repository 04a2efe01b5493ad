//! What a Redis pick comes back with: its reply decoded ([`PickReply`], the scripts'
//! vocabulary), and the Redis endpoint lease ([`Lease`]) with its prefill booking. The picks
//! themselves are their policies' own types (`events::Pick`; docs/redis-data-model.md §6, §8).

use crate::config::RouteConfig;
use crate::reason::Cause;
use crate::redis::scripts::{Booked, Keys, SessionState};
use std::rc::Rc;

mod booking;
mod caps;
pub use booking::Booking;
pub use caps::{class_cap, cost_of, pool_cap, tenant_capacity};

/// What an acquired pick must give back: one lease member in one route's keys (and the route's
/// config, for its Redis target).
#[derive(Debug, Clone)]
pub struct Lease {
    pub config: Rc<RouteConfig>,
    pub keys: Rc<Keys>,
    pub member: String,
    /// prefix_cache: the lease may carry a prefill booking, given back with it.
    pub prefix: bool,
    /// prefix_cache: the booking to give back at the first response bytes (taken then).
    pub booking: Option<Booking>,
}

impl PartialEq for Lease {
    fn eq(&self, other: &Lease) -> bool {
        self.keys == other.keys && self.member == other.member
    }
}

impl Lease {
    /// The lease id (a booking's name, `scripts::lease_id`) and the endpoint of its member
    /// (`scripts::lease_member`).
    pub fn id_and_endpoint(&self) -> Option<(&str, &str)> {
        let (rest, _cost) = self.member.rsplit_once('|')?;
        rest.split_once('|')
    }
}

/// A reply of a policy's own script, decoded by the decoder its pick names (a `Decode` of
/// its folder) into the policy's own type; the pick reads it back in `answer` and `undo`.
pub trait OwnReply: std::fmt::Debug {
    fn as_any(&self) -> &dyn std::any::Any;
}

/// What Redis answered to a pick, decoded.
#[derive(Debug, Clone)]
pub enum PickReply {
    Picked {
        endpoint: String,
        depth: u32,
        spilled: bool,
        session: SessionState,
        /// The endpoint's load before this request (None: a session binding, nothing counted).
        load_before: Option<u64>,
        booked: Option<Booked>,
        /// Every endpoint was ejected: chosen as if none were (failure memory's fail-open).
        all_ejected: bool,
    },
    /// A reply in a policy's own terms ([`OwnReply`]).
    Own(Rc<dyn OwnReply>),
    /// Redis does not hold our endpoint set (restart, another gateway's view): resend it.
    Resync,
    /// Every endpoint is at `maxRequestCount` (or the pool at `maxPoolRequests`); nothing
    /// was acquired.
    Full,
    /// The pool is at `maxPoolRequests` (or the request's class cap of it); nothing acquired.
    PoolFull,
    /// The request's tenant is at its share while another tenant is active; nothing was
    /// acquired.
    Tenant,
    /// Latency-aware placement shed a sheddable request (the best endpoint's prediction);
    /// nothing acquired.
    Shed(crate::redis::scripts::Predicted),
    /// The script cache lost the script: resend with EVAL.
    NoScript,
    Failed(Cause),
}
