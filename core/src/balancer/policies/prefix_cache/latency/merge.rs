//! The merge of one route's latency models with the fleet's (latency_merge.lua,
//! docs/redis-data-model.md §15): this gateway's samples since its last merge and the
//! coefficients it last solved go out in one call; the fleet's records come back and become the
//! gateway's models. A merge that fails keeps its batches for the next one, under their numbers
//! (shared.rs `Outbox`): a Redis outage delays sharing, it loses nothing, counts nothing twice
//! and stops nothing (the gateway goes on learning and predicting alone).

use super::shared::Shared;
use crate::balancer::redis_client::{OnReply, RedisClient};
use crate::balancer::telemetry::Telemetry;
use crate::config::latency::LatencySettings;
use crate::config::RouteConfig;
use crate::host::{Host, LogLevel};
use crate::reason::Cause;
use crate::redis::scripts::latency::{merge_call, parse_merged, Merge};
use crate::redis::scripts::Keys;
use std::rc::Rc;

pub(super) fn send(
    host: &mut dyn Host,
    tel: &mut Telemetry,
    redis: &mut RedisClient,
    (config, keys): (&Rc<RouteConfig>, &Rc<Keys>),
    shared: &Shared,
    settings: &LatencySettings,
) {
    let Ok(mut book) = shared.book.try_borrow_mut() else {
        return;
    };
    let records = book.take_unsent();
    let Ok(mut outbox) = shared.outbox.try_borrow_mut() else {
        return;
    };
    let dropped = outbox.file(records);
    if dropped > 0 {
        tel.log(
            host,
            LogLevel::Warn,
            0,
            format_args!("latency merges keep failing: {dropped} batch of samples dropped"),
        );
    }
    let coefficients: Vec<(String, Vec<f64>)> = book
        .coefficients()
        .into_iter()
        .map(|(pod, c)| (pod, c.to_vec()))
        .collect();
    drop(book);
    let query = merge_call(
        keys,
        &Merge {
            now_ms: host.now_ms(),
            half_life_ms: settings.half_life_ms,
            sender: &outbox.sender,
            batches: &outbox.pending,
            coefficients: &coefficients,
        },
    );
    drop(outbox);
    shared.set_merging(true);
    let then = Box::new(Merged {
        shared: shared.clone(),
    });
    redis.send_own(host, tel, config, &query, then);
}

/// A merge in flight.
struct Merged {
    shared: Shared,
}

impl OnReply for Merged {
    fn reply(
        self: Box<Self>,
        host: &mut dyn Host,
        tel: &mut Telemetry,
        reply: Result<Vec<u8>, Cause>,
    ) {
        self.shared.set_merging(false);
        let fleet = reply
            .map_err(|c| c.name().to_string())
            .and_then(|raw| parse_merged(&raw).map_err(|e| e.to_string()));
        if fleet.is_ok() {
            if let Ok(mut outbox) = self.shared.outbox.try_borrow_mut() {
                outbox.delivered();
            }
        }
        self.shared.settle(host, tel, fleet);
    }
}
