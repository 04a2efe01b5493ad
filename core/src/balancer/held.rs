//! What a request holds once routed, and how each kind is given back (docs/architecture.md
//! "A request's path", step 8): a Redis lease, a per-proxy count, or a cluster service's
//! in-flight count with its latency; and, for a pick whose stream ended first, [`undo`].

use super::events::{Effect, Hold};
use super::pick::{Lease, LocalLease, Pick, PickReply, ServiceLease};
use crate::host::Host;
use crate::reason::Cause;
use crate::stats::Counter;

/// What a routed request holds until its stream ends.
#[derive(Debug)]
pub enum Held {
    Lease(Lease),
    Local(LocalLease),
    /// cluster_metrics: the service's in-flight count, given back at stream end with the
    /// total latency; `status` from the response headers, `first_byte` once TTFT is recorded.
    Service {
        lease: ServiceLease,
        status: Option<u32>,
        first_byte: bool,
    },
    Nothing,
}

impl Held {
    pub fn from_hold(hold: Option<Hold>) -> Held {
        match hold {
            None => Held::Nothing,
            Some(Hold::Lease(l)) => Held::Lease(l),
            Some(Hold::Local(l)) => Held::Local(l),
            Some(Hold::Service(lease)) => Held::Service {
                lease,
                status: None,
                first_byte: false,
            },
        }
    }

    /// Gives back what is held, with no latency recorded (the request never got an answer
    /// from this choice).
    pub fn cancel(self) -> Vec<Effect> {
        match self {
            Held::Lease(l) => vec![Effect::Release(l)],
            Held::Local(l) => vec![Effect::ReleaseLocal(l)],
            Held::Service { lease, .. } => vec![Effect::ServiceDone {
                lease,
                outcome: None,
            }],
            Held::Nothing => Vec::new(),
        }
    }
}

/// Higress's success test: `:status` exactly 200; anything else, or no status (reset, timeout
/// before headers), is an error (docs/higress-cluster-policies.md §3.3).
pub fn success(status: Option<u32>) -> bool {
    status == Some(200)
}

/// The response's `:status`, as [`success`] reads it: an HTTP status is three digits, the
/// first not 0; anything else reads as None, so that only the exact `200` that Go's string
/// compare accepts is a success (not `0200` nor `+200`).
pub fn response_status(host: &mut dyn Host) -> Option<u32> {
    let value = host.response_status().ok().flatten()?;
    let [a @ b'1'..=b'9', b @ b'0'..=b'9', c @ b'0'..=b'9'] = value.as_slice() else {
        return None;
    };
    Some(u32::from(a - b'0') * 100 + u32::from(b - b'0') * 10 + u32::from(c - b'0'))
}

/// The stream ended while its pick was in flight and the reply is here: give back whatever
/// the pick acquired.
pub fn undo(pick: Box<Pick>, reply: &PickReply) -> Vec<Effect> {
    let mut e = vec![Effect::Count(Counter::ReleasesOrphaned)];
    if matches!(*pick, Pick::Session(_)) {
        return e; // a session binding holds no count
    }
    let release = match (&*pick, reply) {
        (Pick::Endpoint(p), PickReply::Picked { endpoint, .. }) => {
            Some(Effect::Release(p.lease(endpoint)))
        }
        (Pick::Service(p), PickReply::Service(service)) => {
            Some(Effect::ReleaseService(p.global(service)))
        }
        _ => None,
    };
    match release {
        Some(effect) => e.push(effect),
        None if *reply == PickReply::Failed(Cause::RedisTimeout) => {
            e.push(Effect::ReleaseAll(pick))
        }
        None => {}
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::mock::MockHost;

    #[test]
    fn a_status_is_read_only_when_it_is_all_digits() {
        let mut host = MockHost::new();
        assert_eq!(response_status(&mut host), None, "no status header");
        for (value, read) in [
            ("200", Some(200)),
            ("503", Some(503)),
            ("0200", None),
            ("099", None),
            ("100", Some(100)),
            ("+200", None),
            ("", None),
            ("2x0", None),
            (" 200", None),
            ("2000", None),
        ] {
            host.response_headers = vec![(":status".into(), value.into())];
            assert_eq!(response_status(&mut host), read, "{value:?}");
            assert_eq!(success(read), value == "200", "{value:?}");
        }
    }
}
