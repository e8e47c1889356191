//! cargo-fuzz target: the bytes as a target's PDU stream to an NVMe/TCP host queue with four commands in flight.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pollux_nvmf::fuzz_tcp_host::fuzz_tcp_host(data));
