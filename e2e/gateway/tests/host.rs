//! Host-rule tests: each drives the test plugin (testdata/testplugin) or a WAT module
//! through a real gateway with real upstreams and a real redis-server.

mod support;
use ailb_gateway::abi::AbiVersion;
use std::time::Duration;
use support::*;

fn cluster_yaml(eps: &[std::net::SocketAddr]) -> String {
    let mut y = String::from("clusters:\n  - name: \"outbound|8000||llm.static\"\n    lb_policy: round_robin\n    timeout_ms: 2000\n    endpoints:\n");
    for e in eps {
        y.push_str(&format!("      - {{ address: \"{e}\" }}\n"));
    }
    y.push_str("routes:\n  - { name: llm-route, match: { prefix: / }, cluster: \"outbound|8000||llm.static\" }\n");
    y
}

fn base(
    workers: usize,
    eps: &[std::net::SocketAddr],
    redis: &str,
    wasm: &std::path::Path,
    pcfg: &str,
) -> String {
    format!(
        "workers: {workers}\nlog_level: warn\nbuffer_limit_bytes: 1000\n{redis}{}{}",
        cluster_yaml(eps),
        plugin_yaml(wasm, pcfg)
    )
}

#[test]
fn abi_is_first_export_in_section_order() {
    let wat = |a: &str, b: &str| {
        format!("(module (memory (export \"memory\") 1) (func (export \"{a}\")) (func (export \"{b}\")))")
    };
    let load = |w: String| ailb_gateway::vm::Plugin::load(w.as_bytes()).unwrap().abi;
    assert_eq!(
        load(wat("proxy_abi_version_0_2_100", "proxy_abi_version_0_2_1")),
        AbiVersion::V0_2_100
    );
    assert_eq!(
        load(wat("proxy_abi_version_0_2_1", "proxy_abi_version_0_2_100")),
        AbiVersion::V0_2_1
    );
    assert!(ailb_gateway::vm::Plugin::load(b"(module)").is_err());
}

#[test]
fn missing_env_import_fails_loudly_with_its_name() {
    let wat = r#"(module (import "env" "proxy_no_such_call" (func)) (memory (export "memory") 1)
                 (func (export "proxy_abi_version_0_2_100")))"#;
    let file = TempFile::new("missing-import.wat");
    let dir = &file.0;
    std::fs::write(dir, wat).unwrap();
    let y = format!(
        "{}{}",
        cluster_yaml(&[echo_upstream()]),
        plugin_yaml(dir, "{}")
    );
    let cfg = ailb_gateway::config::Config::from_yaml(&y, &[], ".".into()).unwrap();
    let err = ailb_gateway::gateway::start(cfg).err().expect("must fail");
    assert!(format!("{err:#}").contains("proxy_no_such_call"), "{err:#}");
}

#[test]
fn abi_0_2_1_pause_starves_body_and_abort_still_runs_on_done() {
    let (p021, _) = test_plugins();
    let gw = gateway(&base(1, &[echo_upstream()], "", p021, "{}"));
    let r = http(
        gw.listen,
        "POST",
        "/v1",
        &[("x-tp-mode", "pause")],
        b"hello",
        Duration::from_millis(600),
    );
    assert!(
        r.is_none(),
        "0_2_1 StopAll must hold the stream: no body reaches the plugin"
    );
    assert_eq!(stat(&gw, "tp.body_calls"), 0);
    assert_eq!(
        wait_stat(&gw, "tp.on_done", 1),
        1,
        "client abort must deliver on_done"
    );
    assert_eq!(stat(&gw, "tp.on_log"), 1);
    assert_eq!(stat(&gw, "tp.on_delete"), 1);
}

#[test]
fn abi_0_2_100_pause_delivers_body_and_override_applies_at_release() {
    let (_, p100) = test_plugins();
    let (a, b) = (echo_upstream(), echo_upstream());
    let gw = gateway(&base(1, &[a, b], "", p100, "{}"));
    for _ in 0..4 {
        let bs = b.to_string();
        let r = http(
            gw.listen,
            "POST",
            "/v1",
            &[("x-tp-mode", "pause"), ("x-tp-override", &bs)],
            b"hello",
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.echoed("x-tp-body-len").as_deref(), Some("5"));
        assert_eq!(r.echoed("body-len").as_deref(), Some("5"));
        assert_eq!(r.upstream(), bs, "override set while headers held must win");
        assert_eq!(r.echoed("x-tp-route").as_deref(), Some("llm-route"));
        assert_eq!(
            r.echoed("x-tp-cluster").as_deref(),
            Some("outbound|8000||llm.static")
        );
    }
    assert!(stat(&gw, "tp.body_calls") >= 4);
    assert_eq!(wait_stat(&gw, "tp.on_done", 4), 4);
}

