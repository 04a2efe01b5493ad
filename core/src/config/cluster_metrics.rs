//! `lb_type: cluster`, `lb_policy: cluster_metrics`: Higress's keys, types, defaults and checks,
//! in the order its Go constructor runs them (docs/configuration.md "Cluster policies" table). The first
//! failing check is the error, with Go's own text.

use super::error::ConfigError;
use super::go::{Field, Go};
use super::inflight::{self, GlobalInflight};
use super::raw::RawLbConfig;
use super::read::{header_or, In, Reader};

pub const CLUSTER_METRICS_KEYS: &[&str] = &[
    "mode",
    "service_list",
    "cluster_header",
    "rate_limit",
    "queue_size",
    "ewma_beta",
    "p2c_choices",
    "ttft_weight",
    "total_latency_weight",
    "error_penalty",
    "failure_cooldown_ms",
    "metrics_missing_policy",
    "global_inflight_enabled",
    "global_inflight_key_prefix",
    "global_inflight_timeout",
    "global_inflight_key_ttl",
    // Ours.
    "inflight_capacity",
];

/// Highest `inflight_capacity` accepted (no service runs a million requests at once).
pub const MAX_INFLIGHT_CAPACITY: u64 = 1_000_000;

pub const DEFAULT_CLUSTER_HEADER: &str = "x-higress-target-cluster";

/// `mode`, matched exactly (case-sensitive) as Go does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterMode {
    LeastBusy,
    LeastTotalLatency,
    LeastFirstTokenLatency,
    AdaptiveScore,
    /// Any other value, absent included: Go keeps its uniformly random starting pick.
    Random,
}

/// `metrics_missing_policy`: Go knows one value and replaces any other with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingMetrics {
    /// A service without latency samples is scored by its in-flight count alone.
    LeastBusy,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ClusterMetricsConfig {
    pub mode: ClusterMode,
    /// Envoy cluster names, as given (duplicates and empty names kept, as in Go).
    pub service_list: Vec<String>,
    pub cluster_header: String,
    /// Highest share of all selections a service may have and still be preferred (1.0).
    pub rate_limit: f64,
    /// Samples per latency ring as configured; see [`Self::ring_capacity`].
    pub queue_size: i64,
    pub ewma_beta: f64,
    pub p2c_choices: usize,
    pub ttft_weight: f64,
    pub total_latency_weight: f64,
    pub error_penalty: f64,
    pub failure_cooldown_ms: i64,
    pub metrics_missing_policy: MissingMetrics,
    /// `global_inflight_enabled` with its Redis (never in the plain-Envoy build).
    pub global_inflight: Option<GlobalInflight>,
    /// Ours (`inflight_capacity`): requests a service runs at once without slowing down.
    /// AdaptiveScore's in-flight factor becomes `1 + ongoing / capacity` and a service with no
    /// latency sample yet is scored at its candidates' mean latency (docs/configuration.md
    /// "Cluster policies"). None: Higress's formula exactly.
    pub inflight_capacity: Option<u64>,
}

impl ClusterMetricsConfig {
    /// Go's `NewFixedQueue`: a non-positive capacity becomes 16.
    pub fn ring_capacity(&self) -> usize {
        usize::try_from(self.queue_size)
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or(16)
    }
}

/// Go's `getFloatConfig`: the default when absent. NaN (only from a string such as `"NaN"`)
/// passes Go's range checks and poisons every score; it is read as the default instead.
fn float_or(r: &mut Reader<'_>, key: &str, v: &Field<Go>, default: f64) -> f64 {
    // Checked before the lenient read, whose warning would say "read as the number NaN".
    let nan = v.as_ref().is_some_and(|g| g.float(false).0.is_nan());
    if nan {
        r.warn(
            key,
            format!(
                "a string that reads as NaN: the default {default} is used (Higress would \
                 compute with NaN)"
            ),
        );
        return default;
    }
    r.float(key, v).unwrap_or(default)
}

impl TryFrom<In<'_, '_, RawLbConfig>> for ClusterMetricsConfig {
    type Error = ConfigError;

