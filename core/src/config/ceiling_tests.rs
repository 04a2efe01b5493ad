//! Priority ceilings (docs/sessions-and-queues.md "Priority ceilings"): the keys, strict, and
//! the pure clamp — a class is held to its tenant's ceiling, never raised, whatever bytes the
//! priority and tenant headers carry.

use super::*;
use crate::hash::SplitMix64;
use serde_json::{json, Value};

fn parse(lb: Value) -> Result<PluginConfig, ConfigError> {
    let mut cfg = json!({"serviceFQDN": "redis.static", "servicePort": 6379,
                         "maxRequestCount": 4, "priorityHeader": "x-priority",
                         "tenantHeader": "x-tenant"});
    if let (Value::Object(a), Value::Object(b)) = (&mut cfg, lb) {
        a.extend(b);
    }
    let doc = json!({"lb_policy": "global_least_request", "lb_config": cfg});
    PluginConfig::parse(doc.to_string().as_bytes())
}

fn priority(lb: Value) -> Priority {
    let cfg = parse(lb).unwrap();
    cfg.global.unwrap().common.priority.clone().unwrap()
}

/// gold may use critical, free only sheddable, 租户 standard; everyone else sheddable.
fn routes() -> Priority {
    priority(json!({
        "priorityCeilings": {"gold": "critical", "free": "Sheddable", "租户": "standard"},
        "defaultPriorityCeiling": "sheddable"}))
}

#[test]
fn the_keys_are_read_into_ranks() {
    let p = routes();
    let c = p.ceilings.as_ref().unwrap();
    assert_eq!(c.tenants["gold"], 0);
    assert_eq!(c.tenants["free"], 2);
    assert_eq!(c.tenants["租户"], 1);
    assert_eq!(c.default, 2);
    // Without defaultPriorityCeiling an unnamed caller's ceiling is defaultPriorityClass's.
    let p = priority(json!({"priorityCeilings": {"gold": "critical"}}));
    assert_eq!(p.ceilings.as_ref().unwrap().default, 1);
    let p = priority(json!({"priorityCeilings": {"gold": "critical"},
                            "defaultPriorityClass": "sheddable"}));
    assert_eq!(p.ceilings.as_ref().unwrap().default, 2);
    // Only a default: every caller held to it.
    let p = priority(json!({"defaultPriorityCeiling": "standard"}));
    let c = p.ceilings.as_ref().unwrap();
    assert!(c.tenants.is_empty());
    assert_eq!(c.default, 1);
    // Neither key: no ceilings, the header's class as before.
    assert!(priority(json!({})).ceilings.is_none());
}

#[test]
fn bad_ceiling_keys_are_config_errors_naming_the_field() {
    let bad = [
        (
            json!({"priorityCeilings": {"gold": "vip"}}),
            "priorityCeilings.gold",
        ),
        (json!({"priorityCeilings": {"gold": 0}}), "priorityCeilings"),
        (json!({"priorityCeilings": ["gold"]}), "priorityCeilings"),
        (
            json!({"priorityCeilings": {"": "critical"}}),
            "priorityCeilings",
        ),
        (
            json!({"priorityCeilings": {"a,b": "critical"}}),
            "priorityCeilings.a,b",
        ),
        (
            json!({"priorityCeilings": {" a": "critical"}}),
            "priorityCeilings. a",
        ),
        (
            json!({"defaultPriorityCeiling": "gold"}),
            "defaultPriorityCeiling",
        ),
        (
            json!({"defaultPriorityCeiling": 1}),
            "defaultPriorityCeiling",
        ),
        (
            json!({"tenantHeader": null, "priorityCeilings": {"gold": "critical"}}),
            "priorityCeilings: needs `tenantHeader`",
        ),
        (
            json!({"tenantHeader": null, "defaultPriorityCeiling": "standard"}),
            "defaultPriorityCeiling: needs `tenantHeader`",
        ),
        (
            json!({"priorityHeader": null, "priorityCeilings": {"gold": "critical"}}),
            "priorityCeilings: needs `priorityHeader`",
        ),
    ];
    for (lb, want) in bad {
        let err = parse(lb.clone())
            .err()
            .unwrap_or_else(|| panic!("{lb} must be refused"));
        assert!(err.to_string().contains(want), "{lb}: {err}");
    }
    let many: serde_json::Map<String, Value> = (0..=super::ceiling::MAX_PRIORITY_CEILINGS)
        .map(|n| (format!("t{n}"), json!("standard")))
        .collect();
    let err = parse(json!({"priorityCeilings": many})).err().unwrap();
    assert!(err.to_string().contains("at most 256"), "{err}");
    // endpoint_metrics has no tenant: its ceilings are refused, not ignored.
    let doc = json!({"lb_policy": "endpoint_metrics", "lb_config": {
        "maxRequestCount": 4, "priorityHeader": "x-priority",
        "priorityCeilings": {"gold": "critical"}}});
    let err = PluginConfig::parse(doc.to_string().as_bytes())
        .err()
        .unwrap();
    assert!(
        err.to_string()
            .contains("priorityCeilings: priority ceilings are bound to `tenantHeader`"),
        "{err}"
    );
}

