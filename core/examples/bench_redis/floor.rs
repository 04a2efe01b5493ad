//! The floor beside the scripts: a trivial script (`return 1`) under the same load shape.

use super::{BATCH, CONNECTIONS, ROUNDS};
use ailb_testkit::{command_stats, Conn, RedisServer};

/// `return 1` under the same load shape.
pub fn measure_floor(redis: &RedisServer) -> f64 {
    let mut c = redis.conn();
    let sha = c
        .cmd(&["SCRIPT", "LOAD", "return 1"])
        .as_str()
        .unwrap()
        .to_string();
    let query = ailb_core::redis::resp::encode_command(&["EVALSHA", sha.as_str(), "0"]);
    c.cmd(&["CONFIG", "RESETSTAT"]);
    let workers: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let (port, q) = (redis.port, query.clone());
            std::thread::spawn(move || {
                let mut conn = Conn::try_connect(port).unwrap();
                let batch: Vec<Vec<u8>> = vec![q; BATCH];
                for _ in 0..ROUNDS * 2 {
                    conn.pipeline(&batch);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let (calls, usec) = command_stats(&mut c, "evalsha");
    usec as f64 / calls as f64
}
