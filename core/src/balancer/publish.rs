//! Where a request goes and how the choice reaches the router: a policy's [`Placement`], applied
//! by the machine at publish. The destination goes through Higress's override call or, in plain
//! Envoy, the `ip:port[,ip:port]` request header read by the `override_host` load-balancing
//! policy (docs/higress-abi.md §10). Client-sent copies of that header are removed first, so a
//! client can never steer routing. Cluster policies write the chosen cluster's name into their
//! `cluster_header` in both builds (the route's `cluster_header` action reads it); client-sent
//! copies of that header are removed the same way.

use crate::config::{PluginConfig, Publish, RankIn, RouteConfig, RANK_HEADER};
use crate::host::Host;
use crate::host::HostResult;
use crate::ranks;
use std::borrow::Cow;

/// Every destination header a route config uses (plain Envoy's override_host header, any
/// build's `cluster_header`), each once: computed with the config, not per request.
pub fn destination_headers(config: &PluginConfig) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for c in config.all() {
        if let Publish::Header { name, .. } | Publish::ClusterHeader { name } = &c.publish {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
    }
    names
}

/// Drop client-sent copies of every destination header (`destination_headers`), whichever
/// route this request takes.
pub fn strip_destination_headers(host: &mut dyn Host, names: &[String]) {
    for name in names {
        let _ = host.remove_request_header(name);
    }
}

/// What an endpoint does for its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The whole request: prefill and decode.
    Serve,
    /// Computes the prompt's KV cache, handed to a decode endpoint.
    Prefill,
    /// Generates from a KV cache a prefill endpoint computed.
    Decode,
}

/// One endpoint of a placement (a pod's `ip:port`, or a cluster's name), in its role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub endpoint: String,
    pub role: Role,
}

/// Where a policy places a request (`Decision::Route`): the endpoint the router sends it to,
/// the others it involves, where the host may try next, and the request edits that go with
/// the choice. The machine applies it at publish, whatever the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Where the router sends the request.
    pub to: Placed,
    /// Other endpoints of the request, each in its role (a prefill pod beside a decode pod):
    /// the policy tells the destination of them through `headers` or `body`.
    pub with: Vec<Placed>,
    /// Where the host may try next, in order (plain Envoy's override_host list).
    pub fallbacks: Vec<String>,
    /// Request headers set with the choice.
    pub headers: Vec<(String, String)>,
    /// The request body, rewritten (None: as the client sent it). Its content-length follows.
    pub body: Option<Vec<u8>>,
}

impl Placement {
    /// The whole request on `endpoint`, nothing else.
    pub fn on(endpoint: String) -> Placement {
        Placement {
            to: Placed {
                endpoint,
                role: Role::Serve,
            },
            with: Vec::new(),
            fallbacks: Vec::new(),
            headers: Vec::new(),
            body: None,
        }
    }

    pub fn with_fallbacks(mut self, fallbacks: Vec<String>) -> Placement {
        self.fallbacks = fallbacks;
        self
    }

    /// Every endpoint it names, the destination first.
    pub fn endpoints(&self) -> Vec<Placed> {
        std::iter::once(&self.to)
            .chain(&self.with)
            .cloned()
            .collect()
    }
}

