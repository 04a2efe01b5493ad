//! A route's retry policy: Envoy's `RouteAction.retry_policy` (api/envoy/config/route/v3/
//! route_components.proto `RetryPolicy`), its field names and meaning, for the conditions the
//! emulator models. What a try's outcome asks for; `retry.rs` runs the tries.

use anyhow::{bail, Result};
use serde::Deserialize;
use std::time::Duration;

/// `retry_policy` of a route (README "Configuration"). The retry host predicate is always
/// Envoy's `previous_hosts` (what Istio's and Higress's default routes configure): a retry
/// never goes to a host already tried while another healthy one is left.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// Comma-separated conditions: `5xx`, `gateway-error`, `connect-failure`, `reset`,
    /// `retriable-status-codes`; any other is refused at start.
    #[serde(default)]
    pub retry_on: String,
    /// Retries after the first try; Envoy's default is 1.
    #[serde(default = "one")]
    pub num_retries: u32,
    /// The statuses `retriable-status-codes` retries.
    #[serde(default)]
    pub retriable_status_codes: Vec<u16>,
    /// Each try's own timeout (Envoy's `per_try_timeout`; absent or 0: none, the cluster's
    /// `timeout_ms` alone bounds the request, all its tries).
    #[serde(default)]
    pub per_try_timeout_ms: Option<u64>,
    #[serde(skip)]
    on: RetryOn,
}

fn one() -> u32 {
    1
}

/// The parsed `retry_on`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct RetryOn {
    five_xx: bool,
    gateway_error: bool,
    connect_failure: bool,
    reset: bool,
    retriable_status_codes: bool,
}

/// How a try ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TryOutcome {
    /// Response headers with this status.
    Status(u16),
    /// No connection to the host (refused, connect timeout).
    ConnectFailure,
    /// The connection failed or was reset before the response headers.
    Reset,
    /// No response headers within `per_try_timeout_ms`.
    PerTryTimeout,
}

impl RetryPolicy {
    /// Parses `retry_on`; an unknown condition is a config error.
    pub fn validate(&mut self) -> Result<()> {
        let mut on = RetryOn::default();
        for c in self
            .retry_on
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty())
        {
            match c {
                "5xx" => on.five_xx = true,
                "gateway-error" => on.gateway_error = true,
                "connect-failure" => on.connect_failure = true,
                "reset" => on.reset = true,
                "retriable-status-codes" => on.retriable_status_codes = true,
                _ => bail!(
                    "retry_on: unknown condition {c:?} (the emulator models 5xx, gateway-error, \
                     connect-failure, reset, retriable-status-codes)"
                ),
            }
        }
        self.on = on;
        Ok(())
    }

    /// Each try's timeout, if any.
    pub fn per_try_timeout(&self) -> Option<Duration> {
        self.per_try_timeout_ms
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis)
    }

    /// Whether a try that ended so is retried (retries left permitting), as Envoy's
    /// `RetryStateImpl` decides: `5xx` any 5xx status, `gateway-error` 502/503/504, both also
    /// any try without a response (connect failure, reset, per-try timeout); `reset` any try
    /// without a response; `connect-failure` a connect failure only; `retriable-status-codes`
    /// the statuses listed.
    pub fn retries(&self, outcome: TryOutcome) -> bool {
        let on = &self.on;
        match outcome {
            TryOutcome::Status(s) => {
                (on.five_xx && (500..600).contains(&s))
                    || (on.gateway_error && (502..=504).contains(&s))
                    || (on.retriable_status_codes && self.retriable_status_codes.contains(&s))
            }
            TryOutcome::ConnectFailure => {
                on.five_xx || on.gateway_error || on.reset || on.connect_failure
            }
            TryOutcome::Reset | TryOutcome::PerTryTimeout => {
                on.five_xx || on.gateway_error || on.reset
            }
        }
    }
}

/// Envoy's wait before retry `n` (1, 2, …) with the default `retry_back_off` (base 25 ms, max
/// 250 ms): fully jittered, a random time below `(2^n - 1) × 25 ms`, at most 250 ms
/// (`JitteredExponentialBackOffStrategy`).
pub fn back_off(n: u32) -> Duration {
    const BASE_MS: u64 = 25;
    const MAX_MS: u64 = 250;
    let ceiling = ((1u64 << n.min(10)) - 1) * BASE_MS;
    Duration::from_millis(rand::random_range(0..ceiling.max(1)).min(MAX_MS))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(retry_on: &str, codes: &[u16]) -> RetryPolicy {
        let mut p = RetryPolicy {
            retry_on: retry_on.into(),
            num_retries: 1,
            retriable_status_codes: codes.to_vec(),
            per_try_timeout_ms: None,
            on: RetryOn::default(),
        };
        p.validate().unwrap();
        p
    }

    #[test]
    fn conditions_retry_what_envoy_retries() {
        use TryOutcome::*;
        let all = [
            Status(500),
            Status(502),
            Status(503),
            Status(504),
            Status(429),
            Status(200),
            ConnectFailure,
            Reset,
            PerTryTimeout,
        ];
        let retried = |p: &RetryPolicy| -> Vec<TryOutcome> {
            all.iter().copied().filter(|o| p.retries(*o)).collect()
        };
        let no_answer = [ConnectFailure, Reset, PerTryTimeout];
        let five_xx = [Status(500), Status(502), Status(503), Status(504)];
        assert_eq!(
            retried(&policy("5xx", &[])),
            [&five_xx[..], &no_answer].concat()
        );
        assert_eq!(
            retried(&policy("gateway-error", &[])),
            [&five_xx[1..], &no_answer].concat()
        );
        assert_eq!(retried(&policy("reset", &[])), no_answer);
        assert_eq!(retried(&policy("connect-failure", &[])), [ConnectFailure]);
        assert_eq!(
            retried(&policy("retriable-status-codes", &[503, 429])),
            [Status(503), Status(429)]
        );
        // The codes alone retry nothing.
        assert!(retried(&policy("connect-failure", &[500])) == [ConnectFailure]);
        assert!(retried(&policy(" 5xx , reset ", &[])).len() == 7);
        assert!(retried(&policy("", &[])).is_empty());
    }

    #[test]
    fn an_unknown_condition_is_refused() {
        let mut p = policy("5xx", &[]);
        p.retry_on = "5xx,retriable-4xx".into();
        let e = p.validate().unwrap_err().to_string();
        assert!(e.contains("\"retriable-4xx\""), "{e}");
    }

    #[test]
    fn back_off_is_jittered_below_envoys_ceiling() {
        for _ in 0..200 {
            assert!(back_off(1) < Duration::from_millis(25));
            assert!(back_off(2) < Duration::from_millis(75));
            assert!(back_off(9) <= Duration::from_millis(250));
        }
    }
}
