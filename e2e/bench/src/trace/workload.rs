//! What a replay sends: conversations of one or more turns, each starting at a trace time; the
//! request bodies (OpenAI Chat, streamed with `stream_options.include_usage` so the last chunk
//! carries `cached_tokens`) are built when sent.
//!
//! How the prompt is sent: a Mooncake row's prompt is one user message holding its blocks in
//! order (the trace's prompts are single long documents); the preamble variant adds one common
//! system message before it. A multi-turn conversation (code generation) sends its system
//! prompt as a system message and its history as user / assistant messages; the assistant
//! turns are the answers the fake pods give (`ailb_fakepod::openai::answer_text`, deterministic
//! in the prompt), so a turn's prompt runs through the previous answer as it would with a real
//! engine and client.

use super::text::Text;
use ailb_fakepod::openai::answer_text;
use serde_json::{json, Value};
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct Turn {
    pub user: Text,
    pub output_tokens: u64,
    /// Trace time before which it is not sent (a user's next question arriving on its own
    /// clock, as a load generator that cycles through user sessions sends it); None: at once.
    /// A turn never starts before the previous answer is complete.
    pub at: Option<Duration>,
}

#[derive(Clone, Debug)]
pub struct Conversation {
    /// First turn's arrival, trace time; later turns follow the previous answer, at once or
    /// at their own [`Turn::at`].
    pub start: Duration,
    pub system: Option<Text>,
    pub turns: Vec<Turn>,
    /// The load stage it belongs to (knee sweeps; 0 otherwise).
    pub stage: usize,
}

/// One offered-load stage of a sweep: its rate (conversations per second) and its span.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stage {
    pub rate: f64,
    pub start: Duration,
    pub end: Duration,
}

#[derive(Clone, Debug, Default)]
pub struct Workload {
    pub name: String,
    pub conversations: Vec<Conversation>,
    pub stages: Vec<Stage>,
}

impl Workload {
    pub fn requests(&self) -> usize {
        self.conversations.iter().map(|c| c.turns.len()).sum()
    }

    /// Trace time of the last first-turn arrival.
    pub fn span(&self) -> Duration {
        self.conversations
            .iter()
            .map(|c| c.start)
            .max()
            .unwrap_or_default()
    }
}

pub const MODEL: &str = "fake-model";

/// Builds a conversation's requests in order, keeping the history and the canonical prompt
/// text the pods see (`ailb_fakepod::tokenize::canonical_prompt`), from which each assistant
/// answer follows.
pub struct Dialogue<'a> {
    conv: &'a Conversation,
    messages: Vec<Value>,
    canonical: String,
    next: usize,
}

/// One request of a conversation.
pub struct Built {
    pub body: Vec<u8>,
    /// The prompt as the pods render it (role lines and contents).
    pub canonical: String,
    pub output_tokens: u64,
    /// The turn's own arrival ([`Turn::at`]).
    pub at: Option<Duration>,
}

impl<'a> Dialogue<'a> {
    pub fn new(conv: &'a Conversation) -> Self {
        let mut d = Dialogue {
            conv,
            messages: Vec::new(),
            canonical: String::new(),
            next: 0,
        };
        if let Some(system) = &conv.system {
            d.push("system", system.render());
        }
        d
    }

    fn push(&mut self, role: &str, content: String) {
        self.canonical.push_str(role);
        self.canonical.push('\n');
        self.canonical.push_str(&content);
        self.canonical.push('\n');
        self.messages
            .push(json!({"role": role, "content": content}));
    }

    /// The next turn's request; the history then holds the answer the pod will give.
    pub fn next_request(&mut self) -> Option<Built> {
        let turn = self.conv.turns.get(self.next)?;
        self.next += 1;
        self.push("user", turn.user.render());
        let body = json!({
            "model": MODEL,
            "messages": self.messages,
            "max_tokens": turn.output_tokens,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let built = Built {
            body: body.to_string().into_bytes(),
            canonical: self.canonical.clone(),
            output_tokens: turn.output_tokens,
            at: turn.at,
        };
        if self.next < self.conv.turns.len() {
            let answer = answer_text(&self.canonical, turn.output_tokens);
            self.push("assistant", answer);
        }
        Some(built)
    }
}

#[cfg(test)]
mod tests {
    use super::super::text::{ns, Text};
    use super::*;
    use ailb_fakepod::tokenize::{canonical_prompt, ApiKind};

    #[test]
    fn canonical_text_is_what_the_pods_render() {
        let conv = Conversation {
            start: Duration::ZERO,
            system: Some(Text::blocks(ns::PREAMBLE, 0, 40, 16)),
            turns: vec![
                Turn {
                    user: Text::blocks(ns::TRACE, 0, 20, 16),
                    output_tokens: 3,
                    at: None,
                },
                Turn {
                    user: Text::blocks(ns::TRACE, 5, 20, 16),
                    output_tokens: 2,
                    at: None,
                },
            ],
            stage: 0,
        };
        let mut d = Dialogue::new(&conv);
        let first = d.next_request().unwrap();
        let second = d.next_request().unwrap();
        assert!(d.next_request().is_none());
        for b in [&first, &second] {
            let v: Value = serde_json::from_slice(&b.body).unwrap();
            assert_eq!(canonical_prompt(ApiKind::Chat, &v).unwrap(), b.canonical);
        }
        // The second prompt runs through the first and the pod's answer to it.
        let answered = ailb_fakepod::openai::after_answer(
            ApiKind::Chat,
            &first.canonical,
            &answer_text(&first.canonical, 3),
        );
        assert!(second.canonical.starts_with(&answered));
    }
}
