//! What both builds decide before a request is placed by the latency models
//! (docs/latency-model.md §5 "Trust", "Bad input"): whether this worker's models predict well
//! enough to place by (`maxMAPE`; a change is logged once, each fallback counted), and the
//! request's objectives from its headers (a bad header counted, and logged once).

use super::objectives::{self, Objectives};
use crate::balancer::telemetry::Telemetry;
use crate::config::latency::LatencySettings;
use crate::host::{Host, LogLevel};
use crate::stats::Counter;

/// One route config's trust in its models, per worker.
#[derive(Debug)]
pub struct Trust {
    pub settings: LatencySettings,
    /// Whether the model was trusted at the last pick (a change is logged once).
    trusted: bool,
    /// A bad objective header was logged (once per VM and route).
    warned_objective: bool,
}

impl Trust {
    pub fn new(settings: LatencySettings) -> Trust {
        Trust {
            settings,
            trusted: true,
            warned_objective: false,
        }
    }

    /// The request's objectives when the models predict well enough to place by (`mape`: their
    /// TTFT error, `Book::ttft_mape`; counted in
    /// `ai_lb.latency.placed`); None (counted in `ai_lb.latency.fallback`): the token gate
    /// places it, while the models go on learning until they predict well again.
    pub fn objectives(
        &mut self,
        host: &mut dyn Host,
        tel: &mut Telemetry,
        ctx: u32,
        mape: Option<f64>,
    ) -> Option<Objectives> {
        let trusted = mape.is_none_or(|m| m <= self.settings.max_mape);
        if trusted != self.trusted {
            self.trusted = trusted;
            let (level, what) = match trusted {
                true => (
                    LogLevel::Info,
                    "predicts within maxMAPE again: placing by it",
                ),
                false => (
                    LogLevel::Warn,
                    "predicts past maxMAPE: the token gate places until it recovers",
                ),
            };
            tel.log(
                host,
                level,
                ctx,
                format_args!(
                    "latency model (TTFT error {:.0} %) {what} (counted in ai_lb.latency.fallback)",
                    mape.unwrap_or(0.0) * 100.0
                ),
            );
        }
        if !trusted {
            tel.inc(host, Counter::LatencyFallback);
            return None;
        }
        let header = |name: &str| host.request_header(name).ok().flatten();
        let (ttft, tpot) = (
            header(objectives::TTFT_HEADER),
            header(objectives::TPOT_HEADER),
        );
        let o = objectives::of(&self.settings, ttft.as_deref(), tpot.as_deref());
        if o.refused {
            tel.inc(host, Counter::LatencyBadObjective);
            if !self.warned_objective {
                self.warned_objective = true;
                tel.log(
                    host,
                    LogLevel::Warn,
                    ctx,
                    format_args!(
                        "an {} / {} header is not a number of ms in range: the route's objective \
                         is used (counted in ai_lb.latency.bad_objective; logged once)",
                        objectives::TTFT_HEADER,
                        objectives::TPOT_HEADER
                    ),
                );
            }
        }
        tel.inc(host, Counter::LatencyPlaced);
        Some(o)
    }
}
