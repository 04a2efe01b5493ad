//! A request's waiting-queue transitions (docs/sessions-and-queues.md "Waiting queue"): refused for want of room it
//! waits, holding nothing; room may free (one more acquire), or its deadline passes (the 429
//! it would have got at once).

use super::{Again, Effect, Leave, Phase, Rejection, Request, Ticket, WaitAnswer};

impl Request {
    /// The waiting queue's place of this request (the balancer's index follows it).
    pub fn ticket(&self) -> Option<&Ticket> {
        self.ticket.as_ref()
    }

    /// Whether it waits in the queue now (not retrying).
    pub fn is_waiting(&self) -> bool {
        matches!(self.phase, Phase::Waiting { .. })
    }

    /// Stream end while queued (waiting or retrying): its place and Redis waiter go. Whatever
    /// a retry in flight acquired goes back through [`Request::finish`]'s orphan.
    pub fn leave_queue(&mut self) -> Option<Effect> {
        let ticket = self.ticket.take()?;
        Some(Effect::LeaveQueue {
            ticket,
            why: Leave::Abandoned,
        })
    }

    pub(super) fn on_waited(&mut self, rejection: Rejection, answer: WaitAnswer) -> Vec<Effect> {
        if !self.is_waiting() {
            return Vec::new();
        }
        match answer {
            WaitAnswer::Wait(ticket) => {
                self.ticket = Some(ticket);
                Vec::new()
            }
            WaitAnswer::Full => self.reject(rejection),
            WaitAnswer::Timeout => self.time_out(rejection),
        }
    }

    /// Room may have freed: one more acquire (the same pick, or the policy again).
    pub(super) fn on_admit(&mut self) -> Vec<Effect> {
        let Phase::Waiting { again, .. } = std::mem::replace(&mut self.phase, Phase::Resending)
        else {
            return Vec::new();
        };
        match again {
            Again::Pick(pick) => vec![Effect::Retry(pick)],
            Again::Decide(Some(read)) => vec![Effect::Redecide(read)],
            // The body is not read again: a held body is not readable outside its callback.
            Again::Decide(None) => vec![Effect::Decide { read_body: false }],
        }
    }

    /// The deadline passed: the 429 it would have got at once, and out of the queue.
    pub(super) fn time_out(&mut self, rejection: Rejection) -> Vec<Effect> {
        let mut e = Vec::new();
        if let Some(ticket) = self.ticket.take() {
            e.push(Effect::LeaveQueue {
                ticket,
                why: Leave::Timeout,
            });
        }
        e.extend(self.reject(rejection));
        e
    }

    /// A refusal: with a waiting queue, one for want of room waits instead (docs/sessions-and-queues.md
    /// "Waiting queue"); `again` is how it tries again.
    pub(super) fn refuse(&mut self, r: Rejection, again: Again) -> Vec<Effect> {
        if self.config.common.queue.is_some() && r.may_wait() {
            self.phase = Phase::Waiting {
                rejection: r,
                again,
            };
            return vec![Effect::Wait(r)];
        }
        self.reject(r)
    }
}
