//! The waiting queue of a VM (docs/sessions-and-queues.md "Waiting queue"): requests refused for want of room wait
//! here, highest class first, then in arrival order. A request joins through `Effect::Wait`,
//! leaves through `Effect::LeaveQueue`; room freed (a count given back, an admission, the
//! root tick) lets the head try once more (`Event::Admit`), and the tick ends waits past
//! their deadline (`Event::QueueTimeout`). Each waiter may also have an entry among every
//! gateway's (Redis) or worker's (shared data) waiters, so that classes order across them
//! (docs/redis-data-model.md §12).

use super::redis_client::RedisClient;
use super::request::{Leave, Request, Ticket, WaitAnswer, Waiter};
use super::rng::VmRng;
use super::telemetry::Telemetry;
use super::waiters;
use crate::config::PluginConfig;
use crate::host::Host;
use crate::id_map::IdMap;
use crate::stats::Counter;
use std::collections::BTreeSet;
use std::rc::Rc;

/// A score unit per class rank in the Redis wait set (docs/redis-data-model.md §12; the
/// scripts' `WAIT_RANK`, 2^42 ms): `rank * WAIT_RANK + expiry`.
pub const WAIT_RANK: u64 = 1 << 42;

/// The root tick that retries the waiting queue's head and ends waits past their deadline:
/// a twentieth of the shortest `queueTimeoutMs`, within 10-50 ms (a waiter learns of room
/// freed on another gateway at the next tick).
pub fn tick_ms(config: &PluginConfig) -> u32 {
    config
        .all()
        .filter_map(|c| c.common.queue)
        .map(|q| (q.timeout_ms / 20).clamp(10, 50) as u32)
        .min()
        .unwrap_or(0)
}

/// The queue's own state.
#[derive(Default)]
pub struct Queue {
    /// The requests waiting now (not retrying): (class rank, arrival, context id).
    waiting: BTreeSet<(usize, u64, u32)>,
    /// Requests holding a queue ticket (waiting or retrying), against `maxQueued`.
    queued: usize,
    /// Arrival order.
    seq: u64,
    /// Room may have freed this many times since the queue was last served.
    kicks: usize,
}

impl Queue {
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// A count given back (a lease, a per-proxy count, a service's): room for the head,
    /// served by the next [`Queue::next_head`].
    pub fn room_freed(&mut self) {
        if !self.waiting.is_empty() {
            self.kicks += 1;
        }
    }

    /// The root tick: room freed on another gateway (or a pod that came back) is not
    /// announced, so the head tries once per tick, never each waiting request.
    pub fn tick(&mut self) {
        self.kicks = self.kicks.max(1);
    }

    /// How many requests wait or retry, against `maxQueued`.
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Queues request `ctx` (refused for want of room), or queues it again after a retry
    /// found no room, or says why it cannot wait.
    pub fn join(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        req: &Request,
        redis: &mut RedisClient,
        tel: &mut Telemetry,
        rng: &mut VmRng,
    ) -> WaitAnswer {
        let now = host.now_ms();
        let Some(queue) = req.config.common.queue else {
            return WaitAnswer::Full;
        };
        if let Some(t) = req.ticket() {
            if now >= t.deadline_ms {
                return WaitAnswer::Timeout;
            }
            self.waiting.insert((t.rank, t.seq, ctx));
            return WaitAnswer::Wait(t.clone());
        }
        if self.queued as u64 >= queue.max_queued {
            return WaitAnswer::Full;
        }
        // The class as the policy read it (not counted again when unknown).
        let rank = req.config.common.priority.as_ref().map_or(0, |p| {
            let value = host.request_header(&p.header).ok().flatten();
            p.class_of(value.as_deref()).rank
        });
        let deadline_ms = now.saturating_add(queue.timeout_ms);
        // Only classes order waiters across gateways and workers: without them no entry.
        let id = rng.next_u64();
        let waiter = match (&req.keys, &req.config.redis, &req.config.common.priority) {
            (_, _, None) => None,
            (Some(keys), Some(_), Some(_)) => Some(Rc::new(Waiter::Redis {
                config: req.config.clone(),
                keys: keys.clone(),
                member: format!("{id:016x}"),
            })),
            (_, None, Some(_)) if !req.config.endpoints.is_empty() => {
                Some(Rc::new(Waiter::Shared {
                    key: waiters::key(&req.config.endpoints),
                    id,
                }))
            }
            _ => None,
        };
        match waiter.as_deref() {
            Some(Waiter::Redis {
                config,
                keys,
                member,
            }) => {
                let score = (rank as u64).saturating_mul(WAIT_RANK) + deadline_ms % WAIT_RANK;
                redis.waiter(host, tel, (config, keys, member), Some(score));
            }
            Some(Waiter::Shared { key, id }) => {
                // Unwritten, this waiter only loses its class's precedence on other workers.
                let _ = waiters::set(host, key, *id, Some(rank), deadline_ms);
            }
            None => {}
        }
        self.seq += 1;
        self.queued += 1;
        tel.inc(host, Counter::QueueQueued);
        let ticket = Ticket {
            rank,
            seq: self.seq,
            since_ms: now,
            deadline_ms,
            waiter,
        };
        self.waiting.insert((rank, ticket.seq, ctx));
        WaitAnswer::Wait(ticket)
    }

