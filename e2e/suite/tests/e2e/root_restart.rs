//! A live root context started and configured again with its own configuration, as
//! proxy-wasm-cpp-host does when a plugin handle with the root's key (root id and configuration)
//! starts it anew (docs/higress-abi.md §11 "Root contexts"): a request counted before keeps its
//! count and gives it back at its end, and the root goes on serving.

use ailb_core::cluster::stats::table::ServiceTable;
use ailb_e2e::plugin_wasm;
use ailb_gateway::config::Config;
use ailb_gateway::shared::Shared;
use ailb_gateway::stream_data::pairs;
use ailb_gateway::vm::Plugin;
use ailb_gateway::worker::Worker;
use std::sync::Arc;

const SERVICES: [&str; 3] = ["llm-a", "llm-b", "llm-c"];

fn config_yaml() -> String {
    let mut y = String::from("workers: 1\nlog_level: warn\nclusters:\n");
    for (i, name) in SERVICES.iter().enumerate() {
        y.push_str(&format!(
            "  - {{ name: {name}, lb_policy: round_robin, endpoints: [ {{ address: \"127.0.0.1:{}\" }} ] }}\n",
            i + 1
        ));
    }
    y.push_str(
        "routes:\n  - { name: llm-route, match: { prefix: / }, cluster_header: x-higress-target-cluster }\n",
    );
    y.push_str(&format!(
        "plugin:\n  wasm: {}\n  config: {{ lb_type: cluster, lb_policy: cluster_metrics, lb_config: {{ mode: AdaptiveScore, service_list: [llm-a, llm-b, llm-c] }} }}\n",
        plugin_wasm().display()
    ));
    y
}

/// Requests in flight by the route's statistics record in shared data.
fn in_flight(shared: &Shared) -> i64 {
    let data = shared.shared_data.lock().unwrap_or_else(|e| e.into_inner());
    let records: Vec<&Vec<u8>> = data
        .iter()
        .filter(|(k, _)| k.starts_with(b"ailb.cm."))
        .map(|(_, (v, _))| v)
        .collect();
    assert_eq!(records.len(), 1, "one cluster_metrics record");
    let table = ServiceTable::new(&SERVICES, 0)
        .read(records[0])
        .expect("the record reads as this route's");
    table.stats().iter().map(|s| s.ongoing).sum()
}

#[test]
fn a_root_configured_again_with_its_own_configuration_keeps_the_counts() {
    let dir = std::env::temp_dir().join(format!("ailb-root-restart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("gateway.yaml");
    std::fs::write(&path, config_yaml()).expect("config written");
    let cfg = Config::load(&path, &[]).expect("config loads");
    let route = cfg.routes.first().cloned();
    let wasm = std::fs::read(plugin_wasm()).expect("make build first");
    let plugin = Arc::new(Plugin::load(&wasm).expect("module loads"));
    let shared = Shared::new(cfg).expect("shared state");
    let config_len = shared.plugin_config.len();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    tokio::task::LocalSet::new().block_on(&rt, async move {
        let w = Worker::new(0, shared.clone(), Some(plugin)).expect("worker");
        let request = |w: &Worker| {
            let headers = pairs(&[
                (":method", "POST"),
                (":path", "/v1/chat/completions"),
                (":authority", "gw"),
            ]);
            let n = headers.len();
            let ctx = w.new_stream(headers, route.as_ref()).expect("stream");
            let verdict = w.with_vm(|vm| vm.on_request_headers(ctx, n, true));
            assert!(matches!(verdict, Some(Ok(0))), "routed at once");
            ctx
        };
        let first = request(&w);
        assert_eq!(in_flight(&shared), 1);
        // The restart: proxy_on_context_create(root, 0), proxy_on_vm_start, proxy_on_configure.
        let restarted = w.with_vm(|vm| vm.start(config_len));
        assert!(matches!(restarted, Some(Ok(true))), "configured again");
        assert_eq!(in_flight(&shared), 1, "the restart gives nothing back");
        let second = request(&w);
        assert_eq!(in_flight(&shared), 2, "the root goes on serving");
        w.destroy_stream(first);
        assert_eq!(in_flight(&shared), 1, "the first request's count came back");
        w.destroy_stream(second);
        assert_eq!(in_flight(&shared), 0);
    });
    let _ = std::fs::remove_dir_all(&dir);
}
