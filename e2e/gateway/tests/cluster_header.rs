//! Routing by Envoy's `RouteAction.cluster_header`: the route reads the header when the plugin
//! releases the request headers; an unknown or missing cluster is Envoy's 503 with an empty
//! body; `cluster_name` and the upstream host list follow the header as it is now.

mod support;
use std::net::SocketAddr;
use std::time::Duration;
use support::*;

const HEADER: &str = "x-higress-target-cluster";

/// Clusters `a`, `b`, `c` (one echo upstream each) behind one `cluster_header` route.
fn three_clusters(eps: &[SocketAddr; 3]) -> String {
    let mut y = String::from("workers: 2\nlog_level: warn\nclusters:\n");
    for (name, e) in ["a", "b", "c"].iter().zip(eps) {
        y.push_str(&format!(
            "  - name: {name}\n    timeout_ms: 2000\n    endpoints:\n      - {{ address: \"{e}\" }}\n"
        ));
    }
    y.push_str(
        "routes:\n  - { name: llm-route, match: { prefix: / }, cluster_header: X-Higress-Target-Cluster }\n",
    );
    y
}

fn eps() -> [SocketAddr; 3] {
    [echo_upstream(), echo_upstream(), echo_upstream()]
}

/// Without a plugin the route follows the client's header, each request on its own.
#[test]
fn plain_route_sends_each_request_to_the_named_cluster() {
    let e = eps();
    let gw = gateway(&three_clusters(&e));
    for (name, ep) in [("c", e[2]), ("a", e[0]), ("b", e[1]), ("c", e[2])] {
        let r = get(gw.listen, "/v1", &[(HEADER, name)]);
        assert_eq!(r.status, 200, "{name}: {}", r.body);
        assert_eq!(r.upstream(), ep.to_string(), "{name}");
    }
}

/// The header is read when the headers are released, not when they arrived: the plugin holds
/// them, writes the header at the end of the body, and that value routes the request.
#[test]
fn header_written_while_held_decides_the_cluster() {
    let e = eps();
    let (_, p100) = test_plugins();
    let gw = gateway(&format!(
        "{}{}",
        three_clusters(&e),
        plugin_yaml(p100, "{}")
    ));
    for (client, target, ep) in [("a", "b", e[1]), ("c", "a", e[0]), ("b", "c", e[2])] {
        let r = http(
            gw.listen,
            "POST",
            "/v1",
            &[
                ("x-tp-mode", "pause"),
                ("x-tp-target", target),
                (HEADER, client),
            ],
            b"hello",
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.upstream(), ep.to_string(), "target {target}");
        assert_eq!(r.echoed(HEADER).as_deref(), Some(target));
        // At request-headers time the route had resolved the client's value.
        assert_eq!(r.echoed("x-tp-cluster").as_deref(), Some(client));
        assert_eq!(r.echoed("x-tp-body-len").as_deref(), Some("5"));
    }
    // Written in the headers callback (no hold) works the same.
    let r = get(gw.listen, "/v1", &[("x-tp-target", "b")]);
    assert_eq!((r.status, r.upstream()), (200, e[1].to_string()));
}

/// An unknown cluster name, or no header at all, is Envoy's 503 with an empty body, at once.
#[test]
fn unknown_or_missing_cluster_is_503_never_a_hang() {
    let e = eps();
    let (_, p100) = test_plugins();
    let gw = gateway(&format!(
        "{}{}",
        three_clusters(&e),
        plugin_yaml(p100, "{}")
    ));
    let cases: [&[(&str, &str)]; 5] = [
        &[("x-tp-target", "outbound|80||nope.dns")],
        &[],
        &[("x-tp-target", "")],
        &[(HEADER, "a"), ("x-tp-mode", "pause"), ("x-tp-target", "A")],
        &[(HEADER, "zzz"), ("x-tp-mode", "pause")],
    ];
    for h in cases {
        let r = http(gw.listen, "POST", "/v1", h, b"x", Duration::from_secs(3))
            .unwrap_or_else(|| panic!("{h:?}: no answer"));
        assert_eq!(r.status, 503, "{h:?}: {}", r.body);
        assert_eq!(r.body, "", "{h:?}");
    }
    assert_eq!(stat(&gw, "gateway.cluster_not_found"), 5);
    assert_eq!(wait_stat(&gw, "tp.on_done", 5), 5, "every stream ends");
    // No upstream saw any of them.
    let r = get(gw.listen, "/v1", &[(HEADER, "a")]);
    assert_eq!((r.status, r.upstream()), (200, e[0].to_string()));
}

/// `proxy_get_upstream_hosts` and `cluster_name` report the cluster the header names now
/// (Higress re-resolves the route after a header change): none before, `b`'s hosts after.
#[test]
fn upstream_hosts_follow_the_header() {
    let e = eps();
    let (_, p100) = test_plugins();
    let gw = gateway(&format!(
        "{}{}",
        three_clusters(&e),
        plugin_yaml(p100, "{}")
    ));
    let r = get(gw.listen, "/v1", &[("x-tp-mode", "hosts")]);
    assert!(
        r.body.starts_with("status=0 ptr_null=true hex= cluster="),
        "no header: no hosts, cluster \"\": {}",
        r.body
    );
    assert!(r.body.ends_with("cluster="), "{}", r.body);
    let r = get(
        gw.listen,
        "/v1",
        &[("x-tp-mode", "hosts"), ("x-tp-target", "b"), (HEADER, "a")],
    );
    let hex = r
        .body
        .split("hex=")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    let raw: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let pairs = ailb_gateway::abi::decode_pairs(&raw).unwrap();
    assert_eq!(pairs.len(), 1);
    assert_eq!(pairs[0].0, e[1].to_string().into_bytes());
    assert!(r.body.ends_with("cluster=b"), "{}", r.body);
}

#[test]
fn route_needs_exactly_one_of_cluster_and_cluster_header() {
    let load = |route: &str| {
        let y = format!(
            "clusters:\n  - name: a\n    endpoints: [ {{ address: \"127.0.0.1:9\" }} ]\nroutes:\n  - {{ name: r, {route} }}\n"
        );
        ailb_gateway::config::Config::from_yaml(&y, &[], ".".into())
    };
    let ok = load("cluster_header: X-Pick").unwrap();
    assert_eq!(ok.routes[0].cluster_header.as_deref(), Some("x-pick"));
    assert!(load("cluster: a").is_ok());
    for bad in [
        "cluster: a, cluster_header: x-pick",
        "match: { prefix: / }",
        "cluster_header: \"\"",
        "cluster_header: \":authority\"",
        "cluster: b",
    ] {
        let err = load(bad).err().unwrap_or_else(|| panic!("{bad}: accepted"));
        assert!(format!("{err:#}").contains("route r"), "{bad}: {err:#}");
    }
}
