//! A minimal blocking RESP client on the plugin's own codec: one connection for pipelines and
//! raw replies, and one-shot commands that report an unreachable server as None.

use ailb_core::redis::resp::{self, Value};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Read timeout of a [`Conn`]: long enough for the benchmarks' big pipelines.
const CONN_TIMEOUT: Duration = Duration::from_secs(30);
/// Read timeout of a one-shot [`try_cmd`]: short, so a watcher polling a stalled or restarting
/// server moves on.
const ONE_SHOT_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    pub fn try_connect(port: u16) -> io::Result<Conn> {
        Self::connect_timeout(port, CONN_TIMEOUT)
    }

    fn connect_timeout(port: u16, read_timeout: Duration) -> io::Result<Conn> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(read_timeout))?;
        Ok(Conn {
            stream,
            buf: Vec::new(),
        })
    }

    pub fn cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Value {
        self.cmd_raw(&resp::encode_command(args))
    }

    /// Sends an already-encoded command and reads its reply.
    pub fn cmd_raw(&mut self, query: &[u8]) -> Value {
        self.send_raw(query);
        self.read()
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write to redis");
    }

    /// Sends every query, then reads every reply (one write, one round trip).
    pub fn pipeline(&mut self, queries: &[Vec<u8>]) -> Vec<Value> {
        self.send_raw(&queries.concat());
        (0..queries.len()).map(|_| self.read()).collect()
    }

    pub fn read(&mut self) -> Value {
        self.try_read()
            .unwrap_or_else(|e| panic!("reading a redis reply: {e}"))
    }

    /// The next reply; an error if the connection fails or closes, or the reply is not RESP.
    pub fn try_read(&mut self) -> io::Result<Value> {
        loop {
            match resp::decode(&self.buf) {
                Ok((v, used)) => {
                    self.buf.drain(..used);
                    return Ok(v);
                }
                Err(resp::RespError::Incomplete) => {
                    let mut chunk = [0u8; 65536];
                    let n = self.stream.read(&mut chunk)?;
                    if n == 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "redis closed the connection",
                        ));
                    }
                    self.buf.extend_from_slice(&chunk[..n]);
                }
                Err(e) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("bad reply: {e}"),
                    ))
                }
            }
        }
    }

    /// The raw bytes of one reply, as the host hands them to the plugin (buffer 9).
    pub fn raw_reply(&mut self, query: &[u8]) -> Vec<u8> {
        let v = self.cmd_raw(query);
        let mut out = Vec::new();
        encode_value(&v, &mut out);
        out
    }
}

/// One command on a fresh connection; None while the server is unreachable, stalled past the
/// timeout, or replying garbage.
pub fn try_cmd<A: AsRef<[u8]>>(port: u16, args: &[A]) -> Option<Value> {
    let mut c = Conn::connect_timeout(port, ONE_SHOT_TIMEOUT).ok()?;
    c.stream.write_all(&resp::encode_command(args)).ok()?;
    c.try_read().ok()
}

/// Serialises a reply back to RESP (the decoder keeps no raw bytes).
pub fn encode_value(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Simple(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
        Value::Error(s) => out.extend_from_slice(format!("-{s}\r\n").as_bytes()),
        Value::Integer(i) => out.extend_from_slice(format!(":{i}\r\n").as_bytes()),
        Value::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
        Value::Bulk(Some(b)) => {
            out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
            out.extend_from_slice(b);
            out.extend_from_slice(b"\r\n");
        }
        Value::Array(None) => out.extend_from_slice(b"*-1\r\n"),
        Value::Array(Some(items)) => {
            out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
            for i in items {
                encode_value(i, out);
            }
        }
    }
}

/// `(calls, usec)` of one command from INFO commandstats ((0, 0) if it never ran).
pub fn command_stats(c: &mut Conn, command: &str) -> (u64, u64) {
    let info = c.cmd(&["INFO", "commandstats"]);
    let text = info.as_str().unwrap_or_default().to_string();
    let prefix = format!("cmdstat_{command}:");
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix(&prefix) {
            let field = |k: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(k))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            return (field("calls="), field("usec="));
        }
    }
    (0, 0)
}
