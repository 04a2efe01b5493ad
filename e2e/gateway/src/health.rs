//! Endpoint health as configured, set by the admin API and health checks, and reported to
//! the plugin. Below both `config.rs` (which validates it) and `shared.rs` (which stores it).

use anyhow::{bail, Result};

/// Stored in an `AtomicU8` by `shared::Endpoint` (`as u8` / [`Health::from_u8`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    Healthy = 0,
    Degraded = 1,
    Unhealthy = 2,
}

impl Health {
    pub fn parse(s: &str) -> Result<Health> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "healthy" => Health::Healthy,
            "degraded" => Health::Degraded,
            "unhealthy" => Health::Unhealthy,
            _ => bail!("health must be Healthy|Degraded|Unhealthy, got {s:?}"),
        })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Healthy => "Healthy",
            Health::Degraded => "Degraded",
            Health::Unhealthy => "Unhealthy",
        }
    }
    pub fn from_u8(v: u8) -> Health {
        match v {
            0 => Health::Healthy,
            1 => Health::Degraded,
            _ => Health::Unhealthy,
        }
    }
}
