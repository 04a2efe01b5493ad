//! endpoint_metrics with a session and Redis (Higress build): one script call keeps the session
//! on its bound pod or binds it to the scheduler's choice (docs/redis-data-model.md §10); its
//! reply is read in [`super::reply`]. Nothing is counted, so nothing is ever released.

use crate::balancer::policies::continuation::Record;
use crate::balancer::policies::session::Kind;
use crate::config::RouteConfig;
use std::rc::Rc;

/// endpoint_metrics with a session and Redis (Higress build): the scheduler has chosen; one
/// script call keeps the session on its bound pod when that pod may keep it, else binds it to
/// the scheduler's choice (docs/redis-data-model.md §10). Nothing is counted, so nothing is
/// ever released.
#[derive(Debug, Clone)]
pub struct SessionPick {
    pub config: Rc<RouteConfig>,
    /// `scripts::session_key` of the request's session id (`scripts::response_key` of a
    /// continuation's), its TTL and what named it.
    pub key: Rc<str>,
    pub ttl_s: u64,
    pub kind: Kind,
    /// The scheduler's pick: the new binding, and the route when Redis cannot answer.
    pub choice: String,
    /// The candidates a session may stay on: healthy, with metrics, not saturated.
    pub keep: Vec<String>,
    pub by_sha: bool,
    /// A Responses request: its answer's id is recorded against its pod (continuation.rs).
    pub record: Option<Record>,
}