#[test]
fn a_class_above_the_tenants_ceiling_is_clamped_and_never_raised() {
    let p = routes();
    let class = |value: Option<&str>, tenant: Option<&str>| {
        let c = p.class_for(value, tenant.map(str::as_bytes));
        (c.rank, c.clamped_from)
    };
    // gold may use anything.
    assert_eq!(class(Some("critical"), Some("gold")), (0, None));
    // free asks above its ceiling: clamped, and says what it asked for.
    assert_eq!(class(Some("critical"), Some("free")), (2, Some(0)));
    assert_eq!(class(Some("0"), Some("free")), (2, Some(0)));
    assert_eq!(class(Some("standard"), Some("free")), (2, Some(1)));
    assert_eq!(class(Some("sheddable"), Some("free")), (2, None));
    // 租户 (a unicode name, matched exactly) may use standard.
    assert_eq!(class(Some("critical"), Some("租户")), (1, Some(0)));
    assert_eq!(
        class(Some("sheddable"), Some("租户")),
        (2, None),
        "never raised"
    );
    // Unnamed, unknown and absent tenants get the default ceiling.
    assert_eq!(
        class(Some("critical"), Some("Gold")),
        (2, Some(0)),
        "exact names"
    );
    assert_eq!(class(Some("critical"), Some("intruder")), (2, Some(0)));
    assert_eq!(class(Some("critical"), None), (2, Some(0)));
    // No header, or a value naming no class: the default class, held to the ceiling without
    // counting it as a clamp (nothing was claimed).
    assert_eq!(class(None, Some("gold")), (1, None));
    assert_eq!(class(None, Some("free")), (2, None));
    assert_eq!(class(Some("vip"), Some("free")), (2, None));
    assert!(p.class_for(Some("vip"), Some(b"free")).unknown);
    // A repeated priority header is its lowest class, then held to the ceiling.
    assert_eq!(
        class(Some("critical, critical"), Some("free")),
        (2, Some(0))
    );
    assert_eq!(class(Some("sheddable,critical"), Some("gold")), (2, None));
}

#[test]
fn forged_repeated_huge_and_unicode_headers_have_defined_classes() {
    let p = routes();
    let tenant = Fairness::name_of;
    let rank = |value: &str, raw: &[u8]| p.class_for(Some(value), tenant(raw)).rank;
    // The tenant is the first value of a repeated header, trimmed (as fairness reads it).
    assert_eq!(rank("critical", b" gold , free"), 0);
    assert_eq!(rank("critical", b"free,gold"), 2);
    assert_eq!(
        rank("critical", b",gold"),
        2,
        "an empty first value is no tenant"
    );
    assert_eq!(rank("critical", b"   "), 2);
    // Huge, unicode and binary names are unnamed tenants.
    assert_eq!(rank("critical", "g".repeat(10_000).as_bytes()), 2);
    assert_eq!(rank("critical", "gold\u{200b}".as_bytes()), 2);
    assert_eq!(rank("critical", &[0xff, 0xfe, b'g']), 2);
    assert_eq!(rank("critical", "租户".as_bytes()), 1);
    // Huge and unicode priority values name no class: the default class, held to the ceiling.
    let huge = "critical".repeat(2_000);
    assert_eq!(p.class_for(Some(&huge), tenant(b"gold")).rank, 1);
    assert_eq!(p.class_for(Some("críticál"), tenant(b"gold")).rank, 1);
    assert_eq!(p.class_for(Some("critical\u{0}"), tenant(b"gold")).rank, 1);
}

#[test]
fn no_header_bytes_raise_a_class_above_its_ceiling() {
    // Random priority values and tenant bytes: the class is never above the tenant's ceiling,
    // never above what the header alone would give, and always a class of the route.
    let p = routes();
    let ceilings = p.ceilings.as_ref().unwrap();
    let mut rng = SplitMix64(48);
    let atoms: [&[u8]; 12] = [
        b"critical",
        b"standard",
        b"sheddable",
        b"0",
        b"1",
        b"7",
        b",",
        b" ",
        b"gold",
        b"free",
        "租户".as_bytes(),
        &[0xff],
    ];
    let mut pick = |n: u64| -> Vec<u8> {
        (0..rng.next_u64() % n)
            .flat_map(|_| atoms[(rng.next_u64() % atoms.len() as u64) as usize].to_vec())
            .collect()
    };
    for _ in 0..20_000 {
        let value = String::from_utf8_lossy(&pick(4)).into_owned();
        let raw = pick(3);
        let name = Fairness::name_of(&raw);
        let alone = p.class_of(Some(&value));
        let held = p.class_for(Some(&value), name);
        let (ceiling, _) = ceilings.of(name);
        assert!(held.rank >= ceiling, "{value:?} {raw:?}: above its ceiling");
        assert!(held.rank >= alone.rank, "{value:?} {raw:?}: raised");
        assert!(held.rank < p.classes.len());
        assert_eq!(
            held.clamped_from.is_some(),
            alone.rank < ceiling && !alone.unknown
        );
    }
}
