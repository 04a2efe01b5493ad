//! Table-driven tests for the prefix core: encoding, chaining, every API shape, limits, fuzz.

use super::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const CHAT_TOOLS: &str = include_str!("../../tests/fixtures/prefix/chat_tools.json");
const CHAT_MULTIMODAL: &str = include_str!("../../tests/fixtures/prefix/chat_multimodal.json");
const RESPONSES: &str = include_str!("../../tests/fixtures/prefix/responses.json");
const ANTHROPIC: &str = include_str!("../../tests/fixtures/prefix/anthropic.json");
const COMPLETIONS_STR: &str =
    r#"{"model":"llama-3-8b","prompt":"Once upon a time","max_tokens":32}"#;
const COMPLETIONS_BATCH: &str =
    r#"{"model":"llama-3-8b","prompt":["Translate: cat","Translate: dog"]}"#;
const COMPLETIONS_TOKENS: &str =
    r#"{"model":"llama-3-8b","prompt":[1, 15043, 3186, 0, 4294967295]}"#;
const COMPLETIONS_TOKEN_BATCH: &str = r#"{"model":"llama-3-8b","prompt":[[1,2,3],[1,2,4]]}"#;

const ALL_FIXTURES: &[&str] = &[
    CHAT_TOOLS,
    CHAT_MULTIMODAL,
    RESPONSES,
    ANTHROPIC,
    COMPLETIONS_STR,
    COMPLETIONS_BATCH,
    COMPLETIONS_TOKENS,
    COMPLETIONS_TOKEN_BATCH,
];

fn no_chunks() -> CanonConfig {
    CanonConfig {
        chunk_bytes: 0,
        ..CanonConfig::default()
    }
}

fn canon(body: &str) -> Canonical {
    canonicalize(body.as_bytes(), &CanonConfig::default()).unwrap()
}

fn canon_with(body: &str, cfg: &CanonConfig) -> Canonical {
    canonicalize(body.as_bytes(), cfg).unwrap()
}

fn blocks(c: &Canonical) -> Vec<Vec<u8>> {
    c.blocks().map(<[u8]>::to_vec).collect()
}

fn err(body: &str) -> CanonError {
    canonicalize(body.as_bytes(), &CanonConfig::default()).unwrap_err()
}

/// Re-joins continuation pieces: one `(kind, stream)` per logical item.
fn items(c: &Canonical) -> Vec<(u8, Vec<u8>)> {
    let mut out: Vec<(u8, Vec<u8>)> = Vec::new();
    for b in c.blocks() {
        let (&kind, rest) = b.split_first().unwrap();
        if kind == KIND_CONTINUATION {
            out.last_mut().unwrap().1.extend_from_slice(rest);
        } else {
            out.push((kind, rest.to_vec()));
        }
    }
    out
}

/// Decodes a stream into `(tag, unescaped value)` fields; panics on malformed input.
fn fields(stream: &[u8]) -> Vec<(char, String)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < stream.len() {
        let tag = stream[i] as char;
        i += 1;
        let mut val = Vec::new();
        loop {
            match (stream[i], stream[i + 1]) {
                (0, 0) => break,
                (0, 0xff) => {
                    val.push(0);
                    i += 2;
                }
                (0, other) => panic!("bad escape 00 {other:02x}"),
                (b, _) => {
                    val.push(b);
                    i += 1;
                }
            }
        }
        i += 2;
        out.push((tag, String::from_utf8_lossy(&val).into_owned()));
    }
    out
}

fn f(tag: char, v: &str) -> (char, String) {
    (tag, v.to_owned())
}

fn chat(model: &str, msgs: &[(&str, &str)]) -> String {
    let messages: Vec<Value> = msgs
        .iter()
        .map(|(r, c)| json!({"role": r, "content": c}))
        .collect();
    json!({"model": model, "messages": messages}).to_string()
}

// ---------------------------------------------------------------- chain

#[test]
fn golden_hash_framing_and_key_format() {
    // Expected values computed independently with Python hashlib:
    // sha1(u32le(pos) + u32le(len(model)) + model + block)[:8], XOR-chained.
    let c = canon(&chat("m", &[("user", "hi"), ("assistant", "hello")]));
    assert_eq!(
        blocks(&c),
        vec![
            b"Mruser\0\0thi\0\0".to_vec(),
            b"Mrassistant\0\0thello\0\0".to_vec()
        ]
    );
    let keys = c.chain_keys();
    assert_eq!(key_hex(&keys[0]), "ae9da9753d0392c8");
    assert_eq!(key_hex(&keys[1]), "b40e0179feee1fe7");
    assert_eq!(
        prefix_key("ailb:{chat|outbound|80||vllm.svc}", &keys[1]),
        "ailb:{chat|outbound|80||vllm.svc}:px:b40e0179feee1fe7"
    );
}

#[test]
fn chain_is_order_sensitive() {
    let ab = chain_keys("m", [b"A".as_slice(), b"B"]);
    let ba = chain_keys("m", [b"B".as_slice(), b"A"]);
    assert_ne!(ab[1], ba[1]);
    let c1 = canon(&chat("m", &[("user", "A"), ("user", "B")]));
    let c2 = canon(&chat("m", &[("user", "B"), ("user", "A")]));
    assert_ne!(c1.chain_keys()[1], c2.chain_keys()[1]);
}

