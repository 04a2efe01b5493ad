//! The reference pages document every metric the plugin defines (docs/metrics.md) and every
//! config key it accepts (docs/configuration.md).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ailb_core::stats::Stats;

fn page(name: &str) -> String {
    let path = format!("{}/../docs/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn it_lists_every_metric() {
    let text = page("metrics.md");
    for name in Stats::names() {
        assert!(
            text.contains(&format!("| `{name}` |")),
            "docs/metrics.md lacks {name}"
        );
    }
}

#[test]
fn it_documents_every_lb_config_key() {
    let text = page("configuration.md");
    let spec = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../plugin-config/spec.yaml"
    ))
    .unwrap();
    let y: serde_yaml::Value = serde_yaml::from_str(&spec).unwrap();
    let props =
        &y["spec"]["configSchema"]["openAPIV3Schema"]["properties"]["lb_config"]["properties"];
    for (key, _) in props.as_mapping().unwrap() {
        let key = key.as_str().unwrap();
        assert!(
            text.contains(&format!("| `{key}` |")),
            "docs/configuration.md lacks {key}"
        );
    }
}