/// Applies `place`: its edits, then the router pointed at its destination (then its
/// fallbacks, where the header format allows them). An edit that fails fails the publish: the
/// request then goes as the client sent it, balanced by the cluster.
///
/// A data-parallel rank endpoint (`ip:port@rank`, ranks.rs) goes to its pod, with the rank
/// where the engine reads it (`body_bytes`: the request body's length, for the body field).
pub fn publish(
    host: &mut dyn Host,
    config: &RouteConfig,
    place: &Placement,
    body_bytes: usize,
) -> HostResult<()> {
    for (name, value) in &place.headers {
        host.set_request_header(name, value)?;
    }
    let (endpoint, rank) = match ranks::split(&place.to.endpoint) {
        (pod, Some(r)) if config.common.dp.on() => (pod, Some(r)),
        _ => (place.to.endpoint.as_str(), None),
    };
    let mut body = place.body.as_deref().map(Cow::Borrowed);
    if let Some(r) = rank {
        // The header always (every engine's OpenAI routes read it); the body field too where
        // asked (SGLang routes that ignore the header). Both say the same rank.
        host.set_request_header(RANK_HEADER, &r.to_string())?;
        if config.common.dp.rank_in == RankIn::Body {
            let edited = match &body {
                Some(b) => ranks::with_rank_field(b, r),
                None => ranks::with_rank_field(&host.request_body(0, body_bytes)?, r),
            };
            if let Some(b) = edited {
                body = Some(Cow::Owned(b));
            }
        }
    }
    if let Some(body) = &body {
        host.set_request_body(body)?;
        // Only a body that had a length gets the new one (a chunked request has none).
        if host.request_header("content-length")?.is_some() {
            host.set_request_header("content-length", &body.len().to_string())?;
        }
    }
    match &config.publish {
        Publish::OverrideHost => host.set_upstream_override_host(endpoint),
        Publish::Header { name, fallbacks: n } => {
            host.set_request_header(name, &destination_list(endpoint, &place.fallbacks, *n))
        }
        Publish::ClusterHeader { name } => host.set_request_header(name, endpoint),
    }
}

