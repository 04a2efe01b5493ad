//! The README documents every metric the plugin defines and every config key it accepts.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ailb_core::stats::Stats;

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap()
}

#[test]
fn it_lists_every_metric() {
    let text = readme();
    for name in Stats::names() {
        assert!(
            text.contains(&format!("| `{name}` |")),
            "README metrics table lacks {name}"
        );
    }
}

#[test]
fn it_documents_every_lb_config_key() {
    let text = readme();
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
            "README config table lacks {key}"
        );
    }
}
