use super::*;
use serde_json::json;

fn one(text: &str) -> Document {
    let mut docs = documents(text).unwrap();
    assert_eq!(docs.len(), 1, "{docs:?}");
    docs.remove(0)
}

#[test]
fn plain_scalars_resolve_as_go_yaml_v2_does() {
    let d = one(
        "a: yes\nb: off\nc: 6_379\nd: 0755\ne: 0x1F\nf: 1e3\ng: ~\nh: Y\ni: 1.5\nj: abc\nk: +12\n",
    );
    assert_eq!(
        d.value,
        json!({"a": true, "b": false, "c": 6379, "d": 493, "e": 31, "f": 1000.0, "g": null,
               "h": true, "i": 1.5, "j": "abc", "k": 12})
    );
    let paths: Vec<&str> = d.notes.iter().map(|n| n.path.as_str()).collect();
    // Where YAML 1.2 differs: yes, off, 6_379, 0755 (decimal 755 there), Y.
    assert_eq!(paths, ["a", "b", "c", "d", "h"], "{:?}", d.notes);
    assert!(d.notes[2].message.contains("the number 6379"));
    assert!(d.notes[2].message.contains("the text \"6_379\""));
}

#[test]
fn quoted_and_tagged_scalars_stay_text() {
    let d = one("a: \"yes\"\nb: 'on'\nc: !!str 6_379\nd: |\n  off\n");
    assert_eq!(
        d.value,
        json!({"a": "yes", "b": "on", "c": "6_379", "d": "off\n"})
    );
    assert!(d.notes.is_empty(), "{:?}", d.notes);
}

#[test]
fn merge_keys_copy_the_anchored_mapping_and_later_keys_win() {
    let text = "base: &base\n  serviceFQDN: redis.static\n  servicePort: 6379\n\
                route:\n  <<: *base\n  servicePort: 6380\n";
    let d = one(text);
    assert_eq!(
        d.value["route"],
        json!({"serviceFQDN": "redis.static", "servicePort": 6380})
    );
    assert_eq!(d.notes.len(), 1);
    assert_eq!(d.notes[0].path, "route.<<");
    // A sequence of mappings: the earlier ones win.
    let d = one("a: &a {p: 1}\nb: &b {p: 2, q: 2}\nc:\n  <<: [*a, *b]\n");
    assert_eq!(d.value["c"], json!({"p": 1, "q": 2}));
    // Even a key: `y` is the boolean true to go-yaml v2.
    assert_eq!(one("y: 1\n").value, json!({"true": 1}));
}

#[test]
fn keys_become_their_text_and_documents_split() {
    let docs = documents("on: 1\n---\n---\nkind: Ingress\n").unwrap();
    assert_eq!(docs.len(), 2, "the empty document is skipped");
    assert_eq!(docs[0].value, json!({"true": 1}));
    assert_eq!(docs[1].value["kind"], "Ingress");
}

#[test]
fn broken_yaml_is_an_error_not_a_panic() {
    assert!(documents("a: [1, 2\n").is_err());
    assert!(documents("a: *nowhere\n").is_err());
    assert!(documents("a:\n  <<: 3\n").is_err());
}

#[test]
fn numbers_beyond_go_integers_are_text_or_floats() {
    assert_eq!(resolve_yaml11("99999999999999999999"), json!(1e20));
    assert_eq!(resolve_yaml11("0b101"), json!(5));
    assert_eq!(resolve_yaml11("1_0.5"), json!(10.5));
    assert_eq!(resolve_yaml11(".5"), json!(0.5));
    assert_eq!(resolve_yaml11("1.2.3"), json!("1.2.3"));
    assert_eq!(resolve_yaml12("0755"), json!(755));
    assert_eq!(resolve_yaml12("yes"), json!("yes"));
}