    fn try_from(i: In<'_, '_, RawLbConfig>) -> Result<Self, ConfigError> {
        let (raw, r) = (i.raw, i.r);
        let mode = match r.string("mode", &raw.mode).as_deref() {
            Some("LeastBusy") => ClusterMode::LeastBusy,
            Some("LeastTotalLatency") => ClusterMode::LeastTotalLatency,
            Some("LeastFirstTokenLatency") => ClusterMode::LeastFirstTokenLatency,
            Some("AdaptiveScore") => ClusterMode::AdaptiveScore,
            other => {
                let what = other.map_or("absent".into(), |m| format!("`{m}` is not a mode"));
                r.warn("mode", format!("{what} (LeastBusy, LeastTotalLatency, LeastFirstTokenLatency, AdaptiveScore): a uniformly random service per request, as in Higress"));
                ClusterMode::Random
            }
        };
        let cluster_header = header_or(
            r,
            "cluster_header",
            &raw.cluster_header,
            DEFAULT_CLUSTER_HEADER,
        );
        let rate_limit = float_or(r, "rate_limit", &raw.rate_limit, 1.0);
        let ewma_beta = float_or(r, "ewma_beta", &raw.ewma_beta, 0.5);
        if !(0.0..=1.0).contains(&ewma_beta) {
            return Err(r.err_higress("ewma_beta", "ewma_beta must be in range [0, 1]"));
        }
        let p2c = r.int("p2c_choices", &raw.p2c_choices).unwrap_or(0);
        let p2c_choices = match usize::try_from(p2c) {
            Ok(n) if n > 0 => n,
            _ => {
                if raw.p2c_choices.is_some() {
                    r.warn(
                        "p2c_choices",
                        format!("{p2c}: 0 or below means the default 2 (as in Higress)"),
                    );
                }
                2
            }
        };
        let ttft_weight = float_or(r, "ttft_weight", &raw.ttft_weight, 0.7);
        let total_latency_weight =
            float_or(r, "total_latency_weight", &raw.total_latency_weight, 0.3);
        if ttft_weight < 0.0 || total_latency_weight < 0.0 {
            return Err(r.err_higress(
                "ttft_weight",
                "ttft_weight and total_latency_weight must be greater than or equal to 0",
            ));
        }
        if ttft_weight == 0.0 && total_latency_weight == 0.0 {
            return Err(r.err_higress(
                "ttft_weight",
                "ttft_weight and total_latency_weight cannot both be 0",
            ));
        }
        let error_penalty = float_or(r, "error_penalty", &raw.error_penalty, 3.0);
        if error_penalty < 0.0 {
            return Err(r.err_higress(
                "error_penalty",
                "error_penalty must be greater than or equal to 0",
            ));
        }
        let failure_cooldown_ms = r.int_or(
            "failure_cooldown_ms",
            &raw.failure_cooldown_ms,
            30_000,
            " ms",
        );
        if failure_cooldown_ms < 0 {
            return Err(r.err_higress(
                "failure_cooldown_ms",
                "failure_cooldown_ms must be greater than or equal to 0",
            ));
        }
        match r
            .string("metrics_missing_policy", &raw.metrics_missing_policy)
            .as_deref()
        {
            None | Some("least_busy") => {}
            Some(other) => r.warn(
                "metrics_missing_policy",
                format!(
                    "`{other}` is not known: least_busy, the only policy (Higress replaces it too)"
                ),
            ),
        }
        let global_inflight = inflight::read(raw, r, i.build)?;
        let queue_size = r.int_or("queue_size", &raw.queue_size, 100, "");
        if queue_size < 0 {
            r.warn(
                "queue_size",
                format!("{queue_size}: Higress's latency rings then hold 16 samples, as here"),
            );
        }
        let service_list = service_list(raw, r)?;
        let inflight_capacity = r.own("inflight_capacity", &raw.inflight_capacity)?;
        if inflight_capacity.is_some_and(|c| c == 0 || c > MAX_INFLIGHT_CAPACITY) {
            return Err(r.err(
                "inflight_capacity",
                format!("must be between 1 and {MAX_INFLIGHT_CAPACITY}"),
            ));
        }
        if inflight_capacity.is_some() && mode != ClusterMode::AdaptiveScore {
            r.warn(
                "inflight_capacity",
                "read only by mode AdaptiveScore: ignored",
            );
        }
        Ok(ClusterMetricsConfig {
            mode,
            service_list,
            cluster_header,
            rate_limit,
            queue_size,
            ewma_beta,
            p2c_choices,
            ttft_weight,
            total_latency_weight,
            error_penalty,
            failure_cooldown_ms,
            metrics_missing_policy: MissingMetrics::LeastBusy,
            global_inflight,
            inflight_capacity,
        })
    }
}

fn service_list(raw: &RawLbConfig, r: &mut Reader<'_>) -> Result<Vec<String>, ConfigError> {
    let items = r
        .list("service_list", &raw.service_list)
        .unwrap_or_default();
    let mut out: Vec<String> = Vec::with_capacity(items.len());
    for (n, item) in items.iter().enumerate() {
        let name = r
            .string(&format!("service_list[{n}]"), &Field(Some(item.clone())))
            .unwrap_or_default();
        if name.is_empty() {
            r.warn(
                &format!("service_list[{n}]"),
                "empty service name: requests sent there carry an empty cluster header (as in Higress)",
            );
        } else if out.contains(&name) {
            r.warn(
                &format!("service_list[{n}]"),
                format!("`{name}` is listed twice: the random start picks it twice as often (as in Higress)"),
            );
        }
        out.push(name);
    }
    if out.is_empty() {
        return Err(r.err_higress("service_list", "service_list cannot be empty"));
    }
    Ok(out)
}
