//! Redis client behind `proxy_redis_call`, modelled on Envoy's Redis async client:
//! one pipelined connection per (worker, cluster), opened lazily, AUTH/SELECT pipelined
//! first with their replies swallowed, request bytes sent verbatim, replies matched in order,
//! writes coalesced (flush at `max_buffer_size_before_flush` bytes or after
//! `buffer_flush_timeout` ms), and an op timeout that fails every pending request and closes
//! the connection.

use crate::stream_data::RedisInit;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};

/// Called with (token, Some(raw reply)) or (token, None) on failure.
pub type Deliver = Rc<dyn Fn(u32, Option<Vec<u8>>)>;
pub type RedisTx = mpsc::UnboundedSender<(u32, Vec<u8>)>;

/// The bytes are not RESP2.
#[derive(Debug, PartialEq, Eq)]
pub struct ProtocolError;

/// Length of the first complete RESP2 frame; `Ok(None)` if incomplete, `Err` if the bytes
/// are not RESP2 (Envoy then fails the whole connection).
pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, ProtocolError> {
    frame_at(buf, 0)
}

fn line_end(buf: &[u8], from: usize) -> Option<usize> {
    buf.get(from..)?
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|p| from + p)
}

fn frame_at(buf: &[u8], at: usize) -> Result<Option<usize>, ProtocolError> {
    let Some(&kind) = buf.get(at) else {
        return Ok(None);
    };
    let Some(end) = line_end(buf, at + 1) else {
        return Ok(None);
    };
    let line = &buf[at + 1..end];
    let after = end + 2;
    let num = || -> Result<i64, ProtocolError> {
        std::str::from_utf8(line)
            .map_err(|_| ProtocolError)?
            .parse::<i64>()
            .map_err(|_| ProtocolError)
    };
    match kind {
        b'+' | b'-' | b':' => Ok(Some(after - at)),
        b'$' => {
            let n = num()?;
            if n < 0 {
                return Ok(Some(after - at));
            }
            let total = after + n as usize + 2;
            if buf.len() < total {
                return Ok(None);
            }
            if &buf[total - 2..total] != b"\r\n" {
                return Err(ProtocolError);
            }
            Ok(Some(total - at))
        }
        b'*' => {
            let n = num()?;
            let mut pos = after;
            for _ in 0..n.max(0) {
                match frame_at(buf, pos)? {
                    Some(l) => pos += l,
                    None => return Ok(None),
                }
            }
            Ok(Some(pos - at))
        }
        _ => Err(ProtocolError),
    }
}

