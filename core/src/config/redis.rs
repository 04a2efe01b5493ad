//! Higress's Redis keys (`serviceFQDN`, `servicePort`, `username`, `password`, `database`,
//! and the timeout the policy names), read as its Go plugin reads them: an empty host or a
//! port that reads as 0 is refused (`invalid redis service config`); anything else is
//! accepted, even a cluster name that cannot exist (then, as in Higress, Redis calls fail and
//! requests fall back to the cluster's own load balancing).

use super::error::ConfigError;
use super::raw::RawLbConfig;
use super::read::Reader;
use super::values::{RedisTarget, Secret};

const GO_ERROR: &str = "Higress: invalid redis service config";

/// The Redis target of a policy that uses Redis. `timeout` is the policy's timeout key.
pub fn target(
    raw: &RawLbConfig,
    r: &mut Reader<'_>,
    timeout_key: &str,
    timeout: i64,
) -> Result<RedisTarget, ConfigError> {
    let fqdn = r.string("serviceFQDN", &raw.service_fqdn);
    let port = r.int("servicePort", &raw.service_port);
    let fqdn = match fqdn {
        None => {
            return Err(r.err_higress(
                "serviceFQDN",
                format!("missing: the Redis service, e.g. redis.static ({GO_ERROR})"),
            ))
        }
        Some(f) if f.is_empty() => {
            return Err(r.err_higress("serviceFQDN", format!("empty ({GO_ERROR})")))
        }
        Some(f) => f,
    };
    let port = match port {
        None => {
            return Err(r.err_higress(
                "servicePort",
                format!("missing: the Redis port, e.g. 6379 ({GO_ERROR})"),
            ))
        }
        Some(0) => {
            let literal = matches!(raw.service_port.as_ref(), Some(g) if g.0 == 0);
            let what = if literal { "0" } else { "reads as 0, which" };
            return Err(r.err_higress("servicePort", format!("{what} is not a port ({GO_ERROR})")));
        }
        Some(p) => p,
    };
    let cluster = format!("outbound|{port}||{fqdn}");
    if !(1..=65535).contains(&port) {
        r.warn(
            "servicePort",
            format!("{port} is not a port (1-65535); Higress accepts it, but the Redis cluster `{cluster}` cannot exist, so Redis calls fail and requests fall back"),
        );
    }
    if fqdn.contains(['|', '?', ' ', '/']) {
        r.warn(
            "serviceFQDN",
            format!("`{fqdn}` is not a host name; Higress accepts it, but the Redis cluster `{cluster}` cannot exist, so Redis calls fail and requests fall back"),
        );
    }
    let username = r.string("username", &raw.username).unwrap_or_default();
    let password = r.secret("password", &raw.password).unwrap_or_default();
    let database = r.int("database", &raw.database).unwrap_or(0);
    if database < 0 {
        r.warn(
            "database",
            format!("{database} is not a database index; Higress passes it on (`?db={database}`), the Redis init then fails and requests fall back"),
        );
    }
    // Go hands the timeout to the host as a uint32: a negative or huge value wraps.
    let timeout_ms = timeout as u32;
    if i64::from(timeout_ms) != timeout {
        r.warn(
            timeout_key,
            format!("{timeout} ms does not fit the host's unsigned 32-bit timeout; Higress passes it on as {timeout_ms} ms, and so does this plugin"),
        );
    }
    Ok(RedisTarget {
        init_cluster: init_cluster(&cluster, database),
        cluster,
        username,
        password: Secret(password),
        timeout_ms,
        database: u32::try_from(database).unwrap_or(0),
    })
}

/// `?db=N` only when N ≠ 0 (as both Higress wrappers do), and immediate writes: by default the
/// host holds small Redis requests up to 3 ms to batch them, which would be most of the
/// routing latency. Hosts that do not know the flush parameters ignore them (docs/higress-abi.md §4).
fn init_cluster(cluster: &str, database: i64) -> String {
    let mut s = format!("{cluster}?");
    if database != 0 {
        s.push_str(&format!("db={database}&"));
    }
    s.push_str("buffer_flush_timeout=0&max_buffer_size_before_flush=0");
    s
}