#[test]
fn override_only_for_healthy_members_and_never_after_release() {
    let (_, p100) = test_plugins();
    let (a, b) = (echo_upstream(), echo_upstream());
    let gw = gateway(&base(1, &[a, b], "", p100, "{}"));
    let bs = b.to_string();
    let ups = |mode: &str, ovr: &str| -> Vec<String> {
        (0..4)
            .map(|_| {
                get(
                    gw.listen,
                    "/v1",
                    &[("x-tp-mode", mode), ("x-tp-override", ovr)],
                )
                .upstream()
            })
            .collect()
    };
    assert!(ups("override", &bs).iter().all(|u| *u == bs));
    // Not a member of the cluster: normal round robin.
    let u = ups("override", "127.0.0.1:1");
    assert!(u.contains(&a.to_string()) && u.contains(&bs));
    // Set after the headers went to the router: ignored.
    let u: Vec<String> = (0..4)
        .map(|_| {
            http(
                gw.listen,
                "POST",
                "/v1",
                &[("x-tp-mode", "late_override"), ("x-tp-override", &bs)],
                b"xy",
                Duration::from_secs(5),
            )
            .unwrap()
            .upstream()
        })
        .collect();
    assert!(
        u.contains(&a.to_string()),
        "late override must not apply: {u:?}"
    );
    // Unhealthy member: LB picks the healthy one.
    let q = format!(
        "/admin/health?cluster=outbound%7C8000%7C%7Cllm.static&address={bs}&status=Unhealthy"
    );
    assert_eq!(
        http(gw.admin, "POST", &q, &[], b"", Duration::from_secs(5))
            .unwrap()
            .status,
        200
    );
    assert!(ups("override", &bs).iter().all(|u| *u == a.to_string()));
    let q = format!(
        "/admin/health?cluster=outbound%7C8000%7C%7Cllm.static&address={bs}&status=Degraded"
    );
    http(gw.admin, "POST", &q, &[], b"", Duration::from_secs(5)).unwrap();
    assert!(
        ups("override", &bs).iter().all(|u| *u == bs),
        "Degraded is still overridable"
    );
}

#[test]
fn upstream_hosts_pairs_encoding() {
    let (_, p100) = test_plugins();
    let (a, b) = (echo_upstream(), echo_upstream());
    let mut y = base(1, &[a, b], "", p100, "{}");
    y = y.replace(
        &format!("{{ address: \"{b}\" }}"),
        &format!("{{ address: \"{b}\", health: Unhealthy, metrics: \"m 1\" }}"),
    );
    let gw = gateway(&y);
    let r = get(gw.listen, "/v1", &[("x-tp-mode", "hosts")]);
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
    assert_eq!(&raw[..4], &2u32.to_le_bytes());
    assert_eq!(pairs[0].0, a.to_string().into_bytes());
    let v: serde_json::Value = serde_json::from_slice(&pairs[1].1).unwrap();
    assert_eq!(v["health_status"], "Unhealthy");
    assert_eq!(v["metrics"], "m 1");
    let v0: serde_json::Value = serde_json::from_slice(&pairs[0].1).unwrap();
    assert_eq!(v0["health_status"], "Healthy");
    assert!(r.body.starts_with("status=0 ptr_null=false"));
}

#[test]
fn effective_context_rules() {
    let (_, p100) = test_plugins();
    let gw = gateway(&base(1, &[echo_upstream()], "", p100, "{}"));
    let r = get(gw.listen, "/v1", &[("x-tp-mode", "effective")]);
    assert_eq!(r.body, "bad=2 self=0");
    let r = get(gw.listen, "/v1", &[("x-tp-mode", "local")]);
    assert_eq!((r.status, r.body.as_str()), (418, "teapot"));
    assert_eq!(wait_stat(&gw, "tp.on_done", 2), 2);
}

