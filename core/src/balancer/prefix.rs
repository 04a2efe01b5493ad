//! prefix_cache: the prompt → canonical blocks → chained keys, computed here so the script
//! only reads and writes keys (design §4.2). A body that is not a usable prompt still gets a
//! least-request pick, counted under `ai_lb.fallback.bad_request`.

use super::{Balancer, Verdict};
use crate::host::{Host, LogLevel};
use crate::prefix::{canonicalize, prefix_key};
use crate::stats::{Cause, Counter};
use std::rc::Rc;

impl Balancer {
    pub(super) fn decide_prefix(&mut self, host: &mut dyn Host, ctx: u32) -> Verdict {
        let Some(req) = self.requests.get(&ctx) else {
            return Verdict::Continue;
        };
        let settings = match &req.config.policy {
            crate::config::PolicyConfig::PrefixCache(p) => Some(p.clone()),
            _ => None,
        };
        let (Some(settings), Some(keys)) = (settings, req.keys.clone()) else {
            return self.start_pick(host, ctx, None);
        };
        let body = host.request_body(0, req.body_bytes).unwrap_or_default();
        match canonicalize(&body, &settings.canon) {
            Ok(canon) => {
                let chain: Vec<String> = canon
                    .chain_keys()
                    .iter()
                    .map(|k| prefix_key(&keys.namespace, k))
                    .collect();
                self.start_pick(host, ctx, Some(Rc::new(chain)))
            }
            Err(e) => {
                self.stats.inc(host, Counter::Fallback(Cause::BadRequest));
                self.log(
                    host,
                    LogLevel::Debug,
                    ctx,
                    format_args!("no prefix ({e}); least-request"),
                );
                self.start_pick(host, ctx, None)
            }
        }
    }
}