/// `chosen` then up to `n` fallbacks, comma-separated (the override_host header format), each
/// a pod once (a rank endpoint as its pod: the rank header goes along to a retry).
pub fn destination_list(chosen: &str, fallbacks: &[String], n: usize) -> String {
    let mut v = chosen.to_string();
    let mut listed = vec![chosen];
    for f in fallbacks.iter().map(|f| ranks::pod(f)) {
        if listed.len() > n {
            break;
        }
        if !listed.contains(&f) {
            listed.push(f);
            v.push(',');
            v.push_str(f);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PluginConfig;
    use crate::host::mock::MockHost;
    use crate::host::HostErrorKind;

    fn route() -> RouteConfig {
        let cfg = r#"{"lb_policy": "global_least_request", "lb_config":
            {"serviceFQDN": "redis.static", "servicePort": 6379}}"#;
        let parsed = PluginConfig::parse(cfg.as_bytes()).expect("a valid config");
        let first = parsed.all().next().expect("one route");
        first.as_ref().clone()
    }

    fn pair() -> Placement {
        Placement {
            with: vec![Placed {
                endpoint: "10.0.0.9:80".into(),
                role: Role::Prefill,
            }],
            headers: vec![("x-prefiller-host-port".into(), "10.0.0.9:80".into())],
            body: Some(b"{\"max_tokens\":1}".to_vec()),
            ..Placement::on("10.0.0.1:80".into())
        }
    }

    #[test]
    fn a_placement_applies_its_edits_then_its_destination() {
        let mut host = MockHost::new();
        host.request_headers = vec![("content-length".into(), "99".into())];
        let mut place = pair();
        place.to.role = Role::Decode;
        publish(&mut host, &route(), &place, 0).expect("published");
        assert_eq!(host.override_host.as_deref(), Some("10.0.0.1:80"));
        assert_eq!(host.body, b"{\"max_tokens\":1}");
        let header = |h: &MockHost, n: &str| h.request_header(n).expect("readable");
        assert_eq!(header(&host, "content-length").as_deref(), Some("16"));
        assert_eq!(
            header(&host, "x-prefiller-host-port").as_deref(),
            Some("10.0.0.9:80")
        );
        let roles: Vec<Role> = place.endpoints().iter().map(|p| p.role).collect();
        assert_eq!(roles, [Role::Decode, Role::Prefill]);
    }

    #[test]
    fn a_chunked_body_gets_no_length_and_a_failed_edit_fails_the_publish() {
        let mut host = MockHost::new();
        let mut place = pair();
        place.headers.clear();
        publish(&mut host, &route(), &place, 0).expect("published");
        assert_eq!(
            host.request_header("content-length").expect("readable"),
            None
        );

        let mut host = MockHost::new();
        host.set_header_status = Some(HostErrorKind::BadArgument);
        assert!(publish(&mut host, &route(), &pair(), 0).is_err());
        assert_eq!(host.override_host, None, "no destination without its edits");
    }

    fn ranked(extra: &str) -> RouteConfig {
        let cfg = format!(
            r#"{{"lb_policy": "prefix_cache", "lb_config":
            {{"serviceFQDN": "redis.static", "servicePort": 6379, "dataParallelSize": 4{extra}}}}}"#
        );
        let parsed = PluginConfig::parse(cfg.as_bytes()).expect("a valid config");
        let first = parsed.all().next().expect("one route");
        first.as_ref().clone()
    }

    #[test]
    fn a_rank_endpoint_goes_to_its_pod_with_the_rank_header() {
        let mut host = MockHost::new();
        host.request_headers = vec![("x-data-parallel-rank".into(), "0".into())];
        let place = Placement::on("10.0.0.1:80@3".into());
        publish(&mut host, &ranked(""), &place, 0).expect("published");
        assert_eq!(host.override_host.as_deref(), Some("10.0.0.1:80"));
        let rank = host
            .request_header("x-data-parallel-rank")
            .expect("readable");
        assert_eq!(rank.as_deref(), Some("3"), "the client's copy replaced");
        assert_eq!(host.body_writes, 0, "the body untouched");

        // Without dataParallelSize a name is an address, whatever it looks like.
        let mut host = MockHost::new();
        publish(&mut host, &route(), &place, 0).expect("published");
        assert_eq!(host.override_host.as_deref(), Some("10.0.0.1:80@3"));
        assert_eq!(
            host.request_header("x-data-parallel-rank")
                .expect("readable"),
            None
        );
    }

    #[test]
    fn the_body_mode_writes_routed_dp_rank_beside_the_header() {
        let mut host = MockHost::new();
        host.request_headers = vec![
            ("x-data-parallel-rank".into(), "0".into()),
            ("content-length".into(), "40".into()),
        ];
        host.body = br#"{"text":"hi","routed_dp_rank":0}"#.to_vec();
        let n = host.body.len();
        let config = ranked(r#", "dataParallelRank": "body""#);
        publish(
            &mut host,
            &config,
            &Placement::on("10.0.0.1:80@2".into()),
            n,
        )
        .expect("ok");
        let v: serde_json::Value = serde_json::from_slice(&host.body).expect("json");
        assert_eq!(v["routed_dp_rank"], 2);
        assert_eq!(v["text"], "hi");
        let header = |h: &MockHost, n: &str| h.request_header(n).expect("readable");
        assert_eq!(header(&host, "x-data-parallel-rank").as_deref(), Some("2"));
        assert_eq!(
            header(&host, "content-length"),
            Some(host.body.len().to_string())
        );

        // A body that is not a JSON object keeps its bytes; the rank goes by header.
        let mut host = MockHost::new();
        host.body = b"not json".to_vec();
        publish(
            &mut host,
            &config,
            &Placement::on("10.0.0.1:80@1".into()),
            8,
        )
        .expect("ok");
        assert_eq!(host.body_writes, 0);
        assert_eq!(header(&host, "x-data-parallel-rank").as_deref(), Some("1"));
    }

    #[test]
    fn fallbacks_name_each_pod_once_whatever_its_ranks() {
        let fallbacks: Vec<String> = ["a:1@1", "a:1@2", "b:1@0", "b:1@3", "c:1@0"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(destination_list("a:1", &fallbacks, 2), "a:1,b:1,c:1");
        assert_eq!(destination_list("a:1", &fallbacks, 1), "a:1,b:1");
        assert_eq!(destination_list("a:1", &fallbacks, 0), "a:1");
        let plain: Vec<String> = vec!["b:1".into(), "a:1".into(), "c:1".into()];
        assert_eq!(destination_list("a:1", &plain, 2), "a:1,b:1,c:1");
    }
}
