//! The merge of one route's latency models with the fleet's (latency_merge.lua,
//! docs/redis-data-model.md §15): this gateway's samples since its last merge and the
//! coefficients it last solved go out in one call; the fleet's records come back and become the
//! gateway's models. A merge that fails keeps its samples for the next one: a Redis outage
//! delays sharing, it loses nothing and stops nothing (the gateway goes on learning and
//! predicting alone).

use super::shared::Shared;
use crate::balancer::redis_client::{OnReply, RedisClient};
use crate::balancer::telemetry::Telemetry;
use crate::config::latency::LatencySettings;
use crate::config::RouteConfig;
use crate::host::{Host, LogLevel};
use crate::reason::Cause;
use crate::redis::scripts::latency::{merge_call, parse_merged, Merge};
use crate::redis::scripts::Keys;
use crate::stats::Counter;
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
            records: &records,
            coefficients: &coefficients,
        },
    );
    shared.set_merging(true);
    let then = Box::new(Merged {
        shared: shared.clone(),
        sent: records,
    });
    redis.send_own(host, tel, config, &query, then);
}

/// A merge in flight: what it sent, to keep if it fails.
struct Merged {
    shared: Shared,
    sent: Vec<(String, Vec<f64>)>,
}

impl OnReply for Merged {
    fn reply(
        self: Box<Self>,
        host: &mut dyn Host,
        tel: &mut Telemetry,
        reply: Result<Vec<u8>, Cause>,
    ) {
        self.shared.set_merging(false);
        let Ok(mut book) = self.shared.book.try_borrow_mut() else {
            return;
        };
        let fleet = reply
            .map_err(|c| c.name().to_string())
            .and_then(|raw| parse_merged(&raw).map_err(|e| e.to_string()));
        match fleet {
            Ok(fleet) => {
                book.merged(&fleet);
                tel.inc(host, Counter::LatencyMerges);
                let pct = |e: Option<f64>| e.map(|e| (e * 100.0).round() as i64);
                let errors: Vec<(String, [Option<i64>; 2])> = book
                    .errors()
                    .into_iter()
                    .map(|(pod, t, p)| (pod.to_string(), [pct(t), pct(p)]))
                    .collect();
                drop(book);
                for (pod, values) in errors {
                    tel.latency_pods.set(host, &pod, values);
                }
            }
            Err(e) => {
                book.restore(&self.sent);
                tel.inc(host, Counter::LatencyMergeFailures);
                tel.log(
                    host,
                    LogLevel::Debug,
                    0,
                    format_args!("latency merge failed ({e}): its samples go with the next one"),
                );
            }
        }
    }
}
