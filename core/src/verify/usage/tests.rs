//! The usage scanner on engines' reports: both OpenAI spellings, Anthropic's, streams, garbage.

use super::*;

fn usage(p: u64, c: u64) -> Option<Usage> {
    Some(Usage {
        prompt_tokens: p,
        cached_tokens: c,
    })
}

#[test]
fn reads_both_spellings_and_the_last_report() {
    let chat = br#"{"choices":[{"index":0}],"usage":{"prompt_tokens":120,"completion_tokens":5,"total_tokens":125,"prompt_tokens_details":{"cached_tokens":96}}}"#;
    assert_eq!(scan(chat), usage(120, 96));
    let responses = br#"{"usage":{"input_tokens":300,"input_tokens_details":{"cached_tokens":256},"output_tokens":9,"output_tokens_details":{"reasoning_tokens":0}}}"#;
    assert_eq!(scan(responses), usage(300, 256));
    let spaced = b"{\"usage\": {\"prompt_tokens\" : 7,\n \"prompt_tokens_details\": { \"cached_tokens\" :\t4 }}}";
    assert_eq!(scan(spaced), usage(7, 4));
    let two = br#"data: {"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":1}}}

data: {"usage":{"prompt_tokens":20,"prompt_tokens_details":{"cached_tokens":16}}}

data: [DONE]

"#;
    assert_eq!(scan(two), usage(20, 16), "the stream's last report");
}

#[test]
fn absent_garbage_and_huge_values_verify_nothing() {
    for body in [
            &b""[..],
            br#"{"usage":{"prompt_tokens":12,"completion_tokens":3}}"#,
            br#"{"usage":{"prompt_tokens":12,"prompt_tokens_details":null}}"#,
            br#"{"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":"8"}}}"#,
            br#"{"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":-8}}}"#,
            br#"{"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":8.5}}}"#,
            br#"{"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":99}}}"#,
            br#"{"usage":{"prompt_tokens":99999999999999999999999,"prompt_tokens_details":{"cached_tokens":8}}}"#,
            br#"{"usage":{"prompt_tokens_details":{"cached_tokens":8}}}"#,
            br#"{"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens""#,
            b"\xff\xfe\"prompt_tokens_details\"\x00}",
        ] {
            assert_eq!(scan(body), None, "{}", String::from_utf8_lossy(body));
        }
}

#[test]
fn reads_anthropic_messages_usage() {
    // input_tokens excludes the tokens read from and written to the cache.
    let full = br#"{"id":"msg_1","type":"message","content":[{"type":"text","text":"{\"usage\": 1}"}],"usage":{"input_tokens":25,"cache_creation_input_tokens":10,"cache_read_input_tokens":1800,"cache_creation":{"ephemeral_5m_input_tokens":10,"ephemeral_1h_input_tokens":0},"output_tokens":503,"service_tier":"standard"}}"#;
    assert_eq!(scan(full), usage(1835, 1800));
    let no_creation = br#"{"usage":{"input_tokens":7,"cache_creation_input_tokens":null,"cache_read_input_tokens":64,"output_tokens":2}}"#;
    assert_eq!(scan(no_creation), usage(71, 64));
    let absent = br#"{"usage":{"cache_read_input_tokens":64,"input_tokens":7,"output_tokens":2}}"#;
    assert_eq!(scan(absent), usage(71, 64), "any member order");
    // A beta server's per-iteration usages repeat the names: the outer ones count.
    let nested = br#"{"usage":{"input_tokens":5,"cache_read_input_tokens":40,"iterations":[{"input_tokens":1,"cache_read_input_tokens":2}],"output_tokens":1}}"#;
    assert_eq!(scan(nested), usage(45, 40));
    for bad in [
        &br#"{"usage":{"input_tokens":5,"cache_read_input_tokens":null}}"#[..],
        br#"{"usage":{"cache_read_input_tokens":40,"output_tokens":1}}"#,
        br#"{"usage":{"input_tokens":5,"cache_read_input_tokens":40"#,
        br#"{"cache_read_input_tokens":40,"input_tokens":5}"#,
        br#"{"usage":{"input_tokens":5},"other":{"cache_read_input_tokens":40}}"#,
    ] {
        assert_eq!(scan(bad), None, "{}", String::from_utf8_lossy(bad));
    }
}

