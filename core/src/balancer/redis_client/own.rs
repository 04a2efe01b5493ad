//! A policy's own Redis calls (`RedisClient::send_own`): sent by the client like any other,
//! their replies handed back to the policy that sent them (prefix_cache's latency merge).

use crate::balancer::telemetry::Telemetry;
use crate::host::Host;
use crate::reason::Cause;

/// A policy's own Redis call ([`RedisClient::send_own`]), told its reply (Err: failed, timed
/// out or never answered as Redis answers).
pub trait OnReply {
    fn reply(
        self: Box<Self>,
        host: &mut dyn Host,
        tel: &mut Telemetry,
        reply: Result<Vec<u8>, Cause>,
    );
}
