//! The whole plugin configuration as Higress's wasm-go wrapper splits it (README
//! "Configuration compatibility"):
//!
//! * an empty config, `{}` or anything but an object is parsed as the global config (and, for
//!   this plugin, refused: it names no `lb_policy`);
//! * `_plugin_id_` is the control plane's and is dropped;
//! * any key besides `_rules_` makes the whole object the global config;
//! * each `_rules_` entry is compiled from its own object only (nothing is inherited) and must
//!   carry a match list; **one bad rule refuses the whole config**;
//! * a global config that fails while rules exist is dropped (a warning): requests no rule
//!   matches are then not balanced; with no rules it refuses the config.

use super::error::ConfigError;
use super::go::{Field, Go};
use super::json;
use super::raw::RawRoute;
use super::read::{In, Reader};
use super::rules::Matcher;
use super::types::RouteConfig;
use super::values::Build;
use super::warning::Warnings;
use serde_json::Value;

pub type Rules = Vec<(Matcher, RouteConfig)>;

pub fn read(
    bytes: &[u8],
    build: Build,
    warnings: &mut Warnings,
) -> Result<(Option<RouteConfig>, Rules), ConfigError> {
    let mut value = if bytes.is_empty() {
        Value::Object(Default::default())
    } else {
        let (value, duplicates) =
            json::parse(bytes).map_err(|e| ConfigError::syntax(format!("not valid JSON: {e}")))?;
        for path in duplicates {
            warnings.push(
                path,
                "given more than once: the first one is used (as Higress reads it)",
            );
        }
        value
    };
    let Value::Object(top) = &mut value else {
        return Err(ConfigError::higress(
            "",
            "the configuration must be a JSON object (Higress reads anything else as an empty config, which names no lb_policy)",
        ));
    };
    if top
        .get("_plugin_id_")
        .is_some_and(|v| !(v.is_null() || v.as_str() == Some("")))
    {
        top.remove("_plugin_id_");
    }
    let mut r = Reader::new("", warnings);
    if top.is_empty() {
        return Err(r.err_higress("lb_policy", "missing (Higress refuses an empty config too)"));
    }
    let rules_value = top.get("_rules_").cloned();
    let has_global = top.len() > usize::from(rules_value.is_some());
    let global = if has_global {
        let raw = RawRoute::from_value(&value);
        Some(RouteConfig::try_from(In {
            raw: &raw,
            r: &mut r,
            build,
        }))
    } else {
        None
    };
    let items = match &rules_value {
        None => Vec::new(),
        Some(v) => r
            .list("_rules_", &Field(Some(Go(v.clone()))))
            .unwrap_or_default(),
    };
    if items.is_empty() {
        return match global {
            Some(Ok(g)) => Ok((Some(g), Vec::new())),
            Some(Err(e)) => Err(e),
            None => Err(r.err_higress(
                "lb_policy",
                "missing: no global configuration and no _rules_",
            )),
        };
    }
    let mut rules = Vec::with_capacity(items.len());
    for (n, item) in items.iter().enumerate() {
        let mut rr = r.nested(&format!("_rules_[{n}]"));
        let raw = RawRoute::from_value(&item.0);
        let matcher = Matcher::read(&raw, &mut rr)?;
        let config = RouteConfig::try_from(In {
            raw: &raw,
            r: &mut rr,
            build,
        })?;
        rules.push((matcher, config));
    }
    let global = match global {
        Some(Err(e)) => {
            let path = e.path.clone();
            r.warnings.push(
                path,
                format!("the global config is refused ({}) and dropped, as Higress drops it when rules exist: requests no rule matches are not balanced", e.problem),
            );
            None
        }
        Some(Ok(g)) => Some(g),
        None => None,
    };
    Ok((global, rules))
}