fn redis_yaml(name: &str, port: u16, no_host: bool) -> String {
    format!("redis_clusters:\n  - {{ name: \"{name}\", address: \"127.0.0.1:{port}\", no_host: {no_host} }}\n")
}

const RC: &str = "outbound|6379||redis.static";

#[test]
fn redis_call_tokens_buffer_and_root_rules() {
    let (_, p100) = test_plugins();
    let rs = RedisServer::start();
    let pcfg = format!(
        "{{\"redis\":\"{RC}\",\"redis_init\":\"{RC}?db=1&max_buffer_size_before_flush=0\"}}"
    );
    let gw = gateway(&base(
        1,
        &[echo_upstream()],
        &redis_yaml(RC, rs.port, false),
        p100,
        &pcfg,
    ));
    let q = "*2\\r\\n$4\\r\\nECHO\\r\\n$2\\r\\nhi\\r\\n";
    for tok in [7, 11, 15] {
        let r = get(
            gw.listen,
            "/v1",
            &[("x-tp-mode", "redis"), ("x-tp-query", q)],
        );
        assert_eq!(r.status, 200);
        let info = r.echoed("x-tp-redis").unwrap();
        let want = format!(
            "root=1 token={tok} status=0 size=8 buf_status=0 len=8 code=0 msg= root_call=2"
        );
        assert_eq!(info, want);
        assert_eq!(r.echoed("x-tp-reply").as_deref(), Some("$2\\r\\nhi\\r\\n"));
        assert_eq!(
            r.header("x-tp-buf9-outside").as_deref(),
            Some("0:0"),
            "buffer 9 only during the callback"
        );
    }
    // SELECT 1 was pipelined first: the key lands in db 1.
    let q = "*3\\r\\n$3\\r\\nSET\\r\\n$1\\r\\nk\\r\\n$1\\r\\nv\\r\\n";
    get(
        gw.listen,
        "/v1",
        &[("x-tp-mode", "redis"), ("x-tp-query", q)],
    );
    let mut c = rs.conn();
    c.cmd(&["SELECT", "1"]);
    let mut got = Vec::new();
    ailb_testkit::encode_value(&c.cmd(&["GET", "k"]), &mut got);
    assert_eq!(String::from_utf8_lossy(&got), "$1\r\nv\r\n");
}

#[test]
fn redis_timeout_and_connection_loss_give_status_1() {
    let (_, p100) = test_plugins();
    for close in [false, true] {
        let port = fake_redis(close);
        let pcfg = format!("{{\"redis\":\"{RC}\",\"timeout\":200}}");
        let gw = gateway(&base(
            1,
            &[echo_upstream()],
            &redis_yaml(RC, port, false),
            p100,
            &pcfg,
        ));
        let t = std::time::Instant::now();
        let r = get(gw.listen, "/v1", &[("x-tp-mode", "redis")]);
        let info = r.echoed("x-tp-redis").unwrap();
        assert!(
            info.contains("status=1 size=0 buf_status=0 len=0 code=11 msg=reset"),
            "{info}"
        );
        if !close {
            assert!(
                t.elapsed() >= Duration::from_millis(190),
                "op timeout must elapse"
            );
        }
        // The next call reconnects and fails again the same way (no stuck state).
        let r = get(gw.listen, "/v1", &[("x-tp-mode", "redis")]);
        assert!(r.echoed("x-tp-redis").unwrap().contains("status=1"));
    }
}

#[test]
fn redis_unknown_cluster_and_no_host() {
    let (_, p100) = test_plugins();
    let pcfg = "{\"redis\":\"outbound|1||nope.static\"}";
    let gw = gateway(&base(
        1,
        &[echo_upstream()],
        &redis_yaml(RC, 1, false),
        p100,
        pcfg,
    ));
    let r = get(gw.listen, "/v1", &[("x-tp-mode", "redis")]);
    assert_eq!(r.echoed("x-tp-call-status").as_deref(), Some("2"));
    let pcfg = format!("{{\"redis\":\"{RC}\"}}");
    let gw = gateway(&base(
        1,
        &[echo_upstream()],
        &redis_yaml(RC, 1, true),
        p100,
        &pcfg,
    ));
    let r = get(gw.listen, "/v1", &[("x-tp-mode", "redis")]);
    assert_eq!(r.echoed("x-tp-call-status").as_deref(), Some("10"));
    assert_eq!(
        stat(&gw, "tp.redis_fail") + stat(&gw, "tp.redis_ok"),
        0,
        "no callback after 10"
    );
}