fn resp_command(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Start a connection task; requests go through the returned sender. When the connection
/// dies the receiver is closed, so a failed `send` tells the caller to open a new one.
pub fn spawn_connection(
    addr: String,
    connect_timeout: Duration,
    init: RedisInit,
    deliver: Deliver,
) -> RedisTx {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::task::spawn_local(run(addr, connect_timeout, init, rx, deliver));
    tx
}

async fn run(
    addr: String,
    connect_timeout: Duration,
    init: RedisInit,
    mut rx: mpsc::UnboundedReceiver<(u32, Vec<u8>)>,
    deliver: Deliver,
) {
    let mut pending: VecDeque<Option<u32>> = VecDeque::new();
    // With span instruments (`AILB_PROF` in the bench): when each pending request was queued,
    // for `prof.redis.round_trip`.
    let mut sent_at: VecDeque<Instant> = VecDeque::new();
    let conn = tokio::time::timeout(connect_timeout, TcpStream::connect(&addr)).await;
    let mut sock = match conn {
        Ok(Ok(s)) => s,
        _ => return fail_all(&mut rx, &mut pending, &deliver),
    };
    let _ = sock.set_nodelay(true);
    let (mut rd, mut wr) = sock.split();
    let mut wbuf: Vec<u8> = Vec::new();
    if !init.username.is_empty() {
        wbuf.extend(resp_command(&["AUTH", &init.username, &init.password]));
        pending.push_back(None);
    } else if !init.password.is_empty() {
        wbuf.extend(resp_command(&["AUTH", &init.password]));
        pending.push_back(None);
    }
    if let Some(db) = init.db {
        wbuf.extend(resp_command(&["SELECT", &db.to_string()]));
        pending.push_back(None);
    }
    let op_timeout = Duration::from_millis(init.timeout_ms);
    let flush_timeout = Duration::from_millis(init.flush_timeout_ms);
    let mut flush_at: Option<Instant> = None;
    let mut op_deadline: Option<Instant> = None;
    let mut rbuf: Vec<u8> = Vec::with_capacity(4096);
    let far = || Instant::now() + Duration::from_secs(86400);
    loop {
        tokio::select! {
            biased;
            n = rd.read_buf(&mut rbuf) => {
                if !matches!(n, Ok(k) if k > 0) {
                    return fail_all(&mut rx, &mut pending, &deliver);
                }
                loop {
                    match frame_len(&rbuf) {
                        Ok(Some(len)) => {
                            let reply: Vec<u8> = rbuf.drain(..len).collect();
                            if let (true, Some(at)) = (crate::instrument::timing(), sent_at.pop_front()) {
                                crate::instrument::record("redis.round_trip", at.elapsed().as_nanos() as u64);
                            }
                            match pending.pop_front() {
                                Some(Some(token)) => deliver(token, Some(reply)),
                                Some(None) => {}
                                None => return fail_all(&mut rx, &mut pending, &deliver),
                            }
                            // Envoy re-arms the op timer on every reply while requests remain.
                            op_deadline = if pending.is_empty() { None } else { Some(Instant::now() + op_timeout) };
                        }
                        Ok(None) => break,
                        Err(ProtocolError) => return fail_all(&mut rx, &mut pending, &deliver),
                    }
                }
            }
            msg = rx.recv() => {
                let Some((token, query)) = msg else { return };
                wbuf.extend_from_slice(&query);
                if crate::instrument::timing() {
                    // AUTH / SELECT replies come first: their entries are the init's.
                    while sent_at.len() < pending.len() {
                        sent_at.push_back(Instant::now());
                    }
                    sent_at.push_back(Instant::now());
                }
                pending.push_back(Some(token));
                if op_deadline.is_none() {
                    op_deadline = Some(Instant::now() + op_timeout);
                }
                if wbuf.len() >= init.flush_size || init.flush_timeout_ms == 0 {
                    flush_at = None;
                    if wr.write_all(&wbuf).await.is_err() {
                        return fail_all(&mut rx, &mut pending, &deliver);
                    }
                    wbuf.clear();
                } else if flush_at.is_none() {
                    flush_at = Some(Instant::now() + flush_timeout);
                }
            }
            _ = sleep_until(flush_at.unwrap_or_else(far)), if flush_at.is_some() => {
                flush_at = None;
                if wr.write_all(&wbuf).await.is_err() {
                    return fail_all(&mut rx, &mut pending, &deliver);
                }
                wbuf.clear();
            }
            _ = sleep_until(op_deadline.unwrap_or_else(far)), if op_deadline.is_some() => {
                return fail_all(&mut rx, &mut pending, &deliver);
            }
        }
    }
}

/// Fail every pending and queued request with status 1 and close the receiver so the
/// worker opens a fresh connection for the next call.
fn fail_all(
    rx: &mut mpsc::UnboundedReceiver<(u32, Vec<u8>)>,
    pending: &mut VecDeque<Option<u32>>,
    deliver: &Deliver,
) {
    rx.close();
    let mut tokens: Vec<u32> = pending.drain(..).flatten().collect();
    while let Ok((t, _)) = rx.try_recv() {
        tokens.push(t);
    }
    for t in tokens {
        deliver(t, None);
    }
}

#[cfg(test)]
mod tests {
    use super::frame_len;

    #[test]
    fn resp_frames() {
        assert_eq!(frame_len(b"+OK\r\n"), Ok(Some(5)));
        assert_eq!(frame_len(b"+OK\r"), Ok(None));
        assert_eq!(frame_len(b"$3\r\nabc\r\n+x"), Ok(Some(9)));
        assert_eq!(frame_len(b"$-1\r\n"), Ok(Some(5)));
        assert_eq!(frame_len(b"*2\r\n:1\r\n$1\r\na\r\n"), Ok(Some(15)));
        assert_eq!(frame_len(b"*2\r\n:1\r\n"), Ok(None));
        assert_eq!(frame_len(b"*1\r\n*1\r\n:5\r\n"), Ok(Some(12)));
        assert_eq!(frame_len(b"*-1\r\n"), Ok(Some(5)));
        assert_eq!(frame_len(b"%1\r\n"), Err(super::ProtocolError));
    }
}
