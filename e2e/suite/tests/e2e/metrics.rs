//! endpoint_metrics end to end in the Higress emulator: the built plugin, fake vLLM pods with
//! live `/metrics`, metrics from the emulator's health checks (`store_metrics`) or from the
//! plugin's own scraper (an `original_dst` cluster); garbage and failed scrapes fall back.

use ailb_e2e::bed::Bed;
use ailb_e2e::gateway::{Gateway, GatewaySpec};
use ailb_e2e::metrics::{busy_bed, land, metrics_check_path, preload, wait_pages_stored};
use ailb_fakepod::MetricsSource;
use ailb_testkit::wait_until;
use serde_json::{json, Value};
use std::time::Duration;

fn host_mode_spec(bed: &Bed, lb: Value) -> GatewaySpec {
    let mut spec = bed.spec(
        "gw-m",
        Some(json!({"lb_policy": "endpoint_metrics", "lb_config": lb})),
    );
    spec.health_check = Some(
        json!({"path": metrics_check_path("gw-m"), "interval_ms": 100, "timeout_ms": 2000,
        "unhealthy_threshold": 3, "healthy_threshold": 1, "store_metrics": true}),
    );
    spec
}

fn scrape_spec(bed: &Bed, extra: Value) -> GatewaySpec {
    let mut lb = json!({"metricsSource": "scrape", "scrapeCluster": "ailb-scrape",
        "scrapeIntervalMs": 100, "scrapeTimeoutMs": 300});
    if let (Some(lb), Some(extra)) = (lb.as_object_mut(), extra.as_object()) {
        lb.extend(extra.clone());
    }
    let mut spec = bed.spec(
        "gw-s",
        Some(json!({"lb_policy": "endpoint_metrics", "lb_config": lb})),
    );
    spec.extra_clusters = vec![json!({"name": "ailb-scrape", "type": "original_dst",
        "lb_policy": "round_robin", "timeout_ms": 1000, "connect_timeout_ms": 300})];
    spec
}

fn wait_stat(gw: &Gateway, name: &str, at_least: i64) -> bool {
    wait_until(Duration::from_secs(10), || gw.stat(name) >= at_least)
}

#[test]
fn host_metrics_keep_requests_off_the_busy_pod() {
    let bed = busy_bed();
    let gw = bed.gateway(&host_mode_spec(&bed, json!({})));
    preload(&bed, 0, 6, 300);
    // Once the health checks have stored pod-0's queue (and the others' pages), send through
    // the gateway.
    assert!(wait_pages_stored(&bed.pods, &["gw-m"]), "{}", gw.logs());
    let (pods, statuses) = land(&gw.url, 12, &[]);
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(pods.get("pod-0"), None, "landed: {pods:?}");
    assert_eq!(gw.stat("ai_lb.metrics.routed"), 12, "{}", gw.logs());
    // Parsed per health-check change, not per request × pod.
    let parsed = gw.stat("ai_lb.metrics.parsed");
    assert!(parsed > 0, "{parsed}");
}

#[test]
fn scraped_metrics_keep_requests_off_the_busy_pod() {
    let bed = busy_bed();
    let gw = bed.gateway(&scrape_spec(&bed, json!({})));
    // The scraper learns the pods from the first request's host list.
    let (_, statuses) = land(&gw.url, 1, &[]);
    assert_eq!(statuses, vec![200]);
    preload(&bed, 0, 6, 300);
    // Two rounds of scrapes of the 3 pods after pod-0 filled up: its queue is known.
    let scrapes = gw.stat("ai_lb.metrics.scrape_ok");
    assert!(
        wait_stat(&gw, "ai_lb.metrics.scrape_ok", scrapes + 6),
        "{}",
        gw.logs()
    );
    let (pods, statuses) = land(&gw.url, 12, &[]);
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(pods.get("pod-0"), None, "landed: {pods:?}");
    assert!(gw.stat("ai_lb.metrics.routed") >= 12);
    // One scraper per proxy (2 workers): scrapes are paced by the interval, not doubled, and
    // parses equal scrapes (never per request).
    let ok = gw.stat("ai_lb.metrics.scrape_ok");
    let failed = gw.stat("ai_lb.metrics.scrape_failed");
    assert_eq!(gw.stat("ai_lb.metrics.parsed"), ok + failed);
}

#[test]
fn garbage_metrics_and_failed_scrapes_fall_back_cleanly() {
    // Garbage from every pod's health check: every request is served by the cluster's LB.
    let bed = Bed::new(3, |c| c.metrics = MetricsSource::Garbage);
    let gw = bed.gateway(&host_mode_spec(&bed, json!({})));
    assert!(wait_pages_stored(&bed.pods, &["gw-m"]), "{}", gw.logs());
    let (pods, statuses) = land(&gw.url, 9, &[]);
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(pods.len(), 3, "round-robin fallback: {pods:?}");
    assert_eq!(gw.stat("ai_lb.fallback.no_metrics"), 9);
    drop(gw);

    // Scrapes that fail (nothing listens on the metrics port) or time out: same fallback.
    let bed = Bed::new(3, |_| {});
    let gw = bed.gateway(&scrape_spec(
        &bed,
        json!({"scrapePort": ailb_testkit::free_port()}),
    ));
    land(&gw.url, 1, &[]);
    assert!(
        wait_stat(&gw, "ai_lb.metrics.scrape_failed", 3),
        "{}",
        gw.logs()
    );
    let (_, statuses) = land(&gw.url, 6, &[]);
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert!(gw.stat("ai_lb.fallback.no_metrics") >= 6);
    assert_eq!(gw.stat("ai_lb.metrics.scrape_ok"), 0);
}
