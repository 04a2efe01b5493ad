//! A scriptable host for native tests: records what the plugin did, answers what the test
//! set up. Mirrors the Higress host rules the plugin depends on (token sequence 7, 11, ...;
//! buffer 9 only during a callback).
//! Over 400 lines: the state and one `Host` impl answering every host call the trait names,
//! call by call; splitting it would split that one impl.

use super::{pairs, Host, HostError, HostErrorKind, HostResult, LogLevel, MetricType};
use std::cell::RefCell;
use std::collections::HashMap;

/// Shared data: key → (value, CAS).
pub type SharedData = std::rc::Rc<RefCell<HashMap<String, (Vec<u8>, u32)>>>;

#[derive(Default)]
pub struct MockHost {
    pub now_ms: u64,
    pub properties: HashMap<String, Vec<u8>>,
    pub request_headers: Vec<(String, String)>,
    pub response_headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The current response body chunk (what a response-body callback reads and replaces).
    pub response_body: Vec<u8>,
    /// Request-body replacements made, in order.
    pub body_writes: u32,
    /// Makes every response-body read fail with this error.
    pub response_body_status: Option<HostErrorKind>,
    /// Pairs buffer `proxy_get_upstream_hosts` returns.
    pub hosts: Vec<u8>,
    pub hosts_status: Option<HostErrorKind>,
    pub override_host: Option<String>,
    pub override_status: Option<HostErrorKind>,
    pub redis_inits: Vec<(String, String, u32)>,
    pub redis_init_status: Option<HostErrorKind>,
    /// (cluster, query) of every dispatched call, in order.
    pub redis_calls: Vec<(String, Vec<u8>)>,
    pub redis_call_status: Option<HostErrorKind>,
    pub next_token: u32,
    /// The reply readable through buffer 9 (the test sets it while delivering a callback).
    pub reply: Option<Vec<u8>>,
    pub resumed: u32,
    /// Responses resumed (held at their last body chunk).
    pub responses_resumed: u32,
    pub local_responses: Vec<(u32, String)>,
    /// The extra headers of each local response, in order.
    pub local_response_headers: Vec<Vec<(String, String)>>,
    pub effective_context: Option<u32>,
    pub live_contexts: Vec<u32>,
    pub metrics: Vec<(String, i64)>,
    pub logs: RefCell<Vec<(LogLevel, String)>>,
    /// Shared data: key → (value, cas). Shared between "VMs" by cloning the Rc.
    pub shared: SharedData,
    /// Makes every shared-data write fail with this error.
    pub shared_set_status: Option<HostErrorKind>,
    /// Another worker's write (key, value, as a host applies it with CAS 0) that lands right
    /// after this VM's next shared-data read: a race between two workers.
    pub interleave: RefCell<Option<(String, Vec<u8>)>>,
    /// Makes every request-header write fail with this error.
    pub set_header_status: Option<HostErrorKind>,
    /// Request-header writes attempted (failed ones included).
    pub header_writes: u32,
    /// Request headers read, by name, in order.
    pub header_reads: RefCell<Vec<String>>,
    /// Properties read, by dotted path, in order.
    pub property_reads: RefCell<Vec<String>>,
    /// `remove_request_header` calls (a replace removes the old copies without one).
    pub header_removes: usize,
    pub tick_ms: Option<u32>,
    /// (cluster, headers) of every HTTP callout, in order.
    pub http_calls: Vec<(String, Vec<(String, String)>)>,
    /// The effective context each callout was made on (None: the root's own).
    pub http_call_contexts: Vec<Option<u32>>,
    pub http_call_fails: bool,
    /// The callout response readable during `on_http_call_response`.
    pub http_response: Option<(Option<u16>, Vec<u8>)>,
}

impl MockHost {
    pub fn new() -> Self {
        MockHost {
            next_token: 7,
            now_ms: 1_700_000_000_000,
            ..Default::default()
        }
    }

    pub fn with_route(mut self, route: &str, cluster: &str) -> Self {
        self.properties
            .insert("route_name".into(), route.as_bytes().to_vec());
        self.properties
            .insert("cluster_name".into(), cluster.as_bytes().to_vec());
        self
    }

