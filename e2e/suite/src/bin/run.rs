//! `make run`: redis-server, three fake pods and one emulator gateway running the built plugin
//! with the shipped example config (`plugin-config/minimal.json`, pointed at this Redis). Sends
//! a short mixed workload, prints a per-pod table, then keeps serving until Ctrl-C
//! (`--once`: exit after the table).

use ailb_e2e::bed::Bed;
use ailb_e2e::gateway::Gateway;
use ailb_fakepod::load::{self, HoldSpec, LoadConfig, Workload};
use serde_json::Value;
use std::time::Duration;

fn main() -> anyhow::Result<()> {
    let once = std::env::args().any(|a| a == "--once");
    let bed = Bed::new(3, |c| {
        c.max_running = 8;
        c.decode_us_per_token = 5_000;
        c.prefill_us_per_token = 20;
    });
    let example = ailb_e2e::repo_root().join("plugin-config/minimal.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&example)?)?;
    config["lb_config"]["servicePort"] = bed.redis.port.into();
    config["lb_config"]["debugHeader"] = "x-ai-lb-debug".into();
    let mut spec = bed.spec("gw-1", Some(config));
    spec.log_level = "info".into();
    let gw = Gateway::start(&spec)?;
    println!("gateway   {}   (admin {})", gw.url, gw.admin);
    println!("redis     127.0.0.1:{}", bed.redis.port);
    for p in &bed.pods {
        println!("{:9} {}", p.name, p.url());
    }
    println!("try: curl -si {}/v1/chat/completions -d '{{\"model\":\"fake-model\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'\n", gw.url);

    // A short mixed workload: long concurrent requests, then skewed open-loop traffic.
    let hold = LoadConfig::new(
        vec![gw.url.clone()],
        Workload::Hold(HoldSpec {
            concurrency: 12,
            max_tokens: 100,
            ..HoldSpec::default()
        }),
    );
    let run = bed.rt.spawn(async move { load::run(&hold).await });
    // Sample Redis while the long requests are in flight.
    std::thread::sleep(Duration::from_millis(300));
    let in_flight = bed.counts();
    let hold_summary = bed.rt.block_on(run)??;
    let mut skewed = LoadConfig::new(vec![gw.url.clone()], Workload::Skewed(Default::default()));
    if let Workload::Skewed(s) = &mut skewed.workload {
        s.arrivals = load::Arrivals::Count {
            count: 60,
            duration: Duration::from_secs(2),
        };
    }
    let skewed_summary = bed.rt.block_on(load::run(&skewed))?;
    println!("hold    : {}", hold_summary.line());
    println!("skewed  : {}", skewed_summary.line());

    let after = bed.counts();
    println!(
        "\n{:<8} {:<22} {:>9} {:>12} {:>16} {:>14}",
        "pod", "address", "requests", "peak running", "redis in-flight", "redis after"
    );
    for p in &bed.pods {
        let s = p.state();
        let addr = p.addr.to_string();
        println!(
            "{:<8} {:<22} {:>9} {:>12} {:>16} {:>14}",
            p.name,
            addr,
            s.requests_total,
            s.peak_running,
            in_flight.load.get(&addr).copied().unwrap_or(0.0),
            after.load.get(&addr).copied().unwrap_or(0.0),
        );
    }
    println!(
        "\nplugin: routed {}  fallback {}  (leases left in Redis: {})",
        gw.stat("ai_lb.glr.routed"),
        gw.stat("ai_lb.glr.fallback"),
        after.leases
    );
    if once {
        return Ok(());
    }
    println!("\nserving on {} — Ctrl-C to stop", gw.url);
    bed.rt.block_on(tokio::signal::ctrl_c())?;
    Ok(())
}
