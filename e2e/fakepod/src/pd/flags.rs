//! The `ailb-fakepod` flags of the P/D roles and DP ranks (help text: config.rs `USAGE`).

use super::{LoadFailurePolicy, PdConfig, Role};
use crate::args::Args;
use anyhow::{bail, Result};

/// The settings these flags set.
pub struct Target<'a> {
    pub role: &'a mut Role,
    pub dp_ranks: &'a mut usize,
    pub pd: &'a mut PdConfig,
}

/// Applies `flag` if it is one of ours; `Ok(false)` if it is not.
pub fn apply(t: Target<'_>, flag: &str, a: &mut Args) -> Result<bool> {
    match flag {
        "--role" => {
            *t.role = match a.value(flag)?.as_str() {
                "colocated" => Role::Colocated,
                "prefill" => Role::Prefill,
                "decode" => Role::Decode,
                other => bail!("unknown role {other:?}"),
            }
        }
        "--dp-ranks" => *t.dp_ranks = a.parse(flag)?,
        "--kv-bytes-per-token" => t.pd.kv_bytes_per_token = a.parse(flag)?,
        "--link-bytes-per-s" => t.pd.link_bytes_per_s = a.parse(flag)?,
        "--transfer-fails" => t.pd.transfer_fails = true,
        "--kv-load-failure-policy" => {
            t.pd.load_failure_policy = match a.value(flag)?.as_str() {
                "recompute" => LoadFailurePolicy::Recompute,
                "fail" => LoadFailurePolicy::Fail,
                other => bail!("unknown kv load failure policy {other:?}"),
            }
        }
        "--pin-timeout-us" => t.pd.pin_timeout_us = a.parse(flag)?,
        "--bootstrap-port" => t.pd.bootstrap_port = a.parse(flag)?,
        "--bootstrap-timeout-us" => t.pd.bootstrap_timeout_us = a.parse(flag)?,
        _ => return Ok(false),
    }
    Ok(true)
}

/// Checks what the flags set.
pub fn check(dp_ranks: usize, pd: &PdConfig) -> Result<()> {
    if dp_ranks == 0 {
        bail!("--dp-ranks must be positive");
    }
    if !(pd.link_bytes_per_s.is_finite() && pd.link_bytes_per_s > 0.0) {
        bail!("--link-bytes-per-s must be a finite number > 0");
    }
    Ok(())
}