#[test]
fn repeated_block_does_not_cancel() {
    let a = chain_keys("m", [b"A".as_slice()]);
    let abb = chain_keys("m", [b"A".as_slice(), b"B", b"B"]);
    assert_eq!(a[0], abb[0]);
    assert_ne!(abb[2], a[0]);
    assert_ne!(abb[2], [0; 8]);
    let aa = chain_keys("m", [b"A".as_slice(), b"A"]);
    assert_ne!(aa[1], [0; 8]);
}

#[test]
fn naive_xor_chain_would_fail_these_tests() {
    // Shows the tests above can fail: Higress-style XOR without the position is order-blind
    // and self-cancelling.
    let naive = |blocks: &[&[u8]]| {
        let mut acc = [0u8; 8];
        for b in blocks {
            let h = {
                use sha1::{Digest, Sha1};
                let out: [u8; 20] = Sha1::digest(b).into();
                out
            };
            acc.iter_mut().zip(h).for_each(|(a, x)| *a ^= x);
        }
        acc
    };
    assert_eq!(naive(&[b"A", b"B"]), naive(&[b"B", b"A"]));
    assert_eq!(naive(&[b"A", b"B", b"B"]), naive(&[b"A"]));
}

#[test]
fn model_salts_the_chain() {
    let body = |m| chat(m, &[("system", "sys"), ("user", "q")]);
    let a = canon(&body("llama-3-8b")).chain_keys();
    let b = canon(&body("llama-3-70b")).chain_keys();
    let none =
        canon(r#"{"messages":[{"role":"system","content":"sys"},{"role":"user","content":"q"}]}"#);
    assert_eq!(none.model, "");
    assert!(a.iter().zip(&b).all(|(x, y)| x != y));
    assert!(a.iter().zip(none.chain_keys()).all(|(x, y)| *x != y));
    // Length prefix: ("ab", block) and ("a", "b" ‖ block) frame differently.
    assert_ne!(block_hash("ab", 0, b"X"), block_hash("a", 0, b"bX"));
}

#[test]
fn chain_accepts_vecs_slices_and_iterators() {
    let owned = vec![b"A".to_vec(), b"B".to_vec()];
    let c = canon(&chat("m", &[("user", "A")]));
    assert_eq!(
        chain_keys("m", &owned),
        chain_keys("m", owned.iter().map(Vec::as_slice))
    );
    assert_eq!(c.chain_keys(), chain_keys("m", blocks(&c)));
    assert!(chain_keys("m", Vec::<Vec<u8>>::new()).is_empty());
}

// ---------------------------------------------------------------- prefix properties

#[test]
fn extension_property_chat_turns() {
    let mut msgs = vec![("system", "You are terse."), ("user", "Q1")];
    let mut prev = canon(&chat("m", &msgs)).chain_keys();
    for (reply, next) in [("A1", "Q2"), ("A2", "Q3"), ("A3", "Q4")] {
        msgs.push(("assistant", reply));
        msgs.push(("user", next));
        let keys = canon(&chat("m", &msgs)).chain_keys();
        assert_eq!(keys.len(), prev.len() + 2);
        assert_eq!(&keys[..prev.len()], prev.as_slice());
        prev = keys;
    }
}

#[test]
fn extension_property_every_fixture_shape() {
    // Turn n+1 = turn n + assistant reply + new user message, for each chat-like API.
    let turn = |fixture: &str, field: &str, extra: Value| {
        let mut v: Value = serde_json::from_str(fixture).unwrap();
        let arr = v[field].as_array_mut().unwrap();
        arr.extend(extra.as_array().unwrap().iter().cloned());
        canon(&v.to_string()).chain_keys()
    };
    let cases = [
        (
            CHAT_TOOLS,
            "messages",
            json!([{"role":"assistant","content":"Yes."},{"role":"user","content":"And Paris?"}]),
        ),
        (
            ANTHROPIC,
            "messages",
            json!([{"role":"assistant","content":[{"type":"text","text":"It shows a graph."}]},{"role":"user","content":"ok"}]),
        ),
        (
            RESPONSES,
            "input",
            json!([{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Done."}]},{"role":"user","content":"Thanks"}]),
        ),
    ];
    for (fixture, field, extra) in cases {
        let short = canon(fixture).chain_keys();
        let long = turn(fixture, field, extra);
        assert_eq!(long.len(), short.len() + 2, "{field}");
        assert_eq!(&long[..short.len()], short.as_slice(), "{field}");
    }
    // also when every message is cut into many small pieces
    let tiny = CanonConfig {
        chunk_bytes: 8,
        ..CanonConfig::default()
    };
    let mut msgs = vec![
        ("system", "You are terse and precise."),
        ("user", "First question, fairly long"),
    ];
    let short = canon_with(&chat("m", &msgs), &tiny).chain_keys();
    msgs.extend([("assistant", "An answer of some length"), ("user", "Next")]);
    let long = canon_with(&chat("m", &msgs), &tiny).chain_keys();
    assert!(short.len() > 6 && long.len() > short.len());
    assert_eq!(&long[..short.len()], short.as_slice());
}

#[test]
fn shared_system_prompt_is_a_shared_first_block() {
    let sys = "You are the ACME support bot. Policies: refunds within 30 days; be polite.";
    let a = canon(&chat(
        "m",
        &[("system", sys), ("user", "Where is my order?")],
    ));
    let b = canon(&chat(
        "m",
        &[("system", sys), ("user", "How do I get a refund?")],
    ));
    let (ka, kb) = (a.chain_keys(), b.chain_keys());
    assert_eq!(ka[0], kb[0]);
    assert_ne!(ka[1], kb[1]);
    // Same for Anthropic's top-level system and Responses' instructions.
    let an = |q: &str| {
        canon(
            &json!({"model":"m","system":sys,"messages":[{"role":"user","content":q}]}).to_string(),
        )
    };
    let rs = |q: &str| canon(&json!({"model":"m","instructions":sys,"input":q}).to_string());
    assert_eq!(an("a").chain_keys()[0], an("b").chain_keys()[0]);
    assert_eq!(rs("a").chain_keys()[0], rs("b").chain_keys()[0]);
    // The system message encodes identically in all three dialects (cross-API sharing).
    assert_eq!(blocks(&a)[0], blocks(&an("x"))[0]);
    assert_eq!(blocks(&a)[0], blocks(&rs("x"))[0]);
}

#[test]
fn tools_are_a_shared_first_block() {
    let mut v: Value = serde_json::from_str(CHAT_TOOLS).unwrap();
    let c1 = canon(&v.to_string());
    v["messages"] = json!([{"role": "user", "content": "Something else entirely"}]);
    let c2 = canon(&v.to_string());
    assert_eq!(blocks(&c1)[0][0], KIND_TOOLS);
    assert_eq!(blocks(&c1)[0], blocks(&c2)[0]);
    assert_eq!(c1.chain_keys()[0], c2.chain_keys()[0]);
    assert_ne!(c1.chain_keys()[1], c2.chain_keys()[1]);
    // Different tool list → different first block; no tools / empty tools → no tools block.
    v["tools"] = json!([{"type": "function", "function": {"name": "other"}}]);
    assert_ne!(blocks(&canon(&v.to_string()))[0], blocks(&c2)[0]);
    v["tools"] = json!([]);
    assert_eq!(blocks(&canon(&v.to_string()))[0][0], KIND_MESSAGE);
    // Anthropic cache_control on the last tool does not change the block.
    let mut a: Value = serde_json::from_str(ANTHROPIC).unwrap();
    let with = blocks(&canon(&a.to_string()))[0].clone();
    a["tools"][1]
        .as_object_mut()
        .unwrap()
        .remove("cache_control");
    assert_eq!(blocks(&canon(&a.to_string()))[0], with);
}

#[test]
fn key_order_and_whitespace_do_not_matter() {
    let mut rng = Rng(7);
    for fixture in ALL_FIXTURES {
        let want = canon(fixture);
        let v: Value = serde_json::from_str(fixture).unwrap();
        for _ in 0..50 {
            let mut s = String::new();
            reformat(&v, &mut rng, &mut s);
            assert_eq!(canon(&s), want, "{s}");
        }
    }
}

#[test]
fn string_content_equals_single_text_part() {
    let a = canon(r#"{"messages":[{"role":"user","content":"hi"}]}"#);
    let b = canon(r#"{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#);
    let c = canon(
        r#"{"messages":[{"role":"user","content":[{"text":"hi","type":"text","cache_control":{"type":"ephemeral"}}]}]}"#,
    );
    assert_eq!(blocks(&a), blocks(&b));
    assert_eq!(blocks(&a), blocks(&c));
    // but two parts are not one
    let d = canon(
        r#"{"messages":[{"role":"user","content":[{"type":"text","text":"h"},{"type":"text","text":"i"}]}]}"#,
    );
    assert_ne!(blocks(&a), blocks(&d));
}

#[test]
fn no_concatenation_collisions() {
    // Each pair is logically different but would collide under naive concatenation.
    let pairs = [
        (chat("m", &[("user", "ab")]), chat("m", &[("usera", "b")])),
        (
            chat("m", &[("user", "a"), ("user", "b")]),
            chat("m", &[("user", "a\u{0}\u{0}Mruser\u{0}\u{0}tb")]),
        ),
        (
            chat("m", &[("user", "x\u{0}\u{0}ty")]),
            r#"{"model":"m","messages":[{"role":"user","content":["x","y"]}]}"#.to_owned(),
        ),
        (
            r#"{"messages":[{"role":"user","name":"a","content":"b"}]}"#.to_owned(),
            r#"{"messages":[{"role":"user","content":"ab"}]}"#.to_owned(),
        ),
        (
            r#"{"prompt":"hi"}"#.to_owned(),
            r#"{"messages":[{"role":"user","content":"hi"}]}"#.to_owned(),
        ),
        (
            r#"{"prompt":["a","b"]}"#.to_owned(),
            r#"{"prompt":"ab"}"#.to_owned(),
        ),
    ];
    for (x, y) in pairs {
        let (cx, cy) = (canon(&x), canon(&y));
        assert_ne!(blocks(&cx), blocks(&cy), "{x} vs {y}");
        assert_ne!(cx.chain_keys().last(), cy.chain_keys().last(), "{x} vs {y}");
    }
    // A NUL inside text is escaped and decodes back.
    let c = canon(&chat("m", &[("user", "a\u{0}b")]));
    assert_eq!(
        fields(&items(&c)[0].1),
        vec![f('r', "user"), f('t', "a\u{0}b")]
    );
}

// ---------------------------------------------------------------- API shapes

#[test]
fn chat_with_tools_and_tool_call_turns() {
    let c = canon(CHAT_TOOLS);
    assert_eq!(c.api, Api::ChatCompletions);
    assert_eq!(c.model, "qwen2.5-7b-instruct");
    assert!(!c.capped);
    let it = items(&c);
    assert_eq!(it.len(), 8); // tools + 7 messages
    assert_eq!(it[0].0, KIND_TOOLS);
    let tools = fields(&it[0].1);
    assert_eq!(tools.len(), 2);
    assert!(tools[0]
        .1
        .starts_with(r#"{"function":{"description":"Get the current weather"#));
    // assistant turn without content: role + two tool calls, args canonical, ids not hashed
    assert_eq!(
        fields(&it[3].1),
        vec![
            f('r', "assistant"),
            f('c', "get_weather"),
            f('a', r#"{"city":"Paris","unit":"celsius"}"#),
            f('c', "get_weather"),
            f('a', r#"{"city":"Berlin"}"#),
        ]
    );
    assert_eq!(
        fields(&it[4].1),
        vec![
            f('r', "tool"),
            f('i', "call_a1"),
            f('t', r#"{"temp": 18, "sky": "cloudy"}"#)
        ]
    );
    assert_eq!(fields(&it[7].1)[..2], [f('r', "user"), f('n', "alice")]);
}

#[test]
fn tool_call_arguments_are_canonical_json() {
    let body = |args: &str| {
        json!({"messages":[{"role":"assistant","tool_calls":[{"id":"x","type":"function","function":{"name":"f","arguments":args}}]}]})
            .to_string()
    };
    let a = canon(&body(r#"{"b": [1, 2.5, {"y":1,"x":2}], "a": null}"#));
    let b = canon(&body("{\n  \"a\":null,\"b\":[1,2.5,{\"x\":2,\"y\":1}]}"));
    assert_eq!(blocks(&a), blocks(&b));
    // object-valued arguments (some clients) equal the string form
    let obj = json!({"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":{"a":null,"b":[1,2.5,{"x":2,"y":1}]}}}]}]});
    assert_eq!(blocks(&canon(&obj.to_string())), blocks(&a));
    // unparsable arguments are hashed verbatim; legacy function_call and custom tool calls work
    let raw = canon(&body("{not json"));
    assert_eq!(fields(&items(&raw)[0].1)[2], f('a', "{not json"));
    let legacy = canon(
        r#"{"messages":[{"role":"assistant","content":null,"function_call":{"name":"f","arguments":"{}"}}]}"#,
    );
    assert_eq!(
        fields(&items(&legacy)[0].1),
        vec![f('r', "assistant"), f('c', "f"), f('a', "{}")]
    );
    let custom = canon(
        r#"{"messages":[{"role":"assistant","tool_calls":[{"id":"c1","type":"custom","custom":{"name":"g","input":"x"}}]}]}"#,
    );
    assert_eq!(
        fields(&items(&custom)[0].1)[1],
        f(
            'u',
            r#"{"custom":{"input":"x","name":"g"},"type":"custom"}"#
        )
    );
}

#[test]
fn chat_multimodal_parts() {
    let c = canon(CHAT_MULTIMODAL);
    assert_eq!(c.api, Api::ChatCompletions);
    let it = items(&c);
    assert_eq!(it.len(), 2);
    assert_eq!(
        fields(&it[0].1),
        vec![f('r', "system"), f('t', "Describe images precisely.")]
    );
    let user = fields(&it[1].1);
    assert_eq!(user[1], f('t', "What is in this picture?"));
    assert_eq!(user[2].0, 'j');
    assert!(user[2]
        .1
        .starts_with(r#"{"image_url":{"detail":"low","url":"data:image/png;base64,"#));
    assert!(user[3].1.starts_with(r#"{"input_audio":{"data":"#));
    // a different image → different block
    let other = CHAT_MULTIMODAL.replace("\"detail\": \"low\"", "\"detail\": \"high\"");
    assert_ne!(blocks(&canon(&other))[1], blocks(&c)[1]);
}

#[test]
fn completions_shapes() {
    let s = canon(COMPLETIONS_STR);
    assert_eq!(s.api, Api::Completions);
    assert_eq!(blocks(&s), vec![b"PtOnce upon a time\0\0".to_vec()]);
    let batch = canon(COMPLETIONS_BATCH);
    assert_eq!(batch.len(), 2);
    assert_eq!(fields(&items(&batch)[1].1), vec![f('t', "Translate: dog")]);
    let tokens = canon(COMPLETIONS_TOKENS);
    assert_eq!(tokens.len(), 1);
    let b = &blocks(&tokens)[0];
    assert_eq!(&b[..2], b"Pk");
    // token 1 = 01 00 00 00 → 01 00FF 00FF 00FF
    assert_eq!(&b[2..9], &[1, 0, 0xff, 0, 0xff, 0, 0xff]);
    let tb = canon(COMPLETIONS_TOKEN_BATCH).chain_keys();
    assert_eq!(tb.len(), 2);
    let first_only = canon(r#"{"model":"llama-3-8b","prompt":[[1,2,3]]}"#).chain_keys();
    assert_eq!(tb[0], first_only[0]);
}

#[test]
fn responses_shapes() {
    let c = canon(RESPONSES);
    assert_eq!(c.api, Api::Responses);
    let it = items(&c);
    assert_eq!(it.len(), 8); // tools, instructions, 6 input items
    assert_eq!(it[0].0, KIND_TOOLS);
    assert_eq!(
        fields(&it[1].1),
        vec![
            f('r', "system"),
            f(
                't',
                "You are a coding assistant. Prefer small, tested changes."
            )
        ]
    );
    assert_eq!(
        fields(&it[2].1),
        vec![f('r', "user"), f('t', "Fix the failing test in parser.rs")]
    );
    assert_eq!(fields(&it[3].1)[0].0, 'j'); // reasoning item, opaque
    assert_eq!(
        fields(&it[4].1),
        vec![
            f('r', "assistant"),
            f('c', "run_tests"),
            f('a', r#"{"filter":"parser"}"#)
        ]
    );
    assert_eq!(
        fields(&it[5].1),
        vec![
            f('r', "tool"),
            f('i', "call_9"),
            f('t', "1 failed: parser::tests::empty_input")
        ]
    );
    assert_eq!(fields(&it[7].1)[1], f('t', "Go ahead."));
    assert_eq!(fields(&it[7].1)[2].0, 'j');
    // string input, instructions only
    let s = canon(r#"{"model":"m","input":"hello"}"#);
    assert_eq!(
        fields(&items(&s)[0].1),
        vec![f('r', "user"), f('t', "hello")]
    );
    assert_eq!(canon(r#"{"instructions":"be brief"}"#).len(), 1);
    // a Responses user string equals a chat user message (same logical content)
    assert_eq!(blocks(&s), blocks(&canon(&chat("m", &[("user", "hello")]))));
}

#[test]
fn anthropic_shapes() {
    let c = canon(ANTHROPIC);
    assert_eq!(c.api, Api::AnthropicMessages);
    let it = items(&c);
    assert_eq!(it.len(), 5); // tools, system, 3 messages
    assert_eq!(
        fields(&it[1].1),
        vec![
            f('r', "system"),
            f('t', "You are Claude Code, a coding agent."),
            f('t', "Repository: ai-load-balancer (Rust).")
        ]
    );
    assert_eq!(
        fields(&it[3].1),
        vec![
            f('r', "assistant"),
            f('t', "Let me read it."),
            f('c', "read_file"),
            f('a', r#"{"path":"src/lib.rs"}"#)
        ]
    );
    let user = fields(&it[4].1);
    assert_eq!(
        user[..4],
        [
            f('r', "user"),
            f('R', "toolu_01"),
            f('t', "pub mod prefix;"),
            f('E', "")
        ]
    );
    assert_eq!(user[4].0, 'j');
    assert!(!user[4].1.contains("cache_control"));
    assert_eq!(user[5], f('t', "Also, what does this diagram show?"));
    // no top-level system but Anthropic-only blocks → still detected
    let t = canon(
        r#"{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"n","input":{}}]}]}"#,
    );
    assert_eq!(t.api, Api::AnthropicMessages);
    // cache_control moving to the last message does not change earlier blocks
    let mut v: Value = serde_json::from_str(ANTHROPIC).unwrap();
    v["system"][1]
        .as_object_mut()
        .unwrap()
        .remove("cache_control");
    assert_eq!(canon(&v.to_string()), c);
}

#[test]
fn shape_precedence() {
    // messages > input/instructions > prompt
    let c = canon(r#"{"prompt":"p","input":"i","messages":[{"role":"user","content":"m"}]}"#);
    assert_eq!(c.api, Api::ChatCompletions);
    assert_eq!(canon(r#"{"prompt":"p","input":"i"}"#).api, Api::Responses);
    assert_eq!(
        canon(r#"{"prompt":"p","instructions":"i"}"#).api,
        Api::Responses
    );
    // duplicate top-level keys: last wins (as serde_json::Value would)
    let d = canon(r#"{"model":"a","model":"b","prompt":"x"}"#);
    assert_eq!(d.model, "b");
}

// ---------------------------------------------------------------- chunking and caps

#[test]
fn chunking_splits_long_content_deterministically() {
    let text = "0123456789".repeat(1000); // 10,000 bytes
    let body = chat("m", &[("user", &text)]);
    let cfg = CanonConfig {
        chunk_bytes: 1024,
        ..CanonConfig::default()
    };
    let c = canon_with(&body, &cfg);
    // stream = r user 00 00 (7) + t text 00 00 (10,003) = 10,010 bytes → 10 pieces
    assert_eq!(c.len(), 10);
    let bs = blocks(&c);
    assert_eq!(bs[0][0], KIND_MESSAGE);
    assert!(bs[1..].iter().all(|b| b[0] == KIND_CONTINUATION));
    assert!(bs[..9].iter().all(|b| b.len() == 1025));
    assert_eq!(bs[9].len(), 1 + 10_010 - 9 * 1024);
    assert_eq!(canon_with(&body, &cfg), c);
    // joined pieces == the unchunked stream
    assert_eq!(items(&c), items(&canon_with(&body, &no_chunks())));
    assert_eq!(canon_with(&body, &no_chunks()).len(), 1);
    // exactly chunk_bytes long → one block
    let exact = chat("m", &[("user", &"x".repeat(1024 - 10))]);
    assert_eq!(canon_with(&exact, &cfg).len(), 1);
}

#[test]
fn shared_long_document_prefix_shares_chunk_keys() {
    let doc: String = (0..400)
        .map(|i| format!("Clause {i}: the party shall comply. "))
        .collect();
    let cfg = CanonConfig {
        chunk_bytes: 512,
        ..CanonConfig::default()
    };
    let sys = "You review contracts.";
    let a = canon_with(
        &chat(
            "m",
            &[
                ("system", sys),
                ("user", &format!("{doc}\n\nQuestion: is clause 7 fair?")),
            ],
        ),
        &cfg,
    );
    let b = canon_with(
        &chat(
            "m",
            &[
                ("system", sys),
                ("user", &format!("{doc}\n\nQuestion: summarise.")),
            ],
        ),
        &cfg,
    );
    let (ka, kb) = (a.chain_keys(), b.chain_keys());
    // system block + every piece that lies entirely inside "r user 00 00 t <doc>"
    let shared = 1 + (7 + 1 + doc.len()) / 512;
    assert!(shared > 20);
    assert_eq!(ka[..shared], kb[..shared]);
    assert_ne!(ka[shared], kb[shared]);
    // without chunking the whole message is one block and nothing past the system prompt matches
    let (na, nb) = (
        canon_with(
            &chat("m", &[("system", sys), ("user", &format!("{doc}q1"))]),
            &no_chunks(),
        )
        .chain_keys(),
        canon_with(
            &chat("m", &[("system", sys), ("user", &format!("{doc}q2"))]),
            &no_chunks(),
        )
        .chain_keys(),
    );
    assert_eq!(na[0], nb[0]);
    assert_ne!(na[1], nb[1]);
}

#[test]
fn ten_thousand_messages_are_capped_and_fast() {
    let msgs: Vec<Value> = (0..10_000)
        .map(|i| json!({"role": if i % 2 == 0 {"user"} else {"assistant"}, "content": format!("message number {i}")}))
        .collect();
    let body = json!({"model": "m", "messages": msgs}).to_string();
    let cfg = CanonConfig::default();
    let start = Instant::now();
    let c = canon_with(&body, &cfg);
    let keys = c.chain_keys();
    let took = start.elapsed();
    assert!(c.capped);
    assert_eq!(c.len(), cfg.max_blocks);
    assert_eq!(keys.len(), cfg.max_blocks);
    // the kept blocks are exactly the first messages
    let first = canon(&chat(
        "m",
        &[
            ("user", "message number 0"),
            ("assistant", "message number 1"),
        ],
    ))
    .chain_keys();
    assert_eq!(keys[..2], first[..]);
    // ~600 KB body; generous bound for unoptimised test builds
    assert!(took < Duration::from_secs(2), "{took:?}");
    // under the cap: not capped
    assert!(!canon(CHAT_TOOLS).capped);
}

#[test]
fn cap_applies_to_chunks_tools_and_every_shape() {
    let cfg = CanonConfig {
        chunk_bytes: 16,
        max_blocks: 3,
        ..CanonConfig::default()
    };
    let long = canon_with(&chat("m", &[("user", &"y".repeat(200))]), &cfg);
    assert_eq!(long.len(), 3);
    assert!(long.capped);
    for fixture in [CHAT_TOOLS, RESPONSES, ANTHROPIC, COMPLETIONS_BATCH] {
        let c = canon_with(
            fixture,
            &CanonConfig {
                max_blocks: 1,
                ..CanonConfig::default()
            },
        );
        assert_eq!(c.len(), 1);
        assert!(c.capped);
        assert_eq!(c.chain_keys()[0], canon(fixture).chain_keys()[0]);
    }
    let exact = canon_with(
        COMPLETIONS_BATCH,
        &CanonConfig {
            max_blocks: 2,
            ..CanonConfig::default()
        },
    );
    assert!(!exact.capped);
    let zero = canon_with(
        COMPLETIONS_STR,
        &CanonConfig {
            max_blocks: 0,
            ..CanonConfig::default()
        },
    );
    assert!(zero.is_empty() && zero.capped);
}

// ---------------------------------------------------------------- errors

#[test]
fn malformed_bodies_give_the_right_error() {
    use CanonError as E;
    let wt = |path: &str, expected: &'static str, found: &'static str| E::WrongType {
        path: path.into(),
        expected,
        found,
    };
    let cases: Vec<(&str, E)> = vec![
        ("", E::NotJson(String::new())),
        ("{\"messages\": [", E::NotJson(String::new())),
        ("{} trailing", E::NotJson(String::new())),
        ("{\"prompt\":\"\u{0}\"}", E::NotJson(String::new())),
        ("[1,2]", E::NotObject { found: "array" }),
        ("\"hi\"", E::NotObject { found: "string" }),
        ("null", E::NotObject { found: "null" }),
        ("{}", E::NoPrompt),
        (r#"{"model":"m","temperature":1}"#, E::NoPrompt),
        (r#"{"input":null}"#, E::NoPrompt),
        (r#"{"messages":[]}"#, E::Empty { field: "messages" }),
        (r#"{"input":[]}"#, E::Empty { field: "input" }),
        (r#"{"prompt":[]}"#, E::Empty { field: "prompt" }),
        (r#"{"messages":{}}"#, wt("messages", "an array", "object")),
        (r#"{"messages":"hi"}"#, wt("messages", "an array", "string")),
        (r#"{"messages":null}"#, wt("messages", "an array", "null")),
        (
            r#"{"model":7,"prompt":"x"}"#,
            wt("model", "a string", "number"),
        ),
        (
            r#"{"messages":[1]}"#,
            wt("messages[0]", "an object", "number"),
        ),
        (
            r#"{"messages":[{"content":"x"}]}"#,
            E::MissingField {
                path: "messages[0].role".into(),
            },
        ),
        (
            r#"{"messages":[{"role":1}]}"#,
            wt("messages[0].role", "a string", "number"),
        ),
        (
            r#"{"messages":[{"role":"user","content":5}]}"#,
            wt(
                "messages[0].content",
                "a string, an array or null",
                "number",
            ),
        ),
        (
            r#"{"messages":[{"role":"user","content":[{"type":"text","text":1}]}]}"#,
            wt("messages[0].content[0].text", "a string", "number"),
        ),
        (
            r#"{"messages":[{"role":"user","content":[{"type":"text"}]}]}"#,
            E::MissingField {
                path: "messages[0].content[0].text".into(),
            },
        ),
        (
            r#"{"messages":[{"role":"user","content":[true]}]}"#,
            wt("messages[0].content[0]", "an object or a string", "boolean"),
        ),
        (
            r#"{"messages":[{"role":"a","tool_calls":{}}]}"#,
            wt("messages[0].tool_calls", "an array", "object"),
        ),
        (
            r#"{"messages":[{"role":"a","tool_calls":[{"function":{"arguments":"{}"}}]}]}"#,
            E::MissingField {
                path: "messages[0].tool_calls[0].function.name".into(),
            },
        ),
        (
            r#"{"messages":[{"role":"a","name":[]}]}"#,
            wt("messages[0].name", "a string", "array"),
        ),
        (
            r#"{"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":null}]}]}]}"#,
            wt("messages[0].content[0].content[0].text", "a string", "null"),
        ),
        (
            r#"{"system":3,"messages":[{"role":"user","content":"x"}]}"#,
            wt("system", "a string, an array or null", "number"),
        ),
        (
            r#"{"tools":{},"messages":[{"role":"user","content":"x"}]}"#,
            wt("tools", "an array", "object"),
        ),
        (
            r#"{"tools":["x"],"messages":[{"role":"user","content":"x"}]}"#,
            wt("tools[0]", "an object", "string"),
        ),
        (
            r#"{"prompt":5}"#,
            wt("prompt", "a string or an array", "number"),
        ),
        (
            r#"{"prompt":[1,-2]}"#,
            wt("prompt[1]", "a token id (0..2^32)", "number"),
        ),
        (
            r#"{"prompt":[1,4294967296]}"#,
            wt("prompt[1]", "a token id (0..2^32)", "number"),
        ),
        (
            r#"{"prompt":[1.5]}"#,
            wt("prompt[0]", "a token id (0..2^32)", "number"),
        ),
        (
            r#"{"prompt":["a",1]}"#,
            wt("prompt[1]", "a string or a token array", "number"),
        ),
        (
            r#"{"prompt":[[1],["a"]]}"#,
            wt("prompt[1][0]", "a token id (0..2^32)", "string"),
        ),
        (
            r#"{"input":5}"#,
            wt("input", "a string or an array", "number"),
        ),
        (
            r#"{"input":[3]}"#,
            wt("input[0]", "an object or a string", "number"),
        ),
        (
            r#"{"instructions":[]}"#,
            wt("instructions", "a string", "array"),
        ),
        (
            r#"{"input":[{"type":"function_call","arguments":"{}"}]}"#,
            E::MissingField {
                path: "input[0].name".into(),
            },
        ),
        (
            r#"{"input":[{"type":"function_call_output","output":"x"}]}"#,
            E::MissingField {
                path: "input[0].call_id".into(),
            },
        ),
    ];
    for (body, want) in cases {
        let got = err(body);
        match (&got, &want) {
            (E::NotJson(_), E::NotJson(_)) => {}
            _ => assert_eq!(got, want, "body: {body}"),
        }
        assert!(!got.to_string().is_empty());
    }
    let big = format!(r#"{{"prompt":"{}"}}"#, "x".repeat(100));
    let small = CanonConfig {
        max_body_bytes: 64,
        ..CanonConfig::default()
    };
    assert_eq!(
        canonicalize(big.as_bytes(), &small),
        Err(E::TooLarge {
            len: big.len(),
            max: 64
        })
    );
    let unlimited = CanonConfig {
        max_body_bytes: 0,
        ..CanonConfig::default()
    };
    assert!(canonicalize(big.as_bytes(), &unlimited).is_ok());
}

#[test]
fn error_messages_name_the_problem() {
    let e = err(
        r#"{"messages":[{"role":"user"},{"role":"user","content":[{"type":"text","text":1}]}]}"#,
    );
    assert_eq!(
        e.to_string(),
        "`messages[1].content[0].text` must be a string, found number"
    );
    assert_eq!(
        err("{").to_string(),
        "request body is not valid JSON: EOF while parsing an object at line 1 column 1"
    );
    assert_eq!(
        err(r#"{"messages":[]}"#).to_string(),
        "`messages` must not be empty"
    );
    // too deep nesting is a JSON error, not a stack overflow
    let deep = format!(
        r#"{{"messages":[{{"role":"user","content":[{{"type":"x","y":{}1{}}}]}}]}}"#,
        "[".repeat(5000),
        "]".repeat(5000)
    );
    assert!(matches!(err(&deep), CanonError::NotJson(_)));
}

// ---------------------------------------------------------------- fuzz

#[test]
fn fuzz_random_bytes_and_mutations_never_panic() {
    let mut rng = Rng(0x5eed);
    let cfgs = [
        CanonConfig::default(),
        CanonConfig {
            chunk_bytes: 7,
            max_blocks: 5,
            max_body_bytes: 0,
        },
        CanonConfig {
            chunk_bytes: 1,
            max_blocks: 1000,
            max_body_bytes: 1 << 20,
        },
    ];
    let check = |body: &[u8], cfg: &CanonConfig| {
        if let Ok(c) = canonicalize(body, cfg) {
            assert!(c.len() <= cfg.max_blocks);
            assert_eq!(c.chain_keys().len(), c.len());
            assert!(c.blocks().all(|b| !b.is_empty()));
            assert_eq!(canonicalize(body, cfg), Ok(c)); // deterministic
        }
    };
    // 1. random bytes (biased towards JSON punctuation)
    let alphabet =
        b"{}[]\":,0123456789.-eE truefalsnl\\u\n\x00\xff\xc3\xa9abcmessagesrolecontentprompt";
    for i in 0..3000 {
        let len = rng.below(200);
        let body: Vec<u8> = (0..len)
            .map(|_| {
                if rng.below(4) == 0 {
                    rng.next() as u8
                } else {
                    alphabet[rng.below(alphabet.len())]
                }
            })
            .collect();
        check(&body, &cfgs[i % cfgs.len()]);
    }
    // 2. byte-level mutations of realistic bodies
    for i in 0..3000 {
        let mut body = ALL_FIXTURES[rng.below(ALL_FIXTURES.len())]
            .as_bytes()
            .to_vec();
        for _ in 0..=rng.below(4) {
            let pos = rng.below(body.len() + 1);
            match rng.below(4) {
                0 if pos < body.len() => body[pos] = rng.next() as u8,
                1 => body.truncate(pos),
                2 => body.insert(pos, alphabet[rng.below(alphabet.len())]),
                _ => {
                    let end = (pos + rng.below(30)).min(body.len());
                    body.drain(pos..end);
                }
            }
        }
        check(&body, &cfgs[i % cfgs.len()]);
    }
    // 3. structural mutations: replace random nodes with random JSON of any type
    let mut ok = 0;
    for i in 0..3000 {
        let mut v: Value =
            serde_json::from_str(ALL_FIXTURES[rng.below(ALL_FIXTURES.len())]).unwrap();
        for _ in 0..=rng.below(3) {
            mutate(&mut v, &mut rng);
        }
        let body = v.to_string();
        check(body.as_bytes(), &cfgs[i % cfgs.len()]);
        ok += usize::from(canonicalize(body.as_bytes(), &cfgs[0]).is_ok());
    }
    // the mutations must exercise both outcomes
    assert!(ok > 300 && ok < 2900, "ok={ok}");
}

// ---------------------------------------------------------------- helpers

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut r = crate::hash::SplitMix64(self.0);
        let v = r.next_u64();
        self.0 = r.0;
        v
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// Serialises `v` with shuffled keys, random whitespace and random (valid) string escapes.
fn reformat(v: &Value, rng: &mut Rng, out: &mut String) {
    let ws = |rng: &mut Rng, out: &mut String| {
        for _ in 0..rng.below(3) {
            out.push([' ', '\n', '\t', '\r'][rng.below(4)]);
        }
    };
    ws(rng, out);
    match v {
        Value::String(s) => {
            out.push('"');
            for ch in s.chars() {
                match ch {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '/' if rng.below(2) == 0 => out.push_str("\\/"),
                    c if (c as u32) < 0x20 || rng.below(8) == 0 => {
                        let mut buf = [0u16; 2];
                        for unit in c.encode_utf16(&mut buf) {
                            out.push_str(&format!("\\u{unit:04X}"));
                        }
                    }
                    c => out.push(c),
                }
            }
            out.push('"');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                reformat(item, rng, out);
            }
            ws(rng, out);
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            for i in (1..entries.len()).rev() {
                entries.swap(i, rng.below(i + 1));
            }
            out.push('{');
            for (i, (k, val)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                reformat(&Value::String(k.clone()), rng, out);
                ws(rng, out);
                out.push(':');
                reformat(val, rng, out);
            }
            ws(rng, out);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
    ws(rng, out);
}

fn random_value(rng: &mut Rng, depth: usize) -> Value {
    match rng.below(if depth > 2 { 5 } else { 8 }) {
        0 => Value::Null,
        1 => Value::Bool(rng.below(2) == 0),
        2 => json!(rng.next() as i64),
        3 => json!((rng.next() % 1000) as f64 / 7.0),
        4 => Value::String(
            [
                "",
                "user",
                "text",
                "tool_use",
                "function_call",
                "x\u{0}y",
                "é",
            ][rng.below(7)]
            .into(),
        ),
        5 => Value::Array(
            (0..rng.below(4))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => {
            let keys = [
                "role",
                "content",
                "type",
                "text",
                "name",
                "arguments",
                "function",
                "tool_calls",
                "input",
                "source",
            ];
            Value::Object(
                (0..rng.below(4))
                    .map(|_| {
                        (
                            keys[rng.below(keys.len())].to_owned(),
                            random_value(rng, depth + 1),
                        )
                    })
                    .collect(),
            )
        }
    }
}

fn mutate(v: &mut Value, rng: &mut Rng) {
    let descend = rng.below(10) < 8;
    match v {
        Value::Array(items) if descend && !items.is_empty() => {
            let i = rng.below(items.len());
            mutate(&mut items[i], rng);
        }
        Value::Object(map) if descend && !map.is_empty() => {
            let key = map.keys().nth(rng.below(map.len())).cloned().unwrap();
            if rng.below(10) == 0 {
                map.remove(&key);
            } else {
                mutate(map.get_mut(&key).unwrap(), rng);
            }
        }
        _ => *v = random_value(rng, 0),
    }
}
