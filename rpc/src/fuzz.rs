//! The request parser under a fuzzer (`fuzz/fuzz_targets/rpc_request.rs`).
//!
//! [`request_stream`] feeds bytes to a connection's [`FrameBuffer`] in
//! chunks of the size the first byte gives (so a value is split across
//! reads at every place), checks each value as a request, decodes its
//! parameters as every bdev method's, and dispatches it to a service with
//! the framework's methods (which need no cores and create nothing).
//! Whatever the bytes, this must not panic, loop or grow without bound.

use std::sync::OnceLock;

use serde_json::Value;

use crate::bdev::params::{AioCreate, Delete, GetBdevs, GetIostat, MallocCreate, NullCreate};
use crate::cores::CoreBus;
use crate::framing::FrameBuffer;
use crate::protocol::Request;
use crate::service::{decode, RpcService};

/// The largest request while fuzzing.
const LIMIT: usize = 64 << 10;

fn service() -> &'static RpcService {
    static SVC: OnceLock<RpcService> = OnceLock::new();
    SVC.get_or_init(|| RpcService::new(CoreBus::none()))
}

fn decode_all(params: Option<&Value>) {
    let p = || params.cloned();
    let _ = decode::<MallocCreate>(p());
    let _ = decode::<NullCreate>(p());
    let _ = decode::<AioCreate>(p());
    let _ = decode::<Delete>(p());
    let _ = decode::<GetBdevs>(p());
    let _ = decode::<GetIostat>(p());
}

/// Runs one fuzz input (see the module docs).
pub fn request_stream(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let step = usize::from(first).max(1);
    let mut frames = FrameBuffer::new(LIMIT);
    for chunk in rest.chunks(step) {
        frames.push(chunk);
        while let Some(v) = frames.next_value() {
            let Ok(v) = v else {
                return;
            };
            let items = match &v {
                Value::Array(a) => a.clone(),
                other => vec![other.clone()],
            };
            for item in items {
                if let Ok(req) = Request::from_value(item) {
                    decode_all(req.params.as_ref());
                }
            }
            let duplicate = frames.take_duplicate();
            if let Some(answer) = service().handle_checked(v, duplicate.as_ref()) {
                assert!(serde_json::from_str::<Value>(&answer).is_ok(), "{answer}");
            }
        }
        if !frames.wants_more() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    /// The checked-in seeds run as a plain test too.
    #[test]
    fn seeds_run() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/seeds/rpc_request");
        let mut n = 0;
        for e in std::fs::read_dir(dir).expect("seed dir") {
            let data = std::fs::read(e.expect("entry").path()).expect("seed");
            super::request_stream(&data);
            n += 1;
        }
        assert!(n >= 5, "{n} seeds");
    }
}