/// An Anthropic stream as its API sends it: the prompt's usage in `message_start`, the
/// output's in the last `message_delta` (cumulative, with the prompt's too from newer
/// servers).
#[test]
fn reads_an_anthropic_stream_from_its_first_or_last_event() {
    let start = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":30,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":2048,\"output_tokens\":1}}}\n\n";
    let delta = b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"more words\"}}\n\n";
    let end = b"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":700}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    let mut t = Tail::default();
    t.push(start);
    for _ in 0..200 {
        t.push(delta);
    }
    t.push(end);
    assert_eq!(
        t.usage(),
        usage(2078, 2048),
        "message_start, out of the tail"
    );
    let cumulative = b"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":30,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":1024,\"output_tokens\":700}}\n\n";
    t.push(cumulative);
    assert_eq!(t.usage(), usage(1054, 1024), "the last report wins");
    assert!(t.head.len() <= HEAD_BYTES);
}

#[test]
fn the_outcome_reads_prompt_and_output_with_or_without_cache_details() {
    let tokens = |body: &[u8]| {
        let mut t = Tail::default();
        t.push(body);
        t.tokens()
    };
    let t = |prompt, output, cached| Tokens {
        prompt,
        output,
        cached,
    };
    let chat = br#"{"usage":{"prompt_tokens":120,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":96}}}"#;
    assert_eq!(tokens(chat), t(Some(120), Some(5), Some(96)));
    let plain = br#"{"usage":{"prompt_tokens":12,"total_tokens":15,"completion_tokens":3}}"#;
    assert_eq!(tokens(plain), t(Some(12), Some(3), None));
    assert_eq!(tokens(plain).cache_report(), None, "nothing to verify");
    let responses = br#"{"usage":{"input_tokens":300,"output_tokens":9,"output_tokens_details":{"reasoning_tokens":0}}}"#;
    assert_eq!(tokens(responses), t(Some(300), Some(9), None));
    let anthropic = br#"{"usage":{"input_tokens":7,"cache_creation_input_tokens":null,"cache_read_input_tokens":64,"output_tokens":2}}"#;
    assert_eq!(tokens(anthropic), t(Some(71), Some(2), Some(64)));
    for garbage in [
        &b""[..],
        br#"{"usage":{"prompt_tokens":-1,"completion_tokens":"3"}}"#,
        br#"{"usage":{"prompt_tokens":99999999999999,"completion_tokens":3.5}}"#,
    ] {
        assert_eq!(tokens(garbage), Tokens::default(), "{garbage:?}");
    }
}

#[test]
fn an_anthropic_stream_gives_its_prompt_from_the_head_and_its_output_from_the_tail() {
    let mut t = Tail::default();
    t.push(b"data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":30,\"cache_read_input_tokens\":2048,\"output_tokens\":1}}}\n\n");
    t.push(&vec![b' '; 2 * TAIL_BYTES]);
    t.push(b"data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":700}}\n\n");
    assert_eq!(
        t.tokens(),
        Tokens {
            prompt: Some(2078),
            output: Some(700),
            cached: Some(2048)
        }
    );
}

#[test]
fn the_tail_keeps_the_end_across_chunks() {
    let mut t = Tail::default();
    t.push(&vec![b'x'; 10_000]);
    t.push(br#"{"usage":{"prompt_tokens":50,"#);
    t.push(br#""prompt_tokens_details":{"cached_tokens":32}}}"#);
    assert_eq!(t.usage(), usage(50, 32));
    assert!(
        t.buf.len() <= 2 * TAIL_BYTES,
        "held: at most twice the tail"
    );
    for _ in 0..100 {
        t.push(b"data: {\"choices\":[{\"delta\":{\"content\":\"more\"}}]}\n\n");
    }
    assert_eq!(t.usage(), None, "a report pushed out of the tail is gone");
    assert_eq!(t.tail().len(), TAIL_BYTES);
    assert!(t.buf.len() <= 2 * TAIL_BYTES);
}
