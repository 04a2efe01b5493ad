//! A pick's reply decoded: the scripts' replies as [`PickReply`] (each pick names its
//! decoder, `events::Pick::decode`).

use crate::balancer::pick::PickReply;
use crate::balancer::telemetry::Telemetry;
use crate::host::{Host, LogLevel};
use crate::reason::Cause;
use crate::redis::scripts::{self, AcquireReply, ReplyError};

/// How a pick's reply bytes read: one of the decoders below, named by the pick
/// (`events::Pick::decode`).
pub type Decode = fn(&mut dyn Host, &mut Telemetry, u32, &[u8]) -> PickReply;

/// An endpoint or session pick's reply.
pub fn decode_pick(host: &mut dyn Host, tel: &mut Telemetry, ctx: u32, bytes: &[u8]) -> PickReply {
    match scripts::parse_acquire(bytes) {
        Ok(AcquireReply::Picked {
            endpoint,
            depth,
            spilled,
            session,
            load_before,
            booked,
            all_ejected,
        }) => PickReply::Picked {
            endpoint,
            depth,
            spilled,
            session,
            load_before,
            booked,
            all_ejected,
        },
        Ok(AcquireReply::Sync | AcquireReply::Empty) => PickReply::Resync,
        Ok(AcquireReply::Full) => PickReply::Full,
        Ok(AcquireReply::Tenant) => PickReply::Tenant,
        Ok(AcquireReply::PoolFull) => PickReply::PoolFull,
        Ok(AcquireReply::Shed(p)) => PickReply::Shed(p),
        Err(e) => reply_error(host, tel, ctx, e),
    }
}

/// A pick's reply that is not what its script returns: NOSCRIPT is resent by text, anything
/// else is counted and logged and fails the pick.
pub fn reply_error(host: &mut dyn Host, tel: &mut Telemetry, ctx: u32, e: ReplyError) -> PickReply {
    if e == ReplyError::NoScript {
        return PickReply::NoScript;
    }
    tel.inc(host, crate::stats::Counter::RedisErrors);
    match &e {
        // Redis's ACL errors (and Envoy redis_proxy's downstream auth, which answers NOAUTH).
        ReplyError::Redis(text)
            if ["NOAUTH", "WRONGPASS", "NOPERM"]
                .iter()
                .any(|p| text.starts_with(p)) =>
        {
            tel.redis_refused(host, ctx, text)
        }
        _ => tel.log(host, LogLevel::Debug, ctx, format_args!("{e}")),
    }
    PickReply::Failed(match e {
        ReplyError::Malformed(_) => Cause::BadReply,
        ReplyError::Redis(_) | ReplyError::NoScript => Cause::RedisError,
    })
}

/// How a Redis callback ended, as the host reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallStatus {
    /// The reply is readable (`size` bytes).
    Ok,
    /// Timeout or connection failure: there is no reply.
    Failed,
}

/// A pick's reply, for the balancer to route to its request (or its orphan).
pub struct PickAnswer {
    pub ctx: u32,
    pub token: u32,
    pub reply: PickReply,
}

/// What a reply means to the balancer.
pub enum Answered {
    Pick(PickAnswer),
    /// Request `ctx`'s last write was answered (or failed): its response may end.
    Written(u32),
}