    pub fn with_hosts(mut self, hosts: &[(&str, &str)]) -> Self {
        let list: Vec<(&str, String)> = hosts
            .iter()
            .map(|(a, h)| (*a, format!(r#"{{"health_status":"{h}","metrics":""}}"#)))
            .collect();
        let refs: Vec<(&str, &str)> = list.iter().map(|(a, j)| (*a, j.as_str())).collect();
        self.hosts = pairs::encode(&refs);
        self
    }

    pub fn metric(&self, name: &str) -> i64 {
        self.metrics
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, v)| *v)
    }

    pub fn last_query_args(&self) -> Vec<String> {
        self.query_args(self.redis_calls.len().saturating_sub(1))
    }

    /// The words of Redis call `i` (in the order sent).
    pub fn query_args(&self, i: usize) -> Vec<String> {
        let (_, q) = self.redis_calls.get(i).expect("no such redis call");
        match crate::redis::resp::decode_exact(q).expect("query is RESP") {
            crate::redis::resp::Value::Array(Some(items)) => items
                .iter()
                .map(|v| v.as_str().expect("bulk string").to_string())
                .collect(),
            other => panic!("query is not an array: {other:?}"),
        }
    }

    fn err(call: &'static str, status: Option<HostErrorKind>) -> HostResult<()> {
        if let Some(kind) = status {
            Err(HostError { call, kind })
        } else {
            Ok(())
        }
    }
}

impl Host for MockHost {
    fn log(&self, level: LogLevel, message: &str) {
        self.logs.borrow_mut().push((level, message.to_string()));
    }

    fn now_ms(&self) -> u64 {
        self.now_ms
    }

    fn property(&self, path: &[&str]) -> HostResult<Option<Vec<u8>>> {
        let path = path.join(".");
        let value = self.properties.get(&path).cloned();
        self.property_reads.borrow_mut().push(path);
        Ok(value)
    }

    fn request_header(&self, name: &str) -> HostResult<Option<String>> {
        self.header_reads.borrow_mut().push(name.to_string());
        Ok(self
            .request_headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone()))
    }

    fn request_header_map(&self) -> HostResult<Vec<u8>> {
        self.header_reads.borrow_mut().push("*".to_string());
        let pairs: Vec<(&str, &str)> = self
            .request_headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        Ok(super::pairs::encode(&pairs))
    }

    fn remove_request_header(&mut self, name: &str) -> HostResult<()> {
        self.header_removes += 1;
        self.request_headers.retain(|(k, _)| k != name);
        Ok(())
    }

    fn set_request_header(&mut self, name: &str, value: &str) -> HostResult<()> {
        self.header_writes += 1;
        if let Some(kind) = self.set_header_status {
            return Err(HostError {
                call: "replace_header",
                kind,
            });
        }
        self.request_headers.retain(|(k, _)| k != name);
        self.request_headers.push((name.into(), value.into()));
        Ok(())
    }

    fn response_status(&self) -> HostResult<Option<Vec<u8>>> {
        Ok(self
            .response_headers
            .iter()
            .find(|(k, _)| k == ":status")
            .map(|(_, v)| v.clone().into_bytes()))
    }

