//! The launcher's own guarantees, which the Lua-script and e2e tests rely on.

use ailb_core::redis::resp::Value;
use ailb_testkit::{Options, RedisServer};

fn ok() -> Value {
    Value::Simple("OK".into())
}

#[test]
fn restart_keeps_the_port_and_comes_back_empty() {
    let mut r = RedisServer::start();
    let port = r.port;
    assert_eq!(r.cmd(&["SET", "k", "v"]), ok());
    r.stop();
    assert_eq!(r.try_cmd(&["PING"]), None, "stopped means unreachable");
    r.restart();
    assert_eq!(r.port, port);
    assert_eq!(r.cmd(&["GET", "k"]), Value::Bulk(None));
}

#[test]
fn debug_is_enabled_only_on_request() {
    let plain = RedisServer::start();
    assert!(matches!(
        plain.cmd(&["DEBUG", "SLEEP", "0"]),
        Value::Error(_)
    ));
    let debug = RedisServer::start_with(Options {
        debug_command: true,
        ..Options::default()
    });
    assert_eq!(debug.cmd(&["DEBUG", "SLEEP", "0"]), ok());
}

#[test]
fn cluster_serves_every_slot_also_after_a_restart() {
    let mut r = RedisServer::start_cluster();
    // Keys in different slots: a cluster with slots missing would answer CLUSTERDOWN.
    for key in ["a", "b", "{x}c"] {
        assert_eq!(r.cmd(&["SET", key, "1"]), ok(), "{key}");
    }
    r.restart();
    assert_eq!(r.cmd(&["SET", "a", "1"]), ok());
    let mut c = r.conn();
    let piped = c.pipeline(&[
        ailb_core::redis::resp::encode_command(&["INCR", "n"]),
        ailb_core::redis::resp::encode_command(&["INCR", "n"]),
    ]);
    assert_eq!(piped, [Value::Integer(1), Value::Integer(2)]);
}

#[test]
fn a_dropped_server_is_gone() {
    let port = {
        let r = RedisServer::start();
        r.port
    };
    assert_eq!(ailb_testkit::try_cmd(port, &["PING"]), None);
}