    /// Request `ctx` left the queue (`why`): its place, its waiter entry, counted. How long it
    /// waited (ms).
    pub fn leave(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        ticket: Ticket,
        why: Leave,
        redis: &mut RedisClient,
        tel: &mut Telemetry,
    ) -> u64 {
        self.waiting.remove(&(ticket.rank, ticket.seq, ctx));
        self.queued = self.queued.saturating_sub(1);
        match ticket.waiter.as_deref() {
            Some(Waiter::Redis {
                config,
                keys,
                member,
            }) => redis.waiter(host, tel, (config, keys, member), None),
            Some(Waiter::Shared { key, id }) => {
                // Not removed: the line expires at its deadline.
                let _ = waiters::set(host, key, *id, None, 0);
            }
            None => {}
        }
        let counter = match why {
            Leave::Admitted => {
                // Room was found: maybe more of it, for the next one (it stops at no room).
                self.kicks += 1;
                Some(Counter::QueueAdmitted)
            }
            Leave::Timeout => Some(Counter::QueueTimeout),
            Leave::Abandoned => Some(Counter::QueueAbandoned),
            Leave::Other => None,
        };
        if let Some(c) = counter {
            tel.inc(host, c);
        }
        host.now_ms().saturating_sub(ticket.since_ms)
    }

    /// The waiting requests past their deadline, out of the queue: each gets the 429 it
    /// would have got at once (`Event::QueueTimeout`).
    pub fn expired(&mut self, now: u64, requests: &IdMap<Request>) -> Vec<u32> {
        let due: Vec<(usize, u64, u32)> = self
            .waiting
            .iter()
            .filter(|(_, _, ctx)| {
                requests
                    .get(ctx)
                    .and_then(Request::ticket)
                    .is_none_or(|t| now >= t.deadline_ms)
            })
            .copied()
            .collect();
        for entry in &due {
            self.waiting.remove(entry);
        }
        due.into_iter().map(|(_, _, ctx)| ctx).collect()
    }

    /// Room may have freed (`kicks` times): the head that tries again next, highest class
    /// first, then arrival order, made the host's effective context; one acquire per kick. A
    /// head that finds no room waits again.
    pub fn next_head(&mut self, host: &mut dyn Host, requests: &IdMap<Request>) -> Option<u32> {
        while self.kicks > 0 {
            self.kicks -= 1;
            let Some((rank, seq, ctx)) = self.waiting.pop_first() else {
                self.kicks = 0;
                return None;
            };
            if !requests.get(&ctx).is_some_and(Request::is_waiting) {
                self.kicks += 1; // a stale entry: the kick goes to the next one
                continue;
            }
            if host.set_effective_context(ctx).is_err() {
                // The host lost the stream: on_done removes it; keep its place until then.
                self.waiting.insert((rank, seq, ctx));
                continue;
            }
            return Some(ctx);
        }
        None
    }
}
