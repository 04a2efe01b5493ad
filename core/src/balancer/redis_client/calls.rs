//! The bytes of a pick: its script call, and its reply decoded.

use crate::balancer::pick::{EndpointPick, Pick, PickReply};
use crate::balancer::telemetry::Telemetry;
use crate::config::PolicyConfig;
use crate::host::{Host, LogLevel};
use crate::reason::Cause;
use crate::redis::inflight::{self, ServiceAcquireArgs};
use crate::redis::scripts::{
    self, AcquireArgs, AcquireReply, PrefixArgs, ReplyError, Scripts, SessionArgs, TenantArgs,
    RECLAIM_LIMIT,
};

/// The script call of `pick` at `now_ms`; `random` breaks ties in the script.
pub fn pick_query(scripts: &Scripts, pick: &Pick, now_ms: u64, random: u32) -> Vec<u8> {
    match pick {
        Pick::Endpoint(p) => endpoint_query(scripts, p, now_ms, random),
        Pick::Service(p) => inflight::acquire_call(
            scripts,
            p.by_sha,
            &p.keys,
            &ServiceAcquireArgs {
                now_ms,
                lease_ttl_ms: p.config.common.lease_ttl_ms,
                key_ttl_s: p.key_ttl_s,
                request_id: &p.request_id,
                random,
                reclaim: RECLAIM_LIMIT,
                candidates: &p.candidates,
            },
        ),
        Pick::Session(p) => {
            scripts::session_bind_call(scripts, p.by_sha, &p.key, p.ttl_s, &p.choice, &p.keep)
        }
    }
}

fn endpoint_query(scripts: &Scripts, pick: &EndpointPick, now_ms: u64, random: u32) -> Vec<u8> {
    let args = AcquireArgs {
        now_ms,
        lease_ttl_ms: pick.config.common.lease_ttl_ms,
        request_id: &pick.request_id,
        cost: pick.cost,
        cap: pick.cap,
        random,
        fingerprint: &pick.fingerprint,
        reclaim: RECLAIM_LIMIT,
        endpoints: pick.sent_list.then_some(pick.candidates.as_slice()),
        session: None,
        wait_rank: pick.wait_rank,
        pool_cap: pick.pool_cap,
        tenant: match (&pick.tenant, &pick.config.common.fairness) {
            (Some((id, limit)), Some(f)) => Some(TenantArgs {
                id,
                limit: *limit,
                window_ms: f.window_ms,
            }),
            _ => None,
        },
    };
    let mut args = args;
    if let (Some(key), Some(session)) = (&pick.session, &pick.config.session) {
        let (max_imbalance, max_imbalance_ratio) = match &pick.config.policy {
            PolicyConfig::PrefixCache(p) => (p.max_imbalance, p.max_imbalance_ratio),
            _ => (
                crate::config::SESSION_MAX_IMBALANCE,
                crate::config::SESSION_MAX_IMBALANCE_RATIO,
            ),
        };
        args.session = Some(SessionArgs {
            key,
            ttl_s: session.ttl_s,
            max_imbalance,
            max_imbalance_ratio,
        });
    }
    let prefix = match (&pick.chain, &pick.config.policy) {
        (Some(chain), PolicyConfig::PrefixCache(p)) => Some(PrefixArgs {
            chain,
            ttl_s: p.ttl_s,
            max_imbalance: p.max_imbalance,
            max_imbalance_ratio: p.max_imbalance_ratio,
            gate: p.gate,
        }),
        _ => None,
    };
    scripts::pick_call(scripts, pick.by_sha, &pick.keys, &args, prefix.as_ref())
}

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
        }) => PickReply::Picked {
            endpoint,
            depth,
            spilled,
            session,
            load_before,
            booked,
        },
        Ok(AcquireReply::Sync | AcquireReply::Empty) => PickReply::Resync,
        Ok(AcquireReply::Full) => PickReply::Full,
        Ok(AcquireReply::Tenant) => PickReply::Tenant,
        Ok(AcquireReply::PoolFull) => PickReply::PoolFull,
        Err(e) => reply_error(host, tel, ctx, e),
    }
}

/// A global in-flight acquire's reply. No service (no candidates) or garbage: the local path.
pub fn decode_service_pick(
    host: &mut dyn Host,
    tel: &mut Telemetry,
    ctx: u32,
    bytes: &[u8],
) -> PickReply {
    match inflight::parse_acquire(bytes) {
        Ok(Some(service)) => PickReply::Service(service),
        Ok(None) => PickReply::Failed(Cause::BadReply),
        Err(e) => reply_error(host, tel, ctx, e),
    }
}

/// A pick's reply that is not what its script returns: NOSCRIPT is resent by text, anything
/// else is counted and logged and fails the pick.
fn reply_error(host: &mut dyn Host, tel: &mut Telemetry, ctx: u32, e: ReplyError) -> PickReply {
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
