//! Data-parallel ranks (issue 49; docs/disaggregated-serving.md §5, docs/configuration.md):
//! `dataParallelSize` says every pod of the route runs that many DP ranks behind its one port,
//! each (pod, rank) then an endpoint of its own (`ranks.rs`); `dataParallelRank` says how the
//! chosen rank reaches the engine. Ours, strict; global_least_request and prefix_cache, both
//! builds.

use super::error::ConfigError;
use super::raw::RawLbConfig;
use super::read::Reader;
use std::rc::Rc;

pub const DP_KEYS: &[&str] = &["dataParallelSize", "dataParallelRank"];
/// The most ranks a pod is split into (vLLM's and SGLang's DP sizes are a node's GPUs, or a
/// few nodes' for wide expert parallelism).
const MAX_SIZE: u64 = 64;

/// How the chosen rank is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankIn {
    /// `X-data-parallel-rank`: vLLM's chat and completions routes, SGLang's OpenAI routes.
    Header,
    /// `routed_dp_rank` in the JSON body: SGLang routes that ignore the header (`/generate`).
    Body,
}

/// A route's data parallelism; `size` 1: off (endpoints are pods).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataParallel {
    pub size: u16,
    pub rank_in: RankIn,
}

/// The header vLLM (`X-data-parallel-rank`) and SGLang (`X-Data-Parallel-Rank`) read, any case.
pub const RANK_HEADER: &str = "x-data-parallel-rank";

impl DataParallel {
    pub const OFF: DataParallel = DataParallel {
        size: 1,
        rank_in: RankIn::Header,
    };

    pub fn on(&self) -> bool {
        self.size > 1
    }

    /// Plain-Envoy build: the endpoints to choose among (each pod's ranks) and the pods.
    pub(super) fn targets(&self, pods: Vec<String>) -> (Rc<Vec<String>>, Rc<Vec<String>>) {
        if !self.on() {
            let pods = Rc::new(pods);
            return (pods.clone(), pods);
        }
        (
            Rc::new(crate::ranks::expand(pods.clone(), self.size)),
            Rc::new(pods),
        )
    }

    pub(super) fn read(raw: &RawLbConfig, r: &mut Reader<'_>) -> Result<DataParallel, ConfigError> {
        let size = r.own("dataParallelSize", &raw.data_parallel_size)?;
        let rank_in = r.own("dataParallelRank", &raw.data_parallel_rank)?;
        let size = match size {
            None => 1,
            Some(n) if (1..=MAX_SIZE).contains(&n) => n as u16,
            Some(n) => {
                return Err(r.err("dataParallelSize", format!("{n} is outside 1-{MAX_SIZE}")))
            }
        };
        let rank_in = match rank_in.as_deref() {
            None | Some("header") => RankIn::Header,
            Some("body") => RankIn::Body,
            Some(other) => {
                return Err(r.err(
                    "dataParallelRank",
                    format!("unknown value `{other}` (header, body)"),
                ))
            }
        };
        if size == 1 && rank_in == RankIn::Body {
            return Err(r.err(
                "dataParallelRank",
                "needs `dataParallelSize` above 1 (there is no rank to send)",
            ));
        }
        Ok(DataParallel { size, rank_in })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse, Build, PluginConfig, RouteConfig};
    use serde_json::{json, Value};

    fn route(
        build: Build,
        policy: &str,
        extra: Value,
    ) -> Result<(RouteConfig, Vec<String>), String> {
        let mut lb = json!({"serviceFQDN": "redis.static", "servicePort": 6379});
        if build == Build::Envoy {
            lb = json!({"endpoints": ["10.0.0.2:80", "10.0.0.1:80"]});
        }
        if let (Some(a), Value::Object(b)) = (lb.as_object_mut(), extra) {
            a.extend(b);
        }
        let cfg = json!({"lb_policy": policy, "lb_config": lb}).to_string();
        let parsed = parse(cfg.as_bytes(), build).map_err(|e| e.to_string())?;
        let warnings = parsed.warnings.iter().map(|w| w.to_string()).collect();
        let config: PluginConfig = parsed.config;
        let global = config.all().next().ok_or("no route")?;
        Ok((global.as_ref().clone(), warnings))
    }

    #[test]
    fn off_by_default_and_read_for_the_least_request_policies_in_both_builds() {
        for build in [Build::Higress, Build::Envoy] {
            for policy in ["global_least_request", "prefix_cache"] {
                let (c, _) = route(build, policy, json!({})).unwrap();
                assert_eq!(c.common.dp, DataParallel::OFF);
                let (c, w) = route(
                    build,
                    policy,
                    json!({"dataParallelSize": 4, "dataParallelRank": "body"}),
                )
                .unwrap();
                assert!(w.is_empty(), "{w:?}");
                assert_eq!(
                    c.common.dp,
                    DataParallel {
                        size: 4,
                        rank_in: RankIn::Body
                    }
                );
            }
        }
    }

    #[test]
    fn the_plain_envoy_build_chooses_among_each_pods_ranks_and_scrapes_the_pods() {
        let (c, _) = route(Build::Envoy, "prefix_cache", json!({"dataParallelSize": 2})).unwrap();
        assert_eq!(
            *c.endpoints,
            [
                "10.0.0.1:80@0",
                "10.0.0.1:80@1",
                "10.0.0.2:80@0",
                "10.0.0.2:80@1"
            ]
        );
        assert_eq!(*c.pods, ["10.0.0.1:80", "10.0.0.2:80"]);
        let (c, _) = route(Build::Envoy, "prefix_cache", json!({})).unwrap();
        assert_eq!(c.endpoints, c.pods);
    }

    #[test]
    fn bad_values_are_refused_naming_their_key_and_other_policies_ignore_the_keys() {
        let bad = |extra: Value| route(Build::Higress, "prefix_cache", extra).expect_err("refused");
        for v in [json!(0), json!(65), json!(-1), json!("4"), json!(2.5)] {
            let e = bad(json!({ "dataParallelSize": v }));
            assert!(e.contains("dataParallelSize"), "{e}");
        }
        let e = bad(json!({"dataParallelSize": 2, "dataParallelRank": "query"}));
        assert!(
            e.contains("dataParallelRank") && e.contains("header, body"),
            "{e}"
        );
        let e = bad(json!({"dataParallelRank": "body"}));
        assert!(e.contains("needs `dataParallelSize`"), "{e}");
        let (c, w) = route(
            Build::Higress,
            "prefix_cache",
            json!({"dataParallelSize": 64}),
        )
        .unwrap();
        assert_eq!((c.common.dp.size, w.len()), (64, 0));

        // endpoint_metrics reads per-pod metrics pages: the keys are not its own.
        let (c, w) = route(
            Build::Higress,
            "endpoint_metrics",
            json!({"dataParallelSize": 4}),
        )
        .unwrap();
        assert_eq!(c.common.dp, DataParallel::OFF);
        assert!(w.iter().any(|w| w.contains("dataParallelSize")), "{w:?}");
    }
}
