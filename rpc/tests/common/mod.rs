//! Helpers shared by the method tests: a call that must succeed, one that
//! must fail, a free TCP port.

#![allow(clippy::unwrap_used, dead_code)] // each test file uses a subset

use pollux_rpc::{RpcError, RpcService};
use serde_json::Value;

/// `method(params)` on `svc`, which must succeed.
pub fn ok(svc: &RpcService, method: &str, params: Value) -> Value {
    svc.call(method, Some(params))
        .unwrap_or_else(|e| panic!("{method}: {e}"))
}

/// `method(params)` on `svc`, which must fail.
pub fn refused(svc: &RpcService, method: &str, params: Value) -> RpcError {
    svc.call(method, Some(params))
        .expect_err(&format!("{method} should fail"))
}

/// A TCP port nobody listens on now (on 127.0.0.1), below the ephemeral
/// range.
pub fn free_port() -> u16 {
    pollux_reactor::free_tcp_port("127.0.0.1")
}
