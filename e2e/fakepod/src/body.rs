//! Response body types (a boxed body for all responses, a channel-fed body for streaming) and
//! the plain complete responses built from them.

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Body, Frame};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

/// Every response body of the fake pod.
pub type RespBody = BoxBody<Bytes, std::io::Error>;

/// A complete body from bytes.
pub fn full(b: impl Into<Bytes>) -> RespBody {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

/// A complete response with the given status and content type.
pub fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<RespBody> {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

pub fn json_resp(status: StatusCode, body: String) -> Response<RespBody> {
    respond(status, "application/json", body)
}

/// Body fed by a channel: each `Ok` item is one frame (one SSE event), an `Err` makes hyper
/// abort the connection mid-body (used by `reset-after-headers`), and closing the sender ends it.
pub struct ChannelBody {
    rx: mpsc::Receiver<Result<Bytes, std::io::Error>>,
}

impl ChannelBody {
    /// A body and the sender that feeds it.
    pub fn pair(capacity: usize) -> (mpsc::Sender<Result<Bytes, std::io::Error>>, RespBody) {
        let (tx, rx) = mpsc::channel(capacity);
        (tx, ChannelBody { rx }.boxed())
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.rx
            .poll_recv(cx)
            .map(|item| item.map(|r| r.map(Frame::data)))
    }
}