#[test]
fn abort_while_waiting_for_redis_runs_on_done_then_callback_sees_dead_context() {
    let (_, p100) = test_plugins();
    let port = fake_redis(false);
    let pcfg = format!("{{\"redis\":\"{RC}\",\"timeout\":800}}");
    let gw = gateway(&base(
        1,
        &[echo_upstream()],
        &redis_yaml(RC, port, false),
        p100,
        &pcfg,
    ));
    let r = http(
        gw.listen,
        "GET",
        "/v1",
        &[("x-tp-mode", "redis")],
        b"",
        Duration::from_millis(200),
    );
    assert!(r.is_none());
    assert_eq!(wait_stat(&gw, "tp.on_done", 1), 1);
    assert_eq!(wait_stat(&gw, "tp.redis_dead_ctx", 1), 1);
}

#[test]
fn local_errors_timeouts_and_buffer_limit() {
    let (_, p100) = test_plugins();
    // Nothing listens there: 127.0.0.2, because a port freed on 127.0.0.1 can be taken at once
    // by another test's listener (seen under parallel runs).
    let dead = std::net::SocketAddr::from(([127, 0, 0, 2], free_port()));
    let gw = gateway(&base(1, &[dead], "", p100, "{}"));
    assert_eq!(get(gw.listen, "/v1", &[]).status, 503);
    let gw = gateway(&base(1, &[echo_upstream()], "", p100, "{}"));
    assert_eq!(get(gw.listen, "/slow", &[]).status, 504);
    let big = vec![b'x'; 5000];
    let (p021, _) = test_plugins();
    let gw = gateway(&base(1, &[echo_upstream()], "", p021, "{}"));
    let r = http(
        gw.listen,
        "POST",
        "/v1",
        &[("x-tp-mode", "pause")],
        &big,
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(r.status, 413);
    assert_eq!(wait_stat(&gw, "tp.on_done", 1), stat(&gw, "tp.ctx_created"));
}

#[test]
fn rejected_config_exits_with_status_2() {
    let (_, p100) = test_plugins();
    let file = TempFile::new("rejected.yaml");
    let dir = &file.0;
    std::fs::write(
        dir,
        base(2, &[echo_upstream()], "", p100, "{\"reject\":true}"),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ailb-gateway"))
        .args(["--config", dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("rejecting config"));
}

#[test]
fn one_compiled_plugin_serves_many_gateways_and_a_dropped_gateway_stops() {
    let (_, p100) = test_plugins();
    let plugin =
        std::sync::Arc::new(ailb_gateway::vm::Plugin::load(&std::fs::read(p100).unwrap()).unwrap());
    let yaml = base(2, &[echo_upstream()], "", p100, "{}");
    let start = || {
        let cfg = ailb_gateway::config::Config::from_yaml(&yaml, &[], ".".into()).unwrap();
        ailb_gateway::gateway::start_with(cfg, Some(plugin.clone())).unwrap()
    };
    let (a, b) = (start(), start());
    for gw in [&a, &b] {
        assert_eq!(get(gw.listen, "/v1", &[]).status, 200);
    }
    let (listen, admin) = (a.listen, a.admin);
    drop(a);
    // Every worker and the admin thread close their sockets once they see the drop.
    let closed = wait_until(Duration::from_secs(5), || {
        [listen, admin]
            .iter()
            .all(|addr| std::net::TcpStream::connect(addr).is_err())
    });
    assert!(closed, "a dropped gateway still accepts");
    assert_eq!(get(b.listen, "/v1", &[]).status, 200);
}

/// Blocks its Redis connection for 5 s: a request pauses on it until then.
const BLPOP_5S: &str = "*3\\r\\n$5\\r\\nBLPOP\\r\\n$5\\r\\nnokey\\r\\n$1\\r\\n5\\r\\n";

/// One worker running the test plugin under `policy`; a request paused on a 5 s Redis reply
/// while another request kills the VM. Returns the gateway, the paused request's answer and
/// how long it took, and the killing request's answer.
fn kill_vm_while_a_request_waits_for_redis(
    policy: &str,
    rs: &RedisServer,
) -> (ailb_gateway::gateway::Gateway, Option<Resp>, Duration, Resp) {
    let (_, p100) = test_plugins();
    let pcfg = format!("{{\"redis\":\"{RC}\",\"timeout\":8000}}");
    let y = format!(
        "{}  failure_policy: {policy}\n  reload_backoff_ms: 1000\n",
        base(
            1,
            &[echo_upstream()],
            &redis_yaml(RC, rs.port, false),
            p100,
            &pcfg
        )
    );
    let gw = gateway(&y);
    let listen = gw.listen;
    let paused = std::thread::spawn(move || {
        let t = std::time::Instant::now();
        let r = http(
            listen,
            "GET",
            "/v1",
            &[("x-tp-mode", "redis"), ("x-tp-query", BLPOP_5S)],
            b"",
            Duration::from_secs(10),
        );
        (r, t.elapsed())
    });
    assert_eq!(wait_stat(&gw, "gateway.redis_calls", 1), 1);
    // The request waits on the BLPOP in Redis.
    assert!(
        wait_until(Duration::from_secs(5), || blocked_clients(rs) == Some(1)),
        "the BLPOP never blocked"
    );
    let trap = get(gw.listen, "/v1", &[("x-tp-mode", "trap")]);
    let (r, took) = paused.join().unwrap();
    assert_eq!(stat(&gw, "gateway.vm_traps"), 1);
    (gw, r, took, trap)
}

#[test]
fn fail_closed_a_dead_vm_fails_its_paused_streams_at_once_and_every_later_one() {
    let rs = RedisServer::start();
    let (gw, paused, took, trap) = kill_vm_while_a_request_waits_for_redis("FAIL_CLOSED", &rs);
    assert_eq!(trap.status, 503);
    let paused = paused.expect("the paused request must be answered");
    assert_eq!(paused.status, 503, "{}", paused.body);
    assert!(
        took < Duration::from_secs(2),
        "failed when the VM died, not when Redis answered: {took:?}"
    );
    for _ in 0..3 {
        assert_eq!(get(gw.listen, "/v1", &[]).status, 503);
    }
    assert_eq!(stat(&gw, "gateway.vm_reloads"), 0);
}

#[test]
fn fail_open_a_dead_vm_passes_its_paused_streams_at_once_and_later_ones_skip_it() {
    let rs = RedisServer::start();
    let (gw, paused, took, trap) = kill_vm_while_a_request_waits_for_redis("FAIL_OPEN", &rs);
    assert_eq!(
        trap.status, 200,
        "the killing request goes on: {}",
        trap.body
    );
    let paused = paused.expect("the paused request must be answered");
    assert_eq!(paused.status, 200, "{}", paused.body);
    assert!(took < Duration::from_secs(2), "passed late: {took:?}");
    assert_eq!(paused.echoed("x-tp-redis"), None, "no callback came");
    // The plugin added x-tp-route in on_request_headers before it died.
    assert!(paused.echoed("x-tp-route").is_some());
    let later = get(gw.listen, "/v1", &[]);
    assert_eq!(later.status, 200);
    assert_eq!(later.echoed("x-tp-route"), None, "the dead VM is skipped");
}

#[test]
fn fail_reload_a_fresh_vm_serves_new_requests_after_the_backoff() {
    let rs = RedisServer::start();
    let (gw, paused, took, trap) = kill_vm_while_a_request_waits_for_redis("FAIL_RELOAD", &rs);
    assert_eq!(trap.status, 503);
    let paused = paused.expect("the paused request must be answered");
    assert_eq!(paused.status, 503);
    assert!(took < Duration::from_secs(2), "failed late: {took:?}");
    // Within the 1 s backoff: still the dead VM.
    assert_eq!(get(gw.listen, "/v1", &[]).status, 503);
    // Past it, the next request gets a fresh VM (each request before that is refused).
    assert!(
        wait_until(Duration::from_secs(5), || get(gw.listen, "/v1", &[]).status
            == 200),
        "no fresh VM after the backoff"
    );
    // The fresh VM: configured again, Redis tokens from 7 again, on a new connection (the old
    // VM's, blocked in BLPOP, went with it).
    let r = get(gw.listen, "/v1", &[("x-tp-mode", "redis")]);
    assert_eq!(r.status, 200, "{}", r.body);
    let info = r.echoed("x-tp-redis").unwrap();
    assert!(info.contains("token=7 status=0"), "{info}");
    assert_eq!(stat(&gw, "gateway.vm_reloads"), 1);
    // Redis is done with the old VM's BLPOP: the reload closed its connection, so Redis drops
    // it (were the connection kept, its answer would come at 5 s, for the old VM). The new VM
    // goes on.
    assert!(
        wait_until(Duration::from_secs(10), || blocked_clients(&rs) == Some(0)),
        "Redis still holds the old VM's BLPOP"
    );
    let r = get(gw.listen, "/v1", &[("x-tp-mode", "redis")]);
    assert!(r
        .echoed("x-tp-redis")
        .unwrap()
        .contains("token=11 status=0"));
    assert_eq!(stat(&gw, "gateway.vm_traps"), 1);
}

#[test]
fn wasi_poll_oneoff_answers_success_with_zero_events() {
    // Fails (traps) unless poll_oneoff returns 0 and writes nevents = 0 over the 99 there.
    let wat = r#"(module
      (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
      (memory (export "memory") 1)
      (func (export "proxy_abi_version_0_2_100"))
      (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
        (i32.store (i32.const 128) (i32.const 99))
        (if (i32.ne (call $poll (i32.const 0) (i32.const 64) (i32.const 1) (i32.const 128)) (i32.const 0))
          (then unreachable))
        (if (i32.ne (i32.load (i32.const 128)) (i32.const 0)) (then unreachable))
        (i32.const 0)))"#;
    let file = TempFile::new("poll.wat");
    let path = &file.0;
    std::fs::write(path, wat).unwrap();
    let gw = gateway(&format!(
        "workers: 1\n{}{}",
        cluster_yaml(&[echo_upstream()]),
        plugin_yaml(path, "{}")
    ));
    for _ in 0..3 {
        assert_eq!(get(gw.listen, "/v1", &[]).status, 200);
    }
    assert_eq!(stat(&gw, "gateway.vm_traps"), 0);
}

/// A route's retry policy (router.rs): the first try goes to the override, a retry ignores it
/// (Higress's Envoy 1.27 router returns no override on a retry) and the cluster's round robin,
/// which would alternate, skips the host already tried; the plugin's response phase runs once,
/// on the answer, and `upstream.address` names the host that gave it. Without a policy the
/// override's connect failure is the router's 503; an unknown condition is a config error.
#[test]
fn a_retry_ignores_the_override_and_upstream_address_names_the_host_that_answered() {
    let (_, p100) = test_plugins();
    let live = echo_upstream();
    let dead = format!("127.0.0.1:{}", free_port());
    let yaml = |route_extra: &str| {
        format!(
            "workers: 1\nlog_level: warn\nclusters:\n  - name: c\n    lb_policy: round_robin\n    \
             endpoints:\n      - {{ address: \"{dead}\" }}\n      - {{ address: \"{live}\" }}\n\
             routes:\n  - {{ name: r, match: {{ prefix: / }}, cluster: c{route_extra} }}\n{}",
            plugin_yaml(p100, "{}")
        )
    };
    let to_dead = [("x-tp-mode", "override"), ("x-tp-override", dead.as_str())];
    let gw = gateway(&yaml(", retry_policy: { retry_on: connect-failure }"));
    for i in 1..=4 {
        let r = get(gw.listen, "/v1", &to_dead);
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.upstream(), live.to_string());
        assert_eq!(r.header("x-tp-upstream"), Some(live.to_string()));
        assert_eq!(stat(&gw, "gateway.upstream_rq_retry"), i);
    }
    assert_eq!(wait_stat(&gw, "tp.on_done", 4), 4);
    assert_eq!(
        stat(&gw, "tp.response_headers"),
        4,
        "one response phase each"
    );
    assert_eq!(stat(&gw, "gateway.upstream_connect_failures"), 0);
    drop(gw);

    let gw = gateway(&yaml(""));
    let r = get(gw.listen, "/v1", &to_dead);
    assert_eq!(r.status, 503);
    assert_eq!(stat(&gw, "gateway.upstream_rq_retry"), 0);
    assert_eq!(stat(&gw, "gateway.upstream_connect_failures"), 1);
    drop(gw);

    let bad = yaml(", retry_policy: { retry_on: \"5xx,refused-stream\" }");
    let err = ailb_gateway::config::Config::from_yaml(&bad, &[], ".".into()).unwrap_err();
    assert!(format!("{err:#}").contains("\"refused-stream\""), "{err:#}");
}
