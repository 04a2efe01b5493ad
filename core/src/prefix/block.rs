//! Block writer: field framing, NUL escaping and cutting item streams into blocks.

use super::json::{write_canonical, J};

/// Block kind bytes (first byte of every block).
pub const KIND_TOOLS: u8 = b'T';
pub const KIND_MESSAGE: u8 = b'M';
pub const KIND_PROMPT: u8 = b'P';
pub const KIND_CONTINUATION: u8 = b'+';

/// A request's top-level `stream_options` as the canonicaliser read it: the engine-verified
/// index asks a stream for its usage only when the client set none (verify/inject.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamOptions {
    /// Absent or `null`.
    Absent,
    /// An object with `"include_usage": true`.
    IncludeUsage,
    /// Anything else: the client's own.
    Own,
}

impl StreamOptions {
    pub(super) fn of(v: Option<&J>) -> StreamOptions {
        match v {
            None | Some(J::Null) => StreamOptions::Absent,
            Some(o) if matches!(o.get("include_usage"), Some(J::Bool(true))) => {
                StreamOptions::IncludeUsage
            }
            Some(_) => StreamOptions::Own,
        }
    }
}

pub(super) const FIELD_END: [u8; 2] = [0, 0];
pub(super) const ESCAPED_ZERO: [u8; 2] = [0, 0xff];

/// Appends `bytes` with each 0x00 written as `00 FF`.
pub(super) fn escape_into(dst: &mut Vec<u8>, bytes: &[u8]) {
    // Fast path: `contains` on bytes is memchr-accelerated; NULs in prompts are rare.
    if !bytes.contains(&0) {
        dst.extend_from_slice(bytes);
        return;
    }
    for (i, run) in bytes.split(|&b| b == 0).enumerate() {
        if i > 0 {
            dst.extend_from_slice(&ESCAPED_ZERO);
        }
        dst.extend_from_slice(run);
    }
}

/// Block writer: fields go to `scratch`; `end_block` cuts it into blocks in `buf`.
pub(super) struct Out {
    pub(super) buf: Vec<u8>,
    pub(super) ends: Vec<usize>,
    pub(super) scratch: Vec<u8>,
    pub(super) kind: u8,
    pub(super) chunk: usize,
    pub(super) max_blocks: usize,
    pub(super) capped: bool,
}

impl Out {
    pub(super) fn new(cfg: &CanonConfig) -> Self {
        Self {
            buf: Vec::new(),
            ends: Vec::new(),
            scratch: Vec::new(),
            kind: KIND_MESSAGE,
            chunk: cfg.chunk_bytes,
            max_blocks: cfg.max_blocks,
            capped: false,
        }
    }

    pub(super) fn full(&self) -> bool {
        self.ends.len() >= self.max_blocks
    }

    pub(super) fn begin(&mut self, kind: u8) {
        self.kind = kind;
        self.scratch.clear();
    }

    pub(super) fn field(&mut self, tag: u8, value: &[u8]) {
        self.scratch.push(tag);
        escape_into(&mut self.scratch, value);
        self.scratch.extend_from_slice(&FIELD_END);
    }

    /// Canonical JSON contains no 0x00, so it needs no escaping.
    pub(super) fn field_json(&mut self, tag: u8, value: &J, skip_top: &[&str]) {
        self.scratch.push(tag);
        write_canonical(&mut self.scratch, value, skip_top);
        self.scratch.extend_from_slice(&FIELD_END);
    }

    pub(super) fn end_block(&mut self) {
        let Out {
            buf,
            ends,
            scratch,
            kind,
            chunk,
            max_blocks,
            capped,
        } = self;
        let piece_len = if *chunk == 0 || scratch.len() <= *chunk {
            // One piece; `max(1)` because `chunks(0)` would panic (scratch is never empty).
            scratch.len().max(1)
        } else {
            *chunk
        };
        for (i, piece) in scratch.chunks(piece_len).enumerate() {
            if ends.len() >= *max_blocks {
                *capped = true;
                return;
            }
            buf.push(if i == 0 { *kind } else { KIND_CONTINUATION });
            buf.extend_from_slice(piece);
            ends.push(buf.len());
        }
    }
}

/// Canonicalisation limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonConfig {
    /// Cut block streams longer than this into pieces of this many bytes; 0 = never cut.
    pub chunk_bytes: usize,
    /// Keep at most this many blocks (the first ones); more sets [`Canonical::capped`].
    pub max_blocks: usize,
    /// Reject bodies longer than this; 0 = no limit.
    pub max_body_bytes: usize,
}

impl Default for CanonConfig {
    fn default() -> Self {
        Self {
            chunk_bytes: 4096,
            max_blocks: 256,
            max_body_bytes: 8 * 1024 * 1024,
        }
    }
}

/// A user message holding `text` (Completions prompts, Responses string input).
pub(super) fn user_text(out: &mut Out, text: &str) {
    out.begin(KIND_MESSAGE);
    out.field(b'r', b"user");
    out.field(b't', text.as_bytes());
    out.end_block();
}