    fn response_header_bytes(&self, name: &str) -> HostResult<Option<Vec<u8>>> {
        Ok(self
            .response_headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone().into_bytes()))
    }

    fn add_response_header(&mut self, name: &str, value: &str) -> HostResult<()> {
        self.response_headers.push((name.into(), value.into()));
        Ok(())
    }

    fn request_body(&self, start: usize, len: usize) -> HostResult<Vec<u8>> {
        Ok(self.body.iter().skip(start).take(len).copied().collect())
    }

    fn set_request_body(&mut self, body: &[u8]) -> HostResult<()> {
        self.body = body.to_vec();
        self.body_writes += 1;
        Ok(())
    }

    fn response_body(&self, start: usize, len: usize) -> HostResult<Vec<u8>> {
        if let Some(kind) = self.response_body_status {
            return Err(HostError::new("response_body", kind));
        }
        Ok(self
            .response_body
            .iter()
            .skip(start)
            .take(len)
            .copied()
            .collect())
    }

    fn set_response_body(&mut self, body: &[u8]) -> HostResult<()> {
        self.response_body = body.to_vec();
        Ok(())
    }

    fn resume_request(&mut self) -> HostResult<()> {
        self.resumed += 1;
        Ok(())
    }

    fn resume_response(&mut self) -> HostResult<()> {
        self.responses_resumed += 1;
        Ok(())
    }

    fn send_local_response(
        &mut self,
        status: u32,
        details: &str,
        _body: &[u8],
        headers: &[(&str, &str)],
    ) -> HostResult<()> {
        self.local_responses.push((status, details.to_string()));
        self.local_response_headers.push(
            headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        Ok(())
    }

    fn set_effective_context(&mut self, context_id: u32) -> HostResult<()> {
        if self.live_contexts.contains(&context_id) {
            self.effective_context = Some(context_id);
            Ok(())
        } else {
            Err(HostError {
                call: "set_effective_context",
                kind: HostErrorKind::BadArgument,
            })
        }
    }

    fn define_metric(&mut self, _kind: MetricType, name: &str) -> HostResult<u32> {
        // As in Envoy, defining a name again reaches the same counter.
        if let Some(i) = self.metrics.iter().position(|(n, _)| n == name) {
            return Ok(i as u32);
        }
        self.metrics.push((name.to_string(), 0));
        Ok(self.metrics.len() as u32 - 1)
    }

    fn increment_metric(&mut self, id: u32, delta: i64) -> HostResult<()> {
        let m = self.metrics.get_mut(id as usize).ok_or(HostError {
            call: "increment_metric",
            kind: HostErrorKind::BadArgument,
        })?;
        m.1 += delta;
        Ok(())
    }

    fn shared_get(&self, key: &str) -> HostResult<Option<(Vec<u8>, u32)>> {
        let value = self.shared.borrow().get(key).cloned();
        if let Some((k, v)) = self.interleave.borrow_mut().take() {
            let mut m = self.shared.borrow_mut();
            let cas = m.get(&k).map_or(1, |e| e.1 + 1);
            m.insert(k, (v, cas));
        }
        Ok(value)
    }

    fn shared_set(&mut self, key: &str, value: &[u8], cas: u32) -> HostResult<()> {
        if let Some(kind) = self.shared_set_status {
            return Err(HostError {
                call: "set_shared_data",
                kind,
            });
        }
        let mut m = self.shared.borrow_mut();
        match m.get_mut(key) {
            Some(e) if cas != 0 && cas != e.1 => Err(HostError {
                call: "set_shared_data",
                kind: HostErrorKind::CasMismatch,
            }),
            Some(e) => {
                e.0 = value.to_vec();
                e.1 += 1;
                Ok(())
            }
            None => {
                m.insert(key.to_string(), (value.to_vec(), 1));
                Ok(())
            }
        }
    }

    fn set_tick_period(&mut self, ms: u32) -> HostResult<()> {
        self.tick_ms = Some(ms);
        Ok(())
    }

    fn http_call(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        _timeout_ms: u32,
    ) -> HostResult<u32> {
        if self.http_call_fails {
            return Err(HostError {
                call: "http_call",
                kind: HostErrorKind::BadArgument,
            });
        }
        self.http_call_contexts.push(self.effective_context);
        self.http_calls.push((
            cluster.into(),
            headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ));
        let token = self.next_token;
        self.next_token += 4;
        Ok(token)
    }

    fn http_call_status(&self) -> HostResult<Option<u16>> {
        Ok(self.http_response.as_ref().and_then(|r| r.0))
    }

    fn http_call_body(&self, size: usize) -> HostResult<Vec<u8>> {
        Ok(self
            .http_response
            .as_ref()
            .map(|r| r.1.iter().take(size).copied().collect())
            .unwrap_or_default())
    }

    fn upstream_hosts(&self) -> HostResult<Vec<u8>> {
        Self::err("get_upstream_hosts", self.hosts_status)?;
        Ok(self.hosts.clone())
    }

    fn set_upstream_override_host(&mut self, address: &str) -> HostResult<()> {
        Self::err("set_upstream_override_host", self.override_status)?;
        self.override_host = Some(address.to_string());
        Ok(())
    }

    fn redis_init(
        &mut self,
        cluster: &str,
        user: &str,
        _password: &str,
        timeout_ms: u32,
    ) -> HostResult<()> {
        Self::err("redis_init", self.redis_init_status)?;
        self.redis_inits
            .push((cluster.into(), user.into(), timeout_ms));
        Ok(())
    }

    fn redis_call(&mut self, cluster: &str, query: &[u8]) -> HostResult<u32> {
        Self::err("redis_call", self.redis_call_status)?;
        self.redis_calls.push((cluster.into(), query.to_vec()));
        let token = self.next_token;
        self.next_token += 4;
        Ok(token)
    }

    fn redis_reply(&self, size: usize) -> HostResult<Vec<u8>> {
        let reply = self.reply.as_ref().ok_or(HostError {
            call: "get_redis_reply",
            kind: HostErrorKind::NotFound,
        })?;
        Ok(reply.iter().take(size).copied().collect())
    }
}
