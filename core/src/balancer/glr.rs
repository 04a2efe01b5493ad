//! Starting a pick: the healthy endpoint set, then one Redis acquire — plain least-request
//! (global_least_request, and prefix_cache when there is no usable prompt) or with a prefix chain.

use super::{cost_of, Balancer, Pick, Verdict};
use crate::host::Host;
use crate::request::Phase;
use crate::stats::Cause;
use crate::upstream;
use std::rc::Rc;

impl Balancer {
    /// global_least_request: one acquire script call picks and counts the endpoint.
    pub(super) fn decide_least_request(&mut self, host: &mut dyn Host, ctx: u32) -> Verdict {
        self.start_pick(host, ctx, None)
    }

    /// Dispatches the acquire for `ctx` (with `chain`, the prefix_cache script) and pauses the
    /// request until it returns; a failure to even send it falls back now.
    pub(super) fn start_pick(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        chain: Option<Rc<Vec<String>>>,
    ) -> Verdict {
        let Some(req) = self.requests.get(&ctx) else {
            return Verdict::Continue;
        };
        let (config, body_bytes) = (req.config.clone(), req.body_bytes);
        let Some(keys) = req.keys.clone() else {
            return self.fail(host, ctx, Cause::NoRoute, false);
        };
        let endpoints = match host.upstream_hosts().map(|b| upstream::decode_hosts(&b)) {
            Ok(Ok(list)) => list,
            _ => return self.fail(host, ctx, Cause::HostListUnavailable, false),
        };
        let healthy = upstream::healthy_addresses(&endpoints);
        if healthy.is_empty() {
            return self.fail(host, ctx, Cause::NoHealthyEndpoint, false);
        }
        let fingerprint: Rc<str> = upstream::fingerprint(&healthy).into();
        let sent_list = self.synced.get(&keys.namespace) != Some(&fingerprint);
        self.next_id += 1;
        let pick = Pick {
            ctx,
            request_id: format!("{:08x}{:x}", self.vm_nonce, self.next_id),
            cost: cost_of(&config, body_bytes),
            config,
            keys,
            candidates: Rc::new(healthy),
            fingerprint,
            sent_list,
            by_sha: true,
            chain,
        };
        match self.dispatch_pick(host, pick) {
            Ok(token) => {
                self.set_phase(ctx, Phase::Picking { token });
                Verdict::Pause
            }
            Err(cause) => self.fail(host, ctx, cause, false),
        }
    }
}
