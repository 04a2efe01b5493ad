//! The ACL user every node and the proxy know, and one-shot commands authenticated as it.

use ailb_core::redis::resp::{self, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The ACL user every node and the proxy know.
pub const USER: &str = "ailb-gw";
/// Its password: a value the tests grep the logs for.
pub const PASSWORD: &str = "pw-Zq7-cluster-secret";

/// An authenticated one-shot command on `port` (a node or the proxy): `AUTH` and the command
/// pipelined on a fresh connection; None when the port does not answer within 2 s.
pub fn auth_cmd<A: AsRef<[u8]>>(port: u16, user: &str, pass: &str, args: &[A]) -> Option<Value> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let _ = s.set_nodelay(true);
    let mut q = resp::encode_command(&["AUTH", user, pass]);
    q.extend(resp::encode_command(args));
    s.write_all(&q).ok()?;
    let mut buf = Vec::new();
    let mut replies = Vec::new();
    while replies.len() < 2 {
        match resp::decode(&buf) {
            Ok((v, used)) => {
                buf.drain(..used);
                replies.push(v);
            }
            Err(resp::RespError::Incomplete) => {
                let mut chunk = [0u8; 65536];
                let n = s.read(&mut chunk).ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            Err(_) => return None,
        }
    }
    replies.pop()
}
