//! endpoint_metrics' sessions (docs/sessions-and-queues.md "Sessions", "Agent sessions"): with
//! Redis, the key one script call keeps or binds (pick.rs); without, the session's home on the
//! consistent-hash ring of the pods, or a continuation's pod as this proxy recorded it; and
//! where a Responses answer's id is recorded (continuation.rs).

use crate::balancer::metrics::Home;
use crate::balancer::policies::continuation::{self, Record, Store, Table};
use crate::balancer::policies::policy::Env;
use crate::balancer::policies::session::{Kind, Sticky};
use crate::config::RouteConfig;
use crate::host::Host;
use crate::model_metrics::Candidate;
use crate::redis::scripts::Keys;
use crate::stats::Counter;
use std::rc::Rc;

/// With Redis (Higress build, a route naming a Redis service): the session's key, its TTL
/// and what named it.
pub fn bind(
    config: &RouteConfig,
    keys: Option<&Rc<Keys>>,
    sticky: Option<&Sticky>,
) -> Option<(String, u64, Kind)> {
    let (sticky, keys) = (sticky?, keys?);
    config.redis.as_ref()?;
    Some((
        sticky.redis_key(&keys.namespace),
        sticky.ttl_s(config),
        sticky.kind,
    ))
}

/// Where a Responses answer's id is recorded (`answer`): the route's Redis, else this proxy's
/// table.
pub fn record(
    config: &Rc<RouteConfig>,
    keys: Option<&Rc<Keys>>,
    table: Option<&Rc<Table>>,
    answer: bool,
) -> Option<Record> {
    let ttl_s = config.agents.as_ref().filter(|_| answer)?.ttl_s;
    let store = match (&config.redis, keys, table) {
        (Some(_), Some(keys), _) => Store::Redis {
            config: config.clone(),
            keys: keys.clone(),
        },
        (None, _, Some(table)) => Store::Local(table.clone()),
        _ => return None,
    };
    Some(Record { store, ttl_s })
}

/// Without Redis: the session's home among `candidates` (`members`: Higress's whole host
/// list, for the ring). A continuation's home is the pod this proxy recorded for its previous
/// response: `away` when that pod is no candidate now; None (counted) when none is recorded,
/// so the scheduler places it as without a session.
pub fn home(
    host: &mut dyn Host,
    env: &mut Env,
    (candidates, members): (&[Candidate], Option<&Vec<String>>),
    sticky: &Sticky,
    table: Option<&Rc<Table>>,
) -> Option<Home> {
    if sticky.kind != Kind::Continuation {
        return Some(env.metrics.session_home(candidates, members, &sticky.id));
    }
    let now = host.now_ms();
    let Some(tag) = table.and_then(|t| t.lookup(&*host, &sticky.id, now)) else {
        env.tel.inc(host, Counter::ContinuationUnknown);
        return None;
    };
    let at = continuation::resolve(tag, candidates.iter().map(|c| &c.addr));
    Some(Home {
        at,
        away: at.is_none(),
    })
}
