//! Plain Envoy: whether the host delivers the body of a request the plugin holds at its
//! headers (docs/higress-abi.md §10). Without the wasm filter's
//! `allow_on_headers_stop_iteration`, Envoy turns a headers Pause into "stop everything": the
//! body is buffered and delivered only after the request is resumed, at once. The root tick
//! releases a request held past `maxBodyWaitMs` (`Event::BodyTimeout`); a body that then
//! arrives at once shows the host withheld it, and from then on this VM decides at the headers
//! (docs/plain-envoy.md).

use super::request::Request;
use super::telemetry::Telemetry;
use crate::config::PluginConfig;
use crate::host::{Host, LogLevel};
use crate::id_map::IdMap;
use crate::stats::Counter;

/// What this VM has seen of the host's body delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Unknown,
    /// A held request received a body chunk: the flag is set.
    Delivered,
    /// A request released by the body deadline got its body right at the release: Envoy held
    /// it back. Routes that use the body decide at the headers from now on (no hold).
    Withheld,
}

/// A body chunk arriving this soon after the deadline released its request was held back by
/// the host, not late from the client: Envoy delivers the buffered body in the same event-loop
/// turn as the resume (docs/plain-envoy.md).
pub const WITHHELD_GAP_MS: u64 = 50;

/// The root tick that checks body deadlines: a tenth of the shortest wait, within 10-100 ms.
pub fn tick_ms(config: &PluginConfig) -> u32 {
    config
        .all()
        .filter(|c| !c.decide_at_headers && c.common.max_body_wait_ms > 0)
        .map(|c| (c.common.max_body_wait_ms / 10).clamp(10, 100) as u32)
        .min()
        .unwrap_or(0)
}

/// The body-flow probe's state.
pub struct BodyFlow {
    flow: Flow,
    /// Requests the body deadline released while the flow was unknown: when each was released
    /// (ms), to tell a withheld body from a late one.
    released: IdMap<u64>,
}

impl Default for BodyFlow {
    fn default() -> BodyFlow {
        BodyFlow {
            flow: Flow::Unknown,
            released: IdMap::default(),
        }
    }
}

impl BodyFlow {
    /// Whether this VM learned that the host withholds a held request's body.
    pub fn withheld(&self) -> bool {
        self.flow == Flow::Withheld
    }

    /// A held request that wants its body received a chunk: the host delivers bodies.
    pub fn delivered(&mut self) {
        if self.flow == Flow::Unknown {
            self.flow = Flow::Delivered;
            self.released.clear();
        }
    }

    /// Stream `ctx` ended.
    pub fn forget(&mut self, ctx: u32) {
        self.released.remove(&ctx);
    }

    /// The requests held for their body past `maxBodyWaitMs` at `now`, or every one held for
    /// it once the host is known to withhold the body: each is balanced without it and
    /// resumed (`Event::BodyTimeout`), so a filter deployed without
    /// `allow_on_headers_stop_iteration` never hangs a request.
    pub fn due(&self, now: u64, requests: &IdMap<Request>) -> Vec<u32> {
        let withheld = self.withheld();
        let mut due: Vec<u32> = requests
            .iter()
            .filter(|(_, r)| r.body_deadline().is_some_and(|d| withheld || now >= d))
            .map(|(ctx, _)| ctx)
            .collect();
        due.sort_unstable();
        due
    }

    /// The deadline released request `ctx` at `now`: while the flow is unknown, its first
    /// body chunk will tell.
    pub fn released(&mut self, ctx: u32, now: u64) {
        if self.flow == Flow::Unknown {
            self.released.insert(ctx, now);
        }
    }

    /// A body chunk of request `ctx`. The first one of a request the deadline released, right
    /// at the release, means the host held it back (the filter lacks
    /// `allow_on_headers_stop_iteration`).
    pub fn chunk(&mut self, host: &mut dyn Host, tel: &Telemetry, ctx: u32) {
        let Some(released_ms) = self.released.remove(&ctx) else {
            return;
        };
        let gap = host.now_ms().saturating_sub(released_ms);
        tel.log(
            host,
            LogLevel::Debug,
            ctx,
            format_args!("first body chunk {gap} ms after the body deadline released it"),
        );
        if self.flow != Flow::Unknown || gap > WITHHELD_GAP_MS {
            return;
        }
        self.flow = Flow::Withheld;
        self.released.clear();
        tel.inc(host, Counter::BodyWithheldDetected);
        tel.log(
            host,
            LogLevel::Warn,
            ctx,
            format_args!(
                "Envoy delivers the request body only after the filter releases the request: \
                 the wasm filter's config lacks `allow_on_headers_stop_iteration: true`. \
                 This worker now balances at the request headers, without the body \
                 (counted as ai_lb.fallback.body_withheld)"
            ),
        );
    }
}
