//! The waiting queue (README "Waiting queue", docs/redis-data-model.md §12): a request refused
//! for want of room waits here, headers held, highest class then arrival first; the head
//! retries once per tick, per local release and after each admission, never each waiter on
//! its own. Across gateways (Redis wait set) and worker VMs (shared-data `waiters`) a waiting
//! higher class holds back the room lower classes would take.

use super::request::{Event, Leave, Request, Ticket, WaitAnswer, Waiter};
use super::{waiters, Balancer};
use crate::config::PluginConfig;
use crate::host::Host;
use std::rc::Rc;

/// The root tick that retries the waiting queue's head and ends waits past their deadline:
/// a twentieth of the shortest `queueTimeoutMs`, within 10-50 ms (a waiter learns of room
/// freed on another gateway at the next tick).
pub(super) fn queue_tick_ms(config: &PluginConfig) -> u32 {
    config
        .all()
        .filter_map(|c| c.common.queue)
        .map(|q| (q.timeout_ms / 20).clamp(10, 50) as u32)
        .min()
        .unwrap_or(0)
}

/// A score unit per class rank in the Redis wait set (docs/redis-data-model.md §12; the
/// scripts' `WAIT_RANK`, 2^42 ms): `rank * WAIT_RANK + expiry`.
pub const WAIT_RANK: u64 = 1 << 42;

impl Balancer {
    /// Waiting requests past their deadline get the 429 they would have got at once.
    pub(super) fn expire_queue(&mut self, host: &mut dyn Host) {
        let now = host.now_ms();
        let due: Vec<(usize, u64, u32)> = self
            .waiting
            .iter()
            .filter(|(_, _, ctx)| {
                self.requests
                    .get(ctx)
                    .and_then(Request::ticket)
                    .is_none_or(|t| now >= t.deadline_ms)
            })
            .copied()
            .collect();
        for entry in due {
            self.waiting.remove(&entry);
            let ctx = entry.2;
            if host.set_effective_context(ctx).is_ok() {
                self.resumed(host, ctx, Event::QueueTimeout);
            }
        }
    }

    /// Room may have freed (`kicks` times): the queue's head tries again, highest class first,
    /// then arrival order; one acquire per kick. A head that finds no room waits again.
    pub(super) fn serve_queue(&mut self, host: &mut dyn Host) {
        while self.kicks > 0 {
            self.kicks -= 1;
            let Some((rank, seq, ctx)) = self.waiting.pop_first() else {
                self.kicks = 0;
                return;
            };
            if !self.requests.get(&ctx).is_some_and(Request::is_waiting) {
                self.kicks += 1; // a stale entry: the kick goes to the next one
                continue;
            }
            if host.set_effective_context(ctx).is_err() {
                // The host lost the stream: on_done removes it; keep its place until then.
                self.waiting.insert((rank, seq, ctx));
                continue;
            }
            self.resumed(host, ctx, Event::Admit);
        }
    }

    /// Queues request `ctx` (refused for want of room), or queues it again after a retry
    /// found no room, or says why it cannot wait.
    pub(super) fn wait(&mut self, host: &mut dyn Host, ctx: u32) -> WaitAnswer {
        let now = host.now_ms();
        let Some(req) = self.requests.get(&ctx) else {
            return WaitAnswer::Full;
        };
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
        let id = self.rng.next_u64();
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
            Some(w @ Waiter::Redis { .. }) => {
                let score = (rank as u64).saturating_mul(WAIT_RANK) + deadline_ms % WAIT_RANK;
                self.redis.waiter(host, &mut self.tel, w, Some(score));
            }
            Some(Waiter::Shared { key, id }) => {
                // Unwritten, this waiter only loses its class's precedence on other workers.
                let _ = waiters::set(host, key, *id, Some(rank), deadline_ms);
            }
            None => {}
        }
        self.queue_seq += 1;
        self.queued += 1;
        self.tel.inc(host, crate::stats::Counter::QueueQueued);
        let ticket = Ticket {
            rank,
            seq: self.queue_seq,
            since_ms: now,
            deadline_ms,
            waiter,
        };
        self.waiting.insert((rank, ticket.seq, ctx));
        WaitAnswer::Wait(ticket)
    }

    /// Request `ctx` left the queue (`why`): its place, its Redis waiter, counted.
    pub(super) fn leave_queue(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        ticket: Ticket,
        why: Leave,
    ) {
        use crate::stats::Counter;
        self.waiting.remove(&(ticket.rank, ticket.seq, ctx));
        self.queued = self.queued.saturating_sub(1);
        match ticket.waiter.as_deref() {
            Some(w @ Waiter::Redis { .. }) => self.redis.waiter(host, &mut self.tel, w, None),
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
            self.tel.inc(host, c);
        }
        let waited = host.now_ms().saturating_sub(ticket.since_ms);
        if let Some(req) = self.requests.get_mut(&ctx) {
            req.queued_ms = Some(waited);
        }
    }

    /// How many requests wait or retry in this VM's queue (tests and leak checks).
    pub fn queued(&self) -> usize {
        self.queued
    }
}
