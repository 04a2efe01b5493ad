//! An HTTP callout a worker sends for its VM: the request on one of the cluster's endpoints,
//! its whole answer (headers, body, trailers) or None on a failure or timeout.

use crate::stream_data::{HttpCallResp, HttpOut, Pairs};
use crate::upstream::{ChanBody, Upstreams};
use bytes::Bytes;
use http_body_util::BodyExt;
use std::time::Duration;

/// `out` sent on its cluster (the host's `proxy_http_call`), answered within its timeout.
pub(super) async fn http_call(upstreams: &Upstreams, out: &HttpOut) -> Option<HttpCallResp> {
    let cluster = upstreams.cluster(&out.cluster)?;
    let get = |k: &[u8]| {
        out.headers
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    };
    let ep = upstreams.pick(
        &cluster,
        None,
        get(b"x-envoy-original-dst-host").as_deref(),
        &[],
    )?;
    let mut b = hyper::Request::builder()
        .method(get(b":method").unwrap_or_else(|| "GET".into()).as_str())
        .uri(format!(
            "http://{}{}",
            ep.address,
            get(b":path").unwrap_or_else(|| "/".into())
        ))
        .header("host", get(b":authority").unwrap_or_default());
    for (k, v) in &out.headers {
        if !k.starts_with(b":") && !crate::upstream::is_hop_header(k) && k != b"host" {
            b = b.header(&k[..], &v[..]);
        }
    }
    let req = b.body(ChanBody::full(Bytes::from(out.body.clone()))).ok()?;
    let client = upstreams.client(&out.cluster)?.clone();
    let timeout = Duration::from_millis(out.timeout_ms.max(1));
    let fut = async move {
        let resp = client.request(req).await.ok()?;
        let (parts, body) = resp.into_parts();
        let collected = body.collect().await.ok()?;
        let trailers = collected.trailers().cloned();
        let mut headers: Pairs = vec![(
            b":status".to_vec(),
            parts.status.as_str().as_bytes().to_vec(),
        )];
        for (k, v) in parts.headers.iter() {
            headers.push((k.as_str().as_bytes().to_vec(), v.as_bytes().to_vec()));
        }
        let trailers = trailers
            .map(|t| {
                t.iter()
                    .map(|(k, v)| (k.as_str().as_bytes().to_vec(), v.as_bytes().to_vec()))
                    .collect()
            })
            .unwrap_or_default();
        Some(HttpCallResp {
            headers,
            body: collected.to_bytes().to_vec(),
            trailers,
        })
    };
    tokio::time::timeout(timeout, fut).await.ok().flatten()
}
