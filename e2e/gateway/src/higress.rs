//! Higress ABI extensions (docs/higress-abi.md §3): Redis, upstream host list, override
//! host, inject-encoded-data. All i32.

use crate::abi::{self, status};
use crate::host_state::{HostState, C};
use crate::mem::{read_mem, return_bytes, write_u32};
use crate::stream_data::{RedisInit, RedisOut};
use anyhow::Result;
use wasmtime::Linker;

/// Split `name?k=v&...` into the cluster name and its query parameters.
pub fn split_cluster(s: &str) -> (&str, Vec<(&str, &str)>) {
    match s.split_once('?') {
        Some((name, q)) => {
            let params = q
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|p| p.split_once('=').unwrap_or((p, "")))
                .collect();
            (name, params)
        }
        None => (s, Vec::new()),
    }
}

fn known_redis(h: &HostState, name: &str) -> bool {
    h.shared.cfg.redis_clusters.iter().any(|r| r.name == name)
}

pub fn add_to_linker(l: &mut Linker<HostState>) -> Result<()> {
    l.func_wrap(
        "env",
        "proxy_redis_init",
        |mut c: C, cp: i32, cn: i32, up: i32, un: i32, pp: i32, pn: i32, timeout: i32| -> i32 {
            let _p = crate::instrument::span("proxy_redis_init");
            let cluster = String::from_utf8_lossy(&tryst!(read_mem(&mut c, cp, cn))).into_owned();
            let user = String::from_utf8_lossy(&tryst!(read_mem(&mut c, up, un))).into_owned();
            let pass = String::from_utf8_lossy(&tryst!(read_mem(&mut c, pp, pn))).into_owned();
            let (name, params) = split_cluster(&cluster);
            let h = c.data_mut();
            if !known_redis(h, name) {
                return status::BAD_ARGUMENT;
            }
            let mut init = RedisInit {
                username: user,
                password: pass,
                timeout_ms: timeout as u32 as u64,
                ..RedisInit::default()
            };
            for (k, v) in params {
                match k {
                    "db" => init.db = v.parse().ok(),
                    "buffer_flush_timeout" => {
                        init.flush_timeout_ms = v.parse().unwrap_or(init.flush_timeout_ms)
                    }
                    "max_buffer_size_before_flush" => {
                        init.flush_size = v.parse().unwrap_or(init.flush_size)
                    }
                    _ => {}
                }
            }
            h.redis_init.insert(name.to_string(), init);
            status::OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_redis_call",
        |mut c: C, cp: i32, cn: i32, qp: i32, qn: i32, tokp: i32| -> i32 {
            let _p = crate::instrument::span("proxy_redis_call");
            let cluster = String::from_utf8_lossy(&tryst!(read_mem(&mut c, cp, cn))).into_owned();
            let query = tryst!(read_mem(&mut c, qp, qn));
            // cpp-host writes 0 first to validate the out-pointer.
            tryst!(write_u32(&mut c, tokp, 0));
            let (name, _) = split_cluster(&cluster);
            let h = c.data_mut();
            let Some(rc) = h.shared.cfg.redis_clusters.iter().find(|r| r.name == name) else {
                return status::BAD_ARGUMENT;
            };
            if rc.no_host {
                return status::INTERNAL_FAILURE;
            }
            let token = h.next_redis_token;
            h.next_redis_token = h.next_redis_token.wrapping_add(4);
            h.redis_out.push(RedisOut {
                cluster: name.to_string(),
                token,
                query,
            });
            h.shared
                .counters
                .redis_calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tryst!(write_u32(&mut c, tokp, token));
            status::OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_upstream_hosts",
        |mut c: C, pp: i32, sp: i32| -> i32 {
            let _p = crate::instrument::span("proxy_get_upstream_hosts");
            let h = c.data_mut();
            let cluster = h.stream().and_then(|s| s.current_cluster());
            let pairs: Vec<(String, String)> = cluster
                .and_then(|name| h.shared.clusters.get(&name).cloned())
                .map(|cl| {
                    cl.endpoints
                        .iter()
                        .map(|e| {
                            let v = serde_json::json!({
                                "health_status": e.health().as_str(),
                                "metrics": e.metrics_text(),
                            });
                            (e.address.clone(), v.to_string())
                        })
                        .collect()
                })
                .unwrap_or_default();
            if pairs.is_empty() {
                tryst!(write_u32(&mut c, pp, 0));
                tryst!(write_u32(&mut c, sp, 0));
                return status::OK;
            }
            let enc = abi::encode_pairs(&pairs);
            return_bytes(&mut c, &enc, pp, sp)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_upstream_override_host",
        |mut c: C, p: i32, n: i32| -> i32 {
            let _p = crate::instrument::span("proxy_set_upstream_override_host");
            let addr = String::from_utf8_lossy(&tryst!(read_mem(&mut c, p, n))).into_owned();
            // Always 0: cpp-host ignores the implementation's result. After release it has no effect.
            if let Some(s) = c.data_mut().stream() {
                if !s.headers_released {
                    s.override_host = Some(addr);
                }
            }
            status::OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_inject_encoded_data_to_filter_chain",
        |mut c: C, p: i32, n: i32, _eos: i32| -> i32 {
            let _p = crate::instrument::span("proxy_inject_encoded_data_to_filter_chain");
            let data = tryst!(read_mem(&mut c, p, n));
            if let Some(s) = c.data_mut().stream() {
                s.resp_body.extend_from_slice(&data);
            }
            status::OK
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn split_cluster_params() {
        let (n, p) = super::split_cluster("outbound|6379||r.static?db=2&buffer_flush_timeout=0");
        assert_eq!(n, "outbound|6379||r.static");
        assert_eq!(p, vec![("db", "2"), ("buffer_flush_timeout", "0")]);
        assert_eq!(super::split_cluster("x").0, "x");
    }
}
