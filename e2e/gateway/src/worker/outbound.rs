//! What a worker sends out after a VM call: Redis commands on its per-cluster connections,
//! the tick timer, and HTTP callouts whose answers go back into the VM.

use super::Worker;
use crate::redis::spawn_connection;
use crate::stream_data::{HttpCallResp, HttpOut, Pairs};
use crate::upstream::ChanBody;
use bytes::Bytes;
use http_body_util::BodyExt;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

impl Worker {
    pub(super) fn redis_send(&self, cluster: &str, token: u32, query: Vec<u8>) {
        let mut map = self.redis.borrow_mut();
        let mut msg = (token, query);
        if let Some(tx) = map.get(cluster) {
            match tx.send(msg) {
                Ok(()) => return,
                Err(e) => msg = e.0,
            }
        }
        let Some(rc) = self
            .shared
            .cfg
            .redis_clusters
            .iter()
            .find(|r| r.name == cluster)
        else {
            return;
        };
        let init = self
            .vm
            .as_ref()
            .and_then(|c| c.borrow().store.data().redis_init.get(cluster).cloned())
            .unwrap_or_default();
        let me = self.me.clone();
        let shared = self.shared.clone();
        let gen = self.vm_gen.get();
        let deliver = Rc::new(move |token: u32, reply: Option<Vec<u8>>| {
            if reply.is_none() {
                shared.counters.redis_failures.fetch_add(1, Relaxed);
            }
            if let Some(w) = me.upgrade().filter(|w| w.vm_gen.get() == gen) {
                w.with_vm(|vm| {
                    let _ = vm.on_redis_call_response(token, reply);
                });
            }
        });
        let timeout = Duration::from_millis(rc.connect_timeout_ms);
        let tx = spawn_connection(rc.address.clone(), timeout, init, deliver);
        let _ = tx.send(msg);
        map.insert(cluster.to_string(), tx);
    }

    pub(super) fn start_ticker(&self, ms: u32) {
        let gen = self.tick_gen.get() + 1;
        self.tick_gen.set(gen);
        if ms == 0 {
            return;
        }
        let me = self.me.clone();
        tokio::task::spawn_local(async move {
            let mut iv = tokio::time::interval(Duration::from_millis(ms as u64));
            iv.tick().await;
            loop {
                iv.tick().await;
                let Some(w) = me.upgrade() else { return };
                if w.tick_gen.get() != gen {
                    return;
                }
                w.with_vm(|vm| {
                    let _ = vm.on_tick();
                });
            }
        });
    }

    pub(super) fn spawn_http_call(&self, out: HttpOut) {
        let me = self.me.clone();
        let gen = self.vm_gen.get();
        tokio::task::spawn_local(async move {
            let Some(w) = me.upgrade() else { return };
            let resp = w.do_http_call(&out).await;
            if w.vm_gen.get() != gen {
                return;
            }
            w.with_vm(|vm| {
                let _ = vm.on_http_call_response(out.context_id, out.token, resp);
            });
        });
    }

    pub(super) async fn do_http_call(&self, out: &HttpOut) -> Option<HttpCallResp> {
        let cluster = self.upstreams.cluster(&out.cluster)?;
        let get = |k: &[u8]| {
            out.headers
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        };
        let ep =
            self.upstreams
                .pick(&cluster, None, get(b"x-envoy-original-dst-host").as_deref())?;
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
        let client = self.upstreams.client(&out.cluster)?.clone();
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
}
