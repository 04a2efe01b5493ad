//! An answer's own `id`, read from the head of its body (the bounded head `usage::Tail` keeps):
//! a JSON answer's top-level `id` (a Responses answer's `resp_…`, a chat completion's
//! `chatcmpl-…`), or a stream's first event's: its top-level `id` (a chat chunk), else the `id`
//! of the object its `response` or `message` member holds (the Responses stream's
//! `response.created` carries `response.id`, Anthropic's `message_start` `message.id`). Pure;
//! what a holding does with it is its own (docs/sessions-and-queues.md "Agent sessions").

use crate::agents::MAX_RESPONSE_ID_BYTES;

/// The answer's id in `head`: the first JSON object in it (a JSON body, or a stream's first
/// `data:` event), read up to its end or the head's. None when there is none, it is not a
/// string of 1 to [`MAX_RESPONSE_ID_BYTES`] bytes, or the object is cut before it.
pub fn answer_id(head: &[u8]) -> Option<String> {
    let start = head.iter().position(|&b| b == b'{')?;
    let object = head.get(start..)?;
    let (mut depth, mut i) = (0usize, 0usize);
    // The depth-1 key being read, and the first `response` / `message` object's id.
    let mut key: Option<&[u8]> = None;
    let mut parent: Option<&[u8]> = None;
    let mut nested = None;
    while let Some(&b) = object.get(i) {
        match b {
            b'"' => {
                let (raw, end) = string(object, i)?;
                let after = skip_ws(object, end);
                let is_key = object.get(after) == Some(&b':');
                if is_key {
                    key = Some(raw);
                    i = after + 1;
                    continue;
                }
                // A string value: of `id` at depth 1, or inside `response` / `message`.
                match (depth, key) {
                    (1, Some(b"id")) => return decoded(raw),
                    (2, Some(b"id")) if nested.is_none() && parent.is_some() => {
                        nested = decoded(raw);
                    }
                    _ => {}
                }
                i = end;
                continue;
            }
            b'{' | b'[' => {
                // An object opened as a member of the answer: is it `response` / `message`?
                if depth == 1 {
                    parent = key
                        .filter(|k| matches!(*k, b"response" | b"message"))
                        .filter(|_| b == b'{');
                }
                depth += 1;
                key = None;
            }
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    break;
                }
                if depth == 1 {
                    parent = None;
                }
                key = None;
            }
            _ => {}
        }
        i += 1;
    }
    nested
}

/// The raw bytes of the string opening at `at` (its quotes left out) and the index past it.
fn string(s: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let mut escaped = false;
    for (j, &b) in s.iter().enumerate().skip(at + 1) {
        match b {
            _ if escaped => escaped = false,
            b'\\' => escaped = true,
            b'"' => return Some((s.get(at + 1..j)?, j + 1)),
            _ => {}
        }
    }
    None
}

fn skip_ws(s: &[u8], mut i: usize) -> usize {
    while s.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
        i += 1;
    }
    i
}

/// A JSON string's contents as text: ids are plain ASCII, so escapes are rare and decoded by
/// serde when present.
fn decoded(raw: &[u8]) -> Option<String> {
    if raw.is_empty() || raw.len() > MAX_RESPONSE_ID_BYTES {
        return None;
    }
    let text = if raw.contains(&b'\\') {
        let mut quoted = Vec::with_capacity(raw.len() + 2);
        quoted.push(b'"');
        quoted.extend_from_slice(raw);
        quoted.push(b'"');
        serde_json::from_slice::<String>(&quoted).ok()?
    } else {
        String::from_utf8(raw.to_vec()).ok()?
    };
    (!text.is_empty() && text.len() <= MAX_RESPONSE_ID_BYTES).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_answer_names_itself_at_the_top() {
        let body = br#"{"id":"resp_abc","object":"response","output":[{"id":"msg_1"}]}"#;
        assert_eq!(answer_id(body).as_deref(), Some("resp_abc"));
        // The top-level id wins wherever it sits; nested ids are not the answer's.
        let body = br#"{"object":"response","output":[{"id":"msg_1","content":[]}],"id":"resp_2"}"#;
        assert_eq!(answer_id(body).as_deref(), Some("resp_2"));
        let body = br#"{"output":[{"id":"msg_1"}],"usage":{"id":"x"}}"#;
        assert_eq!(answer_id(body), None);
    }

    #[test]
    fn a_stream_names_itself_in_its_first_event() {
        let sse = b"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_9\",\"object\":\"response\",\"output\":[]}}\n\nevent: response.in_progress\ndata: {\"response\":{\"id\":\"resp_other\"}}\n\n";
        assert_eq!(answer_id(sse).as_deref(), Some("resp_9"));
        let chat = b"data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"delta\":{}}]}\n\n";
        assert_eq!(answer_id(chat).as_deref(), Some("chatcmpl-1"));
        let anthropic = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_7\",\"usage\":{}}}\n\n";
        assert_eq!(answer_id(anthropic).as_deref(), Some("msg_7"));
        // Another member's object does not name the answer.
        let other = b"data: {\"item\":{\"id\":\"msg_1\"}}\n\n";
        assert_eq!(answer_id(other), None);
    }

    #[test]
    fn strings_are_read_as_json_reads_them() {
        let body = br#"{"note":"a \"quoted\" {brace} id:","id":"resp_\u0041"}"#;
        assert_eq!(answer_id(body).as_deref(), Some("resp_A"));
        let body = br#"{"text":"}\\","id":"r"}"#;
        assert_eq!(answer_id(body).as_deref(), Some("r"));
    }

    #[test]
    fn no_id_a_cut_head_or_garbage_names_nothing() {
        assert_eq!(answer_id(b""), None);
        assert_eq!(answer_id(b"no json here"), None);
        assert_eq!(answer_id(br#"{"object":"response","output":[{"#), None);
        assert_eq!(answer_id(br#"{"id":"resp_cut"#), None);
        assert_eq!(answer_id(br#"{"id":7}"#), None);
        assert_eq!(answer_id(br#"{"id":""}"#), None);
        let long = format!(r#"{{"id":"{}"}}"#, "r".repeat(MAX_RESPONSE_ID_BYTES + 1));
        assert_eq!(answer_id(long.as_bytes()), None);
        assert_eq!(answer_id(br#"}}}{"id":"ok"}"#), Some("ok".into()));
        assert_eq!(answer_id(br#"{"id":"\ud800"}"#), None);
    }
}
