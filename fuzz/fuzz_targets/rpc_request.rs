//! cargo-fuzz target: the JSON-RPC request stream (framing, request checks,
//! parameter decoding, dispatch), as a client's bytes reach the server.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pollux_rpc::fuzz::request_stream(data));
